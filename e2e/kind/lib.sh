# Shared settings for the kind e2e cluster (sourced, not run). docs/kind.md describes it.
# shellcheck shell=bash
# The local cluster's settings come first: component versions, its build cache (the
# Kubernetes binaries, etcd, CoreDNS, pause and local-path-provisioner are shared with it),
# log/die.
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/../cluster/lib.sh"
KIND_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

KIND_VERSION=${KIND_VERSION:-v0.29.0}
KIND_CACHE=${RLOG_KIND_CACHE:-$HOME/.cache/rlog-kind}
KIND_BIN=$KIND_CACHE/kind-$KIND_VERSION/bin/kind
KIND_CLUSTER=${KIND_CLUSTER:-rlog-e2e}
# worker nodes beside the control plane (`make e2e-kind-nodes` runs 2: three nodes)
KIND_WORKERS=${KIND_WORKERS:-0}
# Empty: build our node image from local parts. Set (e.g. kindest/node:v1.34.0) on a machine
# that reaches a registry to use an upstream node image instead; then no private dockerd
# is started either (the machine's own docker is used).
KIND_NODE_IMAGE=${KIND_NODE_IMAGE:-}
KIND_LOGS=$KIND_CACHE/logs
mkdir -p "$KIND_LOGS"

# The private dockerd (dockerd.sh): own data root, exec root, pid file and socket; no
# iptables/ip6tables rules, no ip_forward change; one user-defined bridge for the nodes.
KIND_DOCKER_ROOT=$KIND_CACHE/docker
KIND_DOCKER_RUN=/run/rlog-kind
KIND_DOCKER_SOCK=unix://$KIND_DOCKER_RUN/docker.sock
KIND_NET=kind                     # the network name kind uses
KIND_NET_SUBNET=${KIND_NET_SUBNET:-172.30.100.0/24}
KIND_NET_BRIDGE=rlogkind0

# What the node image is built from.
KIND_BASE_REV=1                   # bump to rebuild the debootstrap base
KIND_BASE_TAR=$KIND_CACHE/base-bookworm-$KIND_BASE_REV/rootfs.tar
KIND_BASE_IMAGE=rlog.local/kind-base:bookworm-$KIND_BASE_REV
KIND_PARTS=$KIND_CACHE/parts      # OCI archives of the node's component images
PAUSE_IMAGE=registry.k8s.io/pause:3.10

# docker against our private daemon, unless an upstream node image is asked for (then the
# machine's own docker runs kind).
kind_docker_host() {
  if [[ -z $KIND_NODE_IMAGE ]]; then echo "$KIND_DOCKER_SOCK"; else echo "${DOCKER_HOST:-}"; fi
}
