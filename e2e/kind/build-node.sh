#!/usr/bin/env bash
# The kind node image, from local parts only, in the private dockerd (dockerd.sh start first):
#   base   the debootstrap rootfs (build-base.sh), imported as $KIND_BASE_IMAGE
#   node   base + kubeadm, kubelet, kubectl in /usr/bin, our entrypoint, containerd config and
#          kubelet unit (node/), /kind/version, /kind/manifests/default-{cni,storage}.yaml,
#          and the component images (parts.sh) preloaded into containerd (k8s.io namespace,
#          not unpacked: the CRI unpacks on first use, as in kind's own images)
# Like kind's `build node-image`, the node is assembled in a plain container and committed
# (docker run, cp, exec, commit), so the image archives copied in for the preload are not
# left in any layer. The tag carries a hash of every input; a warm run only finds the tag.
# Prints the image name.
source "$(dirname "$0")/lib.sh"
D=(docker -H "$KIND_DOCKER_SOCK")
"${D[@]}" version >/dev/null 2>&1 || die "private dockerd not running: e2e/kind/dockerd.sh start"

"$KIND_HERE/build-base.sh"
if ! "${D[@]}" image inspect "$KIND_BASE_IMAGE" >/dev/null 2>&1; then
  t=$SECONDS
  "${D[@]}" import --change 'ENV container=docker' --change 'CMD ["/sbin/init"]' \
    "$KIND_BASE_TAR" "$KIND_BASE_IMAGE" >/dev/null
  log "kind base image $KIND_BASE_IMAGE: imported in $((SECONDS - t))s"
fi

parts=$("$KIND_HERE/parts.sh")
# shellcheck disable=SC1091
source "$parts/images.env"
h=$( { echo "base=$KIND_BASE_REV parts=$(basename "$parts")"; sha256sum "$0" "$KIND_HERE"/node/* | cut -d' ' -f1; } |
  sha256sum | cut -c1-12)
IMAGE=rlog.local/kind-node:$K8S_VERSION-$h
if "${D[@]}" image inspect "$IMAGE" >/dev/null 2>&1; then
  log "kind node image $IMAGE: cached"; echo "$IMAGE"; exit 0
fi

t=$SECONDS; log "kind node image $IMAGE: building"
ctx=$(mktemp -d "$KIND_CACHE/node-ctx.XXXXXX")
cid=
cleanup() { [[ -n $cid ]] && "${D[@]}" rm -f -v "$cid" >/dev/null 2>&1; rm -rf "$ctx"; }
trap cleanup EXIT
R=$ctx/root
mkdir -p "$R"/usr/bin "$R"/usr/local/bin "$R"/etc/containerd "$R"/etc/systemd/system \
  "$R"/kind/manifests "$R"/kind/images "$R"/etc/cni/net.d
for b in kubeadm kubelet kubectl; do cp "$K8S_BIN/$b" "$R/usr/bin/$b"; done
cp "$KIND_HERE/node/entrypoint" "$R/usr/local/bin/entrypoint"
cp "$KIND_HERE/node/containerd.toml" "$R/etc/containerd/config.toml"
cp "$KIND_HERE/node/kubelet.service" "$R/etc/systemd/system/kubelet.service"
echo "$K8S_VERSION" > "$R/kind/version"
for m in cni storage; do
  sed -e "s#@TOOLS_IMAGE@#$TOOLS_IMAGE#g" -e "s#@LPP_IMAGE@#$LPP_IMAGE#g" \
    "$KIND_HERE/node/$m.yaml" > "$R/kind/manifests/default-$m.yaml"
done
# what kind's cluster config must tell kubeadm (cluster.yaml): our etcd and CoreDNS versions
printf 'etcd %s\ncoredns %s\n' "$ETCD_TAG" "$COREDNS_TAG" > "$R/kind/image-tags"
cp "$parts"/*.tar "$R/kind/images/"

# (dockerd --ip-forward=false makes `docker run` warn that networking will not work; this
# container needs none)
cid=$("${D[@]}" run -d --network none --entrypoint sleep "$KIND_BASE_IMAGE" infinity)
"${D[@]}" cp "$R/." "$cid:/"
"${D[@]}" exec "$cid" bash -euc '
  chown -R root:root /usr/bin/kube* /usr/local/bin/entrypoint /kind /etc/containerd /etc/systemd/system/kubelet.service
  chmod 0755 /usr/bin/kube* /usr/local/bin/entrypoint
  systemctl enable containerd.service kubelet.service >/dev/null 2>&1
  containerd --config /etc/containerd/config.toml >/tmp/containerd.log 2>&1 &
  for _ in $(seq 60); do ctr version >/dev/null 2>&1 && break; sleep 0.5; done
  for f in /kind/images/*.tar; do ctr -n k8s.io images import --no-unpack "$f" >/dev/null; done
  # pinned: the kubelet never garbage-collects them (they cannot be pulled again)
  for i in $(ctr -n k8s.io images ls -q | grep -v "^sha256:"); do
    ctr -n k8s.io images label "$i" io.cri-containerd.pinned=pinned >/dev/null
    echo "$i"
  done
  kill %1; wait || true
  rm -rf /kind/images /tmp/containerd.log' | sed 's/^/  preloaded: /' >&2
"${D[@]}" commit "$cid" "$IMAGE-assembled" >/dev/null
# `docker commit --change` cannot set STOPSIGNAL; systemd stops cleanly on SIGRTMIN+3
printf '%s\n' "FROM $IMAGE-assembled" 'STOPSIGNAL SIGRTMIN+3' 'ENV container=docker' \
  'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]' 'CMD []' > "$ctx/Dockerfile"
mkdir -p "$ctx/empty"
DOCKER_BUILDKIT=0 "${D[@]}" build -q -t "$IMAGE" -f "$ctx/Dockerfile" "$ctx/empty" > "$KIND_LOGS/node-build.log" 2>&1 ||
  die "node image build failed: $(tail -5 "$KIND_LOGS/node-build.log")"
"${D[@]}" rmi "$IMAGE-assembled" >/dev/null
# keep the newest node image only (one in use by a node container stays, rmi refuses it)
for old in $("${D[@]}" images --format '{{.Repository}}:{{.Tag}}' rlog.local/kind-node); do
  [[ $old == "$IMAGE" ]] || "${D[@]}" rmi "$old" >/dev/null 2>&1 || true
done
log "kind node image $IMAGE: built in $((SECONDS - t))s"
echo "$IMAGE"
