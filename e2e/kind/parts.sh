#!/usr/bin/env bash
# The node's component images, as single-layer OCI archives made by e2e/cluster/ociarchive.py
# (no Docker daemon) from the binaries the local cluster builds (plus kubeadm):
#   registry.k8s.io/kube-{apiserver,controller-manager,scheduler,proxy}:$K8S_VERSION
#   registry.k8s.io/etcd:<etcd version>-0, registry.k8s.io/coredns/coredns:$COREDNS_VERSION
#   registry.k8s.io/pause:3.10 (our static pause), docker.io/rlog/local-path-provisioner
#   docker.io/rlog/kind-tools:dev (busybox + kubectl: the CNI installer, volume helper pods)
# kube-proxy runs iptables-restore and friends, so its image holds the host's iptables-nft
# (xtables-nft-multi, its extensions, the shared libraries ldd names) and conntrack.
# Output: $KIND_PARTS/<hash of every input>/*.tar; prints that directory.
source "$(dirname "$0")/lib.sh"

PARTS_REV=1                       # bump when the image layouts below change
psum=$(sha256sum "$HERE/images/pause.c" | cut -c1-12)
PAUSE_BIN=$CACHE/pause-$psum/bin/pause
MULTI=/usr/sbin/xtables-nft-multi XT=/usr/lib/x86_64-linux-gnu/xtables CONNTRACK=/usr/sbin/conntrack
BUSYBOX=/bin/busybox
ETCD_TAG=${ETCD_VERSION#v}-0

need=("$K8S_BIN"/{kube-apiserver,kube-controller-manager,kube-scheduler,kube-proxy,kubectl,kubeadm,kubelet}
  "$ETCD_BIN/etcd" "$ETCD_BIN/etcdctl" "$COREDNS_BIN/coredns" "$LPP_BIN/local-path-provisioner" "$PAUSE_BIN"
  "$MULTI" "$CONNTRACK" "$BUSYBOX")
for f in "${need[@]}"; do
  [[ -x $f ]] || die "$f missing: run K8S_WITH_KUBEADM=1 e2e/cluster/build-k8s.sh and e2e/cluster/build-tools.sh (iptables, conntrack, busybox-static from Debian)"
done

h=$( { echo "rev=$PARTS_REV k8s=$K8S_VERSION etcd=$ETCD_VERSION coredns=$COREDNS_VERSION lpp=$LPP_VERSION"
  sha256sum "$0" "${need[@]}" "$XT"/*.so; libs_of "$MULTI" "$CONNTRACK" "$XT"/*.so | xargs sha256sum
} | cut -d' ' -f1 | sha256sum | cut -c1-16)   # contents only, not the paths they were named by
out=$KIND_PARTS/$h
if [[ -f $out/done ]]; then log "kind node parts: cached ($h)"; echo "$out"; exit 0; fi
t=$SECONDS; rm -rf "$out"; mkdir -p "$out"
OCI=(python3 "$HERE/ociarchive.py")
newroot() { local r; r=$(mktemp -d "$KIND_PARTS/root.XXXXXX"); mkdir -p "$r/tmp" "$r/etc"; chmod 1777 "$r/tmp"; echo "$r"; }

for c in kube-apiserver kube-controller-manager kube-scheduler; do
  r=$(newroot); install -D "$K8S_BIN/$c" "$r/usr/local/bin/$c"
  "${OCI[@]}" "$r" "registry.k8s.io/$c:$K8S_VERSION" "$out/$c.tar" --entrypoint "/usr/local/bin/$c"
  rm -rf "$r"
done

r=$(newroot); install -D "$K8S_BIN/kube-proxy" "$r/usr/local/bin/kube-proxy"
copy_with_libs "$r" "$MULTI" "$CONNTRACK" "$XT"/*.so
for n in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
  ln -s xtables-nft-multi "$r/usr/sbin/$n"
done
cp /etc/protocols "$r/etc/protocols"
"${OCI[@]}" "$r" "registry.k8s.io/kube-proxy:$K8S_VERSION" "$out/kube-proxy.tar" --entrypoint /usr/local/bin/kube-proxy
rm -rf "$r"

r=$(newroot); install -D "$ETCD_BIN/etcd" "$r/usr/local/bin/etcd"; install -D "$ETCD_BIN/etcdctl" "$r/usr/local/bin/etcdctl"
mkdir -p "$r/var/lib/etcd"
"${OCI[@]}" "$r" "registry.k8s.io/etcd:$ETCD_TAG" "$out/etcd.tar" --entrypoint /usr/local/bin/etcd
rm -rf "$r"

r=$(newroot); install -D "$COREDNS_BIN/coredns" "$r/coredns"
"${OCI[@]}" "$r" "registry.k8s.io/coredns/coredns:$COREDNS_VERSION" "$out/coredns.tar" --entrypoint /coredns
rm -rf "$r"

r=$(newroot); install -D "$PAUSE_BIN" "$r/pause"
"${OCI[@]}" "$r" "$PAUSE_IMAGE" "$out/pause.tar" --entrypoint /pause --user 65535:65535
rm -rf "$r"

r=$(newroot); install -D "$LPP_BIN/local-path-provisioner" "$r/local-path-provisioner"
"${OCI[@]}" "$r" "docker.io/rlog/local-path-provisioner:$LPP_VERSION" "$out/local-path-provisioner.tar" \
  --entrypoint /local-path-provisioner
rm -rf "$r"

r=$(newroot); mkdir -p "$r/bin"; cp "$BUSYBOX" "$r/bin/busybox"
for a in $("$BUSYBOX" --list); do [[ $a == busybox ]] || ln -s busybox "$r/bin/$a"; done
install -D "$K8S_BIN/kubectl" "$r/bin/kubectl"
echo 'root:x:0:0:root:/root:/bin/sh' > "$r/etc/passwd"; echo 'root:x:0:' > "$r/etc/group"
"${OCI[@]}" "$r" docker.io/rlog/kind-tools:dev "$out/kind-tools.tar" --cmd sh
rm -rf "$r"

cat > "$out/images.env" <<ENV
ETCD_TAG=$ETCD_TAG
COREDNS_TAG=$COREDNS_VERSION
LPP_IMAGE=docker.io/rlog/local-path-provisioner:$LPP_VERSION
TOOLS_IMAGE=docker.io/rlog/kind-tools:dev
ENV
touch "$out/done"
find "$KIND_PARTS" -mindepth 1 -maxdepth 1 ! -path "$out" -exec rm -rf {} +   # keep the newest only
log "kind node parts: built in $((SECONDS - t))s ($h, $(du -sh "$out" | cut -f1))"
echo "$out"
