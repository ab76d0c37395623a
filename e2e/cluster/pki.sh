#!/usr/bin/env bash
# One CA and every certificate/kubeconfig the cluster needs (openssl). Usage: pki.sh NODE_IP
source "$(dirname "$0")/lib.sh"
NODE_IP=$1
mkdir -p "$PKI" "$KCFG"
cd "$PKI" || exit 1
umask 077

openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=rlog-local-ca" \
  -keyout ca.key -out ca.crt 2>/dev/null
openssl genrsa -out sa.key 2048 2>/dev/null
openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null

# cert NAME SUBJECT USAGE [SAN]
cert() {
  local name=$1 subj=$2 usage=$3 san=${4:-}
  openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$name.key" -out "$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [[ -n $san ]] && echo "subjectAltName=$san"
  } > "$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$name.ext" -out "$name.crt" 2>/dev/null
  rm -f "$name.csr" "$name.ext"
}

cert apiserver "/CN=kube-apiserver" serverAuth \
  "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP,IP:$API_SVC_IP"
cert kubelet-serving "/CN=system:node:$NODE_NAME/O=system:nodes" serverAuth \
  "DNS:$NODE_NAME,DNS:localhost,IP:127.0.0.1,IP:$NODE_IP"
cert apiserver-kubelet-client "/CN=kube-apiserver/O=kube-apiserver" clientAuth
cert admin "/CN=rlog-admin/O=system:masters" clientAuth
cert controller-manager "/CN=system:kube-controller-manager" clientAuth
cert scheduler "/CN=system:kube-scheduler" clientAuth
cert node "/CN=system:node:$NODE_NAME/O=system:nodes" clientAuth
cert kube-proxy "/CN=system:kube-proxy" clientAuth

kubeconfig() { # NAME USER-CERT SERVER
  local name=$1 user=$2 server=${3:-https://127.0.0.1:6443}
  cat > "$KCFG/$name.kubeconfig" <<KC
apiVersion: v1
kind: Config
clusters:
- name: $CLUSTER_NAME
  cluster:
    certificate-authority-data: $(base64 -w0 ca.crt)
    server: $server
users:
- name: $CLUSTER_NAME-$name
  user:
    client-certificate-data: $(base64 -w0 "$user.crt")
    client-key-data: $(base64 -w0 "$user.key")
contexts:
- name: $CLUSTER_NAME
  context: {cluster: $CLUSTER_NAME, user: $CLUSTER_NAME-$name}
current-context: $CLUSTER_NAME
KC
}
kubeconfig admin admin
kubeconfig controller-manager controller-manager
kubeconfig scheduler scheduler
kubeconfig kubelet node
kubeconfig kube-proxy kube-proxy
chmod 600 "$KCFG"/*.kubeconfig
