#!/usr/bin/env bash
# The kind cluster of the e2e suites ($KIND_CLUSTER: one control-plane node, and
# $KIND_WORKERS worker nodes, default 0; with workers the control plane takes pods too, so
# that 2 workers give 3 schedulable nodes, one per replica of a 3-replica log).
#   cluster.sh create   create it (idempotent): our node image (build-node.sh) in the private
#                       dockerd, or $KIND_NODE_IMAGE (an upstream kindest/node) in the
#                       machine's own docker
#   cluster.sh load     load the images e2e/cluster/images.sh built (archives) with
#                       `kind load image-archive`
#   cluster.sh delete   delete it
# Its kubeconfig is $KIND_CACHE/kubeconfig, never ~/.kube/config: the local cluster's context
# (rlog-local) stays the current one.
source "$(dirname "$0")/lib.sh"
KCFG_KIND=$KIND_CACHE/kubeconfig
DH=$(kind_docker_host)
kind_() { DOCKER_HOST=$DH "$KIND_BIN" "$@"; }

exists() { kind_ get clusters 2>/dev/null | grep -qx "$KIND_CLUSTER"; }

create() {
  "$KIND_HERE/install-kind.sh"
  local image=$KIND_NODE_IMAGE cfg=$KIND_CACHE/cluster.yaml
  if [[ -z $image ]]; then
    "$KIND_HERE/dockerd.sh" start
    image=$("$KIND_HERE/build-node.sh")
  fi
  if exists; then log "kind cluster $KIND_CLUSTER: exists"; kind_ export kubeconfig --name "$KIND_CLUSTER" --kubeconfig "$KCFG_KIND" >/dev/null 2>&1; return; fi
  { echo "kind: Cluster"
    echo "apiVersion: kind.x-k8s.io/v1alpha4"
    echo "nodes:"
    echo "  - role: control-plane"
    local w
    for ((w = 0; w < KIND_WORKERS; w++)); do echo "  - role: worker"; done
    if [[ -z $KIND_NODE_IMAGE ]]; then
      # our node image carries the local cluster's etcd and CoreDNS versions, not the ones
      # kubeadm would pick; /kind/image-tags in the image names them
      local tags etcd coredns
      tags=$(DOCKER_HOST=$DH docker run --rm --network none --entrypoint cat "$image" /kind/image-tags)
      etcd=$(awk '$1 == "etcd" {print $2}' <<<"$tags"); coredns=$(awk '$1 == "coredns" {print $2}' <<<"$tags")
      echo "kubeadmConfigPatches:"
      echo "  - |"
      echo "    kind: ClusterConfiguration"
      echo "    etcd: {local: {imageTag: \"$etcd\"}}"
      echo "    dns: {imageTag: \"$coredns\"}"
    fi
  } > "$cfg"
  local t=$SECONDS
  log "kind cluster $KIND_CLUSTER: creating from $image"
  kind_ create cluster --name "$KIND_CLUSTER" --image "$image" --config "$cfg" \
    --kubeconfig "$KCFG_KIND" --wait 300s ${KIND_RETAIN:+--retain} 2>&1 | tee "$KIND_LOGS/create.log" >&2
  [[ ${PIPESTATUS[0]} == 0 ]] || die "kind create cluster failed (log: $KIND_LOGS/create.log; KIND_RETAIN=1 keeps the node)"
  if ((KIND_WORKERS > 0)); then
    # kind taints a control plane that has workers; the node tests want every node
    local kc; kc=$(command -v kubectl || echo "$K8S_BIN/kubectl")
    KUBECONFIG=$KCFG_KIND "$kc" taint nodes "$KIND_CLUSTER-control-plane" \
      node-role.kubernetes.io/control-plane:NoSchedule- >/dev/null
  fi
  log "kind cluster $KIND_CLUSTER: created in $((SECONDS - t))s ($((KIND_WORKERS + 1)) nodes)"
}

load() {
  local f t=$SECONDS n=0
  for f in "$CACHE"/images/[0-9]*.tar; do
    [[ -e $f ]] || die "no image archives in $CACHE/images: run e2e/cluster/images.sh build"
    # our pause is in our node image already; an upstream node image brings its own
    [[ $(basename "$f") == 10-pause.tar ]] && continue
    kind_ load image-archive --name "$KIND_CLUSTER" "$f" >&2 || die "kind load image-archive $f failed"
    n=$((n + 1))
  done
  log "kind cluster $KIND_CLUSTER: $n image archives loaded in $((SECONDS - t))s"
}

delete() {
  [[ -x $KIND_BIN ]] || return 0
  if exists; then
    kind_ delete cluster --name "$KIND_CLUSTER" --kubeconfig "$KCFG_KIND" >&2
  else log "kind cluster $KIND_CLUSTER: not there"; fi
}

case ${1:-} in
  create) create ;;
  load) load ;;
  delete) delete ;;
  kubeconfig) echo "$KCFG_KIND" ;;
  *) die "usage: cluster.sh create|load|delete|kubeconfig" ;;
esac
