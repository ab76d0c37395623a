#!/usr/bin/env bash
# Stand up a single-node Kubernetes on this machine (idempotent). See README.md here.
source "$(dirname "$0")/lib.sh"
T0=$SECONDS
step() { log "== $* (t=$((SECONDS - T0))s)"; }

[[ $(id -u) == 0 ]] || die "run as root"
on_exit() {
  local rc=$?
  ((rc == 0)) && return
  log "cluster-up FAILED (exit $rc) after $((SECONDS - T0))s; what runs is left for debugging:"
  for f in "$RUN"/*.pid; do
    [[ -e $f ]] || continue
    local n; n=$(basename "$f" .pid)
    kill -0 "$(cat "$f")" 2>/dev/null && continue
    log "  $n is not running; last lines of $RUN/$n.log:"; tail -15 "$RUN/$n.log" >&2
  done
  log "logs: $RUN/*.log; clean up with: make cluster-down"
}
trap on_exit EXIT

# ---------------------------------------------------------------- host packages
PKGS=(containerd runc containernetworking-plugins iptables ipset conntrack busybox-static debootstrap
      docker.io openssl curl iproute2 gcc libc6-dev)
ensure_packages "${PKGS[@]}"
command -v go >/dev/null || die "go is needed to build the cluster components"

start() { # NAME CMD... : start a process in its own session, remember its pid
  local name=$1; shift
  setsid "$@" > "$RUN/$name.log" 2>&1 < /dev/null &
  echo $! > "$RUN/$name.pid"
}
wait_for() { # SECONDS WHAT CMD...
  local n=$1 what=$2; shift 2
  for ((i = 0; i < n * 2; i++)); do "$@" >/dev/null 2>&1 && return 0; sleep 0.5; done
  die "timed out waiting for $what"
}
alive() { kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null || die "$1 exited: $(tail -5 "$RUN/$1.log")"; }
K=("$K8S_BIN/kubectl" --kubeconfig "$KCFG/admin.kubeconfig")
# The NetworkPolicy agent: kube-router, firewall only (manifests/kube-router.yaml), since the
# bridge plugin enforces no NetworkPolicy. `apply` is idempotent; its image is imported.
netpol_agent() {
  sed -e "s#@KUBE_ROUTER_IMAGE@#$KUBE_ROUTER_IMAGE#g" -e "s#@SERVICE_CIDR@#$SERVICE_CIDR#g" \
    "$HERE/manifests/kube-router.yaml" | "${K[@]}" apply -f - >/dev/null
}
netpol_agent_ready() { "${K[@]}" -n kube-system rollout status daemonset/kube-router --timeout=1s; }

# ---------------------------------------------------------------- already up?
if [[ -f $RUN/up.done ]] && "$HERE/status.sh" >/dev/null 2>&1; then
  if ! "$HERE/images.sh" stale; then
    # a cluster started before the agent was part of it gets it now, without a restart
    if [[ $RLOG_NETPOL_AGENT != 0 ]] && ! netpol_agent_ready >/dev/null 2>&1; then
      step "kube-router (NetworkPolicy agent) on the running cluster"
      "$HERE/images.sh" base && "$HERE/images.sh" import kube-router
      netpol_agent
      wait_for 120 "kube-router Ready" netpol_agent_ready
    fi
    log "cluster $CLUSTER_NAME is already up"; "$HERE/status.sh" --short; exit 0
  fi
  # Images are built by a dockerd that must not run beside the cluster: start over (~1 min).
  log "cluster $CLUSTER_NAME is up with old images: restarting it to rebuild them"
fi
# Anything left by an earlier (killed) run goes first.
"$HERE/down.sh" --quiet

# ---------------------------------------------------------------- builds (cached)
step "build components (cached under $CACHE)"
"$HERE/build-k8s.sh"
"$HERE/build-tools.sh"
step "images"
"$HERE/images.sh" build "${RLOG_IMAGES_STRICT:-0}"

# ---------------------------------------------------------------- host setup
step "host setup"
[[ -e /dev/kmsg ]] || die "/dev/kmsg missing (kubelet needs it)"
[[ -e /proc/sys/net/bridge/bridge-nf-call-iptables ]] || die "br_netfilter is not available"
sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 \
  net.bridge.bridge-nf-call-ip6tables=1 fs.inotify.max_user_instances=8192 \
  fs.inotify.max_user_watches=524288
mount --make-rshared /
NODE_IF=$(ip -4 route show default | awk '{print $5; exit}')
NODE_IP=$(ip -4 -o addr show dev "$NODE_IF" | awk '{split($4,a,"/"); print a[1]; exit}')
[[ -n $NODE_IP ]] || die "no node IP (no default route?)"
mkdir -p "$RUN" "$STATE" "$LPP_DIR" "$CNI_CONF_DIR" "$STATE/cni/ipam" "$(dirname "$CTRD_SOCK")"
echo "$NODE_IP" > "$STATE/node-ip"
ip addr add "$DNS_IP/32" dev lo 2>/dev/null || true
# Pods may talk to each other, to Services and to this machine, never off it. The guard sits
# in mangle/FORWARD, which nobody else uses, so no ACCEPT of the CNI firewall plugin or of
# kube-proxy in filter/FORWARD can come before it.
iptables -t mangle -N RLOG-EGRESS 2>/dev/null || iptables -t mangle -F RLOG-EGRESS
iptables -t mangle -A RLOG-EGRESS -s "$CLUSTER_CIDR" -o "$NODE_IF" -j DROP
iptables -t mangle -C FORWARD -j RLOG-EGRESS 2>/dev/null || iptables -t mangle -I FORWARD 1 -j RLOG-EGRESS
# The CNI firewall plugin creates these on first use; concurrent sandboxes race on that
# ("CHAIN_USER_ADD failed (File exists)"), so create them up front.
iptables -N CNI-FORWARD 2>/dev/null || true
iptables -N CNI-ADMIN 2>/dev/null || true
iptables -C CNI-FORWARD -j CNI-ADMIN 2>/dev/null || iptables -A CNI-FORWARD -j CNI-ADMIN
iptables -C FORWARD -j CNI-FORWARD 2>/dev/null || iptables -I FORWARD 1 -j CNI-FORWARD


# ---------------------------------------------------------------- pki
step "certificates"
"$HERE/pki.sh" "$NODE_IP"

# ---------------------------------------------------------------- etcd
step "etcd"
start etcd "$ETCD_BIN/etcd" --name rlog --data-dir "$STATE/etcd" \
  --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
  --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
  --initial-cluster rlog=http://127.0.0.1:2380 --unsafe-no-fsync --quota-backend-bytes 4294967296 \
  --log-level warn
wait_for 30 etcd curl -sf http://127.0.0.1:2379/health

# ---------------------------------------------------------------- control plane
step "kube-apiserver"
start kube-apiserver "$K8S_BIN/kube-apiserver" \
  --etcd-servers=http://127.0.0.1:2379 --secure-port=6443 --bind-address=0.0.0.0 \
  --advertise-address="$NODE_IP" --allow-privileged=true \
  --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
  --client-ca-file="$PKI/ca.crt" --service-cluster-ip-range="$SERVICE_CIDR" \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
  --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
  --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority="$PKI/ca.crt" \
  --kubelet-preferred-address-types=InternalIP,Hostname --profiling=false --v=1
wait_for 90 "kube-apiserver /readyz" "${K[@]}" get --raw /readyz
alive kube-apiserver
# The apiserver's kubelet client (logs, exec, port-forward) needs kubelet API rights.
"${K[@]}" create clusterrolebinding kube-apiserver-kubelet-api-admin \
  --clusterrole=system:kubelet-api-admin --user=kube-apiserver >/dev/null

step "kube-controller-manager, kube-scheduler"
start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
  --kubeconfig="$KCFG/controller-manager.kubeconfig" \
  --authentication-kubeconfig="$KCFG/controller-manager.kubeconfig" \
  --authorization-kubeconfig="$KCFG/controller-manager.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false --use-service-account-credentials=true \
  --root-ca-file="$PKI/ca.crt" --service-account-private-key-file="$PKI/sa.key" \
  --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
  --service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$CLUSTER_CIDR" \
  --allocate-node-cidrs=false --profiling=false --v=1
start kube-scheduler "$K8S_BIN/kube-scheduler" \
  --kubeconfig="$KCFG/scheduler.kubeconfig" \
  --authentication-kubeconfig="$KCFG/scheduler.kubeconfig" \
  --authorization-kubeconfig="$KCFG/scheduler.kubeconfig" \
  --bind-address=127.0.0.1 --leader-elect=false --profiling=false --v=1

# ---------------------------------------------------------------- containerd
step "containerd"
cat > "$STATE/containerd.toml" <<TOML
version = 2
root = "$CTRD_ROOT"
state = "$CTRD_STATE"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs"]
[grpc]
  address = "$CTRD_SOCK"
[ttrpc]
  address = "$CTRD_SOCK.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE/containerd-opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.10"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "/run/rlog-cluster/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$CNI_CONF_DIR"
TOML
# CNI config must be in place before kubelet/containerd create sandboxes.
cat > "$CNI_CONF_DIR/10-rlog.conflist" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "rlog",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$STATE/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "firewall"},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
start containerd containerd --config "$STATE/containerd.toml"
wait_for 30 containerd ctr -a "$CTRD_SOCK" version
step "import images"
"$HERE/images.sh" import

# ---------------------------------------------------------------- kubelet
step "kubelet"
echo "nameserver $DNS_IP" > "$STATE/resolv.conf"
mkdir -p "$KUBELET_ROOT" "$STATE/pod-logs"
cat > "$STATE/kubelet.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$PKI/kubelet-serving.crt"
tlsPrivateKeyFile: "$PKI/kubelet-serving.key"
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: "unix://$CTRD_SOCK"
clusterDNS: ["$DNS_IP"]
clusterDomain: cluster.local
resolvConf: "$STATE/resolv.conf"
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
podLogsDir: "$STATE/pod-logs"
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
maxPods: 110
# a Secret or ConfigMap volume is refreshed on the pod's periodic sync: every 10 s here
# instead of the default minute, so a renewed certificate or a new roles file reaches the
# replicas in seconds (the e2e tests wait for both; the product does not rely on either)
syncFrequency: 10s
YAML
start kubelet "$K8S_BIN/kubelet" --config="$STATE/kubelet.yaml" \
  --kubeconfig="$KCFG/kubelet.kubeconfig" --root-dir="$KUBELET_ROOT" \
  --hostname-override="$NODE_NAME" --node-ip="$NODE_IP" --v=1

# ---------------------------------------------------------------- kube-proxy
step "kube-proxy"
cat > "$STATE/kube-proxy.yaml" <<YAML
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: "$KCFG/kube-proxy.kubeconfig"}
mode: iptables
clusterCIDR: "$CLUSTER_CIDR"
hostnameOverride: "$NODE_NAME"
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
nodePortAddresses: [primary]
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
YAML
start kube-proxy "$K8S_BIN/kube-proxy" --config="$STATE/kube-proxy.yaml" --v=1

# ---------------------------------------------------------------- CoreDNS (host process)
step "CoreDNS on $DNS_IP"
cat > "$STATE/Corefile" <<COREFILE
cluster.local:53 in-addr.arpa:53 ip6.arpa:53 {
    bind $DNS_IP
    errors
    health 127.0.0.1:8082
    ready 127.0.0.1:8182
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $KCFG/admin.kubeconfig $CLUSTER_NAME
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl $RLOG_DNS_TTL
    }
    cache $RLOG_DNS_TTL
    loadbalance
}
.:53 {
    bind $DNS_IP
    errors
    template ANY ANY {
        rcode NXDOMAIN
    }
}
COREFILE
start coredns "$COREDNS_BIN/coredns" -conf "$STATE/Corefile"

# ---------------------------------------------------------------- storage
step "local-path-provisioner (default StorageClass)"
sed -e "s#@LPP_DIR@#$LPP_DIR#g" "$HERE/manifests/local-path-storage.yaml" | "${K[@]}" apply -f - >/dev/null
cat > "$STATE/local-path-config.json" <<JSON
{"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": ["$LPP_DIR"]}]}
JSON
start local-path-provisioner "$LPP_BIN/local-path-provisioner" start \
  --config "$STATE/local-path-config.json" --kubeconfig "$KCFG/admin.kubeconfig" \
  --namespace local-path-storage --provisioner-name rancher.io/local-path \
  --configmap-name local-path-config --helper-image docker.io/rlog/busybox:1.35 \
  --service-account-name local-path-provisioner-service-account \
  --helper-pod-file "$HERE/manifests/helper-pod.yaml"

# ---------------------------------------------------------------- NetworkPolicy agent
if [[ $RLOG_NETPOL_AGENT != 0 ]]; then step "kube-router (NetworkPolicy agent)"; netpol_agent; fi

# ---------------------------------------------------------------- wait
step "waiting for node Ready, service accounts, DNS and kube-router"
wait_for 120 "node $NODE_NAME Ready" "${K[@]}" wait --for=condition=Ready "node/$NODE_NAME" --timeout=1s
wait_for 60 "default service account" "${K[@]}" -n default get serviceaccount default
wait_for 60 "kube-root-ca.crt" "${K[@]}" -n default get configmap kube-root-ca.crt
wait_for 60 "DNS" sh -c "busybox nslookup kubernetes.default.svc.cluster.local $DNS_IP | grep -q $API_SVC_IP"
[[ $RLOG_NETPOL_AGENT == 0 ]] || wait_for 120 "kube-router Ready" netpol_agent_ready
for p in etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns local-path-provisioner; do
  alive "$p"
done

# ---------------------------------------------------------------- like kind: tools + kubeconfig
step "kubectl/helm on PATH, kubeconfig context $CLUSTER_NAME"
install -m 0755 "$K8S_BIN/kubectl" /usr/local/bin/kubectl
install -m 0755 "$HELM_BIN/helm" /usr/local/bin/helm
mkdir -p "$HOME/.kube"
touch "$HOME/.kube/config"
KUBECONFIG="$HOME/.kube/config" kubectl config delete-context "$CLUSTER_NAME" >/dev/null 2>&1 || true
KUBECONFIG="$HOME/.kube/config:$KCFG/admin.kubeconfig" kubectl config view --flatten > "$STATE/merged.kubeconfig"
# the cluster/user entries of an earlier run carry old certificates: take ours
KUBECONFIG="$STATE/merged.kubeconfig" kubectl config set-cluster "$CLUSTER_NAME" \
  --server=https://127.0.0.1:6443 --certificate-authority="$PKI/ca.crt" --embed-certs >/dev/null
KUBECONFIG="$STATE/merged.kubeconfig" kubectl config set-credentials "$CLUSTER_NAME-admin" \
  --client-certificate="$PKI/admin.crt" --client-key="$PKI/admin.key" --embed-certs >/dev/null
KUBECONFIG="$STATE/merged.kubeconfig" kubectl config set-context "$CLUSTER_NAME" \
  --cluster="$CLUSTER_NAME" --user="$CLUSTER_NAME-admin" >/dev/null
KUBECONFIG="$STATE/merged.kubeconfig" kubectl config use-context "$CLUSTER_NAME" >/dev/null
install -m 0600 "$STATE/merged.kubeconfig" "$HOME/.kube/config"
rm -f "$STATE/merged.kubeconfig"

date -u +%FT%TZ > "$RUN/up.done"
log "cluster $CLUSTER_NAME is up in $((SECONDS - T0))s: kubectl get nodes"
kubectl get nodes -o wide
