# Shared settings for the local single-node Kubernetes (sourced, not run).
# shellcheck shell=bash
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.34.4}
ETCD_VERSION=${ETCD_VERSION:-v3.6.16}
COREDNS_VERSION=${COREDNS_VERSION:-v1.14.7}
HELM_VERSION=${HELM_VERSION:-v3.21.4}
LPP_VERSION=${LPP_VERSION:-v0.0.30}
KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-v2.10.0}
# 1 (default): run kube-router as the NetworkPolicy agent, so that `make test` checks the
# NetworkPolicy denials too; 0: no build, no image, no DaemonSet (the denial checks skip).
# Its first build is the largest after Kubernetes' (2 min with the Go module cache warm,
# 19-30 min measured cold under heavy load; docs/local-cluster.md); then it is cached.
RLOG_NETPOL_AGENT=${RLOG_NETPOL_AGENT:-1}
# Seconds cluster DNS gives pod and service records and caches answers. kubeadm's clusters
# (kind's too) use 30; 5 here by default. RLOG_DNS_TTL=30 (before cluster-up) tries the
# product against 30 s of stale addresses after pods are replaced (docs/local-cluster.md).
RLOG_DNS_TTL=${RLOG_DNS_TTL:-5}

CLUSTER_NAME=rlog-local
CACHE=${RLOG_CLUSTER_CACHE:-$HOME/.cache/rlog-cluster}
STATE=${RLOG_CLUSTER_STATE:-/var/lib/rlog-cluster}
RUN=$STATE/run              # pid files and logs
PKI=$STATE/pki
KCFG=$STATE/kubeconfig
CTRD_ROOT=$STATE/containerd
CTRD_STATE=/run/rlog-cluster/containerd
CTRD_SOCK=/run/rlog-cluster/containerd.sock
KUBELET_ROOT=$STATE/kubelet
CNI_CONF_DIR=$STATE/cni/net.d
CNI_BIN_DIR=/usr/lib/cni
LPP_DIR=$STATE/local-path      # where dynamically provisioned volumes live
POD_CIDR=10.244.0.0/24
CLUSTER_CIDR=10.244.0.0/16
SERVICE_CIDR=10.96.0.0/16
API_SVC_IP=10.96.0.1
DNS_IP=169.254.20.10
NODE_NAME=${NODE_NAME:-rlog-node}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

K8S_BIN=$CACHE/kubernetes-$K8S_VERSION/bin
ETCD_BIN=$CACHE/etcd-$ETCD_VERSION/bin
COREDNS_BIN=$CACHE/coredns-$COREDNS_VERSION/bin
HELM_BIN=$CACHE/helm-$HELM_VERSION/bin
LPP_BIN=$CACHE/local-path-provisioner-$LPP_VERSION/bin
KUBE_ROUTER_BIN=$CACHE/kube-router-$KUBE_ROUTER_VERSION/bin
KUBE_ROUTER_IMAGE=docker.io/rlog/kube-router:$KUBE_ROUTER_VERSION
LOGS=$CACHE/logs
mkdir -p "$LOGS"

export GOFLAGS=${GOFLAGS:--buildvcs=false}
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# The shared libraries ldd names for some host binaries (paths, one a line).
libs_of() { { ldd "$@" 2>/dev/null || true; } | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\/.*[^:]$/ {print $1}' | sort -u; }

# Copy host binaries into a rootfs with their shared libraries.
copy_with_libs() { # ROOTFS FILE...
  local r=$1 f lib; shift
  for f in "$@"; do
    mkdir -p "$r$(dirname "$f")"; cp -L "$f" "$r$f"
    for lib in $(libs_of "$f"); do
      [[ -e $r$lib ]] && continue
      mkdir -p "$r$(dirname "$lib")"; cp -L "$lib" "$r$lib"
    done
  done
}

# Debian packages a script needs on the host, installed if missing (a fresh machine has
# none of them; a script must not rely on someone having installed them by hand).
ensure_packages() { # PKG...
  local p missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]})) || return 0
  [[ $(id -u) == 0 ]] || die "packages missing (${missing[*]}) and not root to install them"
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    die "apt-get install ${missing[*]} failed"
}
