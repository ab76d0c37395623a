#!/usr/bin/env bash
# Build etcd, CoreDNS, helm, local-path-provisioner and kube-router from the Go module proxy, plus
# our own static pause program. Each lands in $CACHE/<component>-<version>/bin and is
# skipped when already there. Builds run one at a time (2 cores).
source "$(dirname "$0")/lib.sh"

gobuild() { # name version bindir binary pkg@version [extra ldflags]
  local name=$1 ver=$2 bin=$3 exe=$4 pkg=$5 ld="-s -w ${6:-}" t=$SECONDS
  if [[ -x $bin/$exe ]]; then log "$name $ver: cached"; return; fi
  log "$name $ver: building"
  mkdir -p "$bin"
  GOBIN=$bin CGO_ENABLED=0 go install -trimpath -ldflags "$ld" "$pkg" > "$LOGS/$name.log" 2>&1 ||
    { tail -20 "$LOGS/$name.log" >&2; die "$name build failed (log: $LOGS/$name.log)"; }
  log "$name $ver: built in $((SECONDS - t))s"
}

# etcd: go.etcd.io/etcd/server/v3 is a main package but has replace lines (to its
# sibling modules, which it also requires at the same version), so build it from a
# wrapper module where those replace lines are ignored.
if [[ ! -x $ETCD_BIN/etcd ]]; then
  t=$SECONDS; log "etcd $ETCD_VERSION: building"
  w=$CACHE/build/etcd-$ETCD_VERSION; mkdir -p "$w" "$ETCD_BIN"
  ( cd "$w"
    [[ -f go.mod ]] || go mod init rlog.local/etcdbuild
    go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" "go.etcd.io/etcd/etcdctl/v3@$ETCD_VERSION"
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$ETCD_BIN/etcd" go.etcd.io/etcd/server/v3
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$ETCD_BIN/etcdctl" go.etcd.io/etcd/etcdctl/v3
  ) > "$LOGS/etcd.log" 2>&1 || { tail -20 "$LOGS/etcd.log" >&2; die "etcd build failed (log: $LOGS/etcd.log)"; }
  log "etcd $ETCD_VERSION: built in $((SECONDS - t))s"
else log "etcd $ETCD_VERSION: cached"; fi

gobuild coredns "$COREDNS_VERSION" "$COREDNS_BIN" coredns "github.com/coredns/coredns@$COREDNS_VERSION"
gobuild helm "$HELM_VERSION" "$HELM_BIN" helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
  "-X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
gobuild local-path-provisioner "$LPP_VERSION" "$LPP_BIN" local-path-provisioner \
  "github.com/rancher/local-path-provisioner@$LPP_VERSION"

# kube-router, run firewall-only: the NetworkPolicy agent beside the bridge CNI
# (docs/local-cluster.md says why this one). `go install pkg@version` cannot resolve it here:
# the module proxy refuses (403, not 404) the path .../cmd/kube-router as a module, which
# stops the search for the module root; so a wrapper module first requires the module
# itself, then its command package (which fills go.sum). v2.10.0 pins a
# pseudo-version of github.com/vishvananda/netlink that the proxy does not serve; the
# wrapper replaces it with the release before it, v1.3.1 (the only difference kube-router
# relies on is in its policy-routing code, which --run-router=false never runs).
if [[ $RLOG_NETPOL_AGENT == 0 ]]; then log "kube-router: skipped (RLOG_NETPOL_AGENT=0)"
elif [[ ! -x $KUBE_ROUTER_BIN/kube-router ]]; then
  t=$SECONDS; log "kube-router $KUBE_ROUTER_VERSION: building"
  w=$CACHE/build/kube-router-$KUBE_ROUTER_VERSION; mkdir -p "$w" "$KUBE_ROUTER_BIN"
  ( cd "$w"
    [[ -f go.mod ]] || go mod init rlog.local/kuberouterbuild
    go mod edit -replace github.com/vishvananda/netlink=github.com/vishvananda/netlink@v1.3.1
    go get "github.com/cloudnativelabs/kube-router/v2@$KUBE_ROUTER_VERSION"
    go get "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION"
    CGO_ENABLED=0 go build -trimpath -o "$KUBE_ROUTER_BIN/kube-router" -ldflags "-s -w \
      -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$KUBE_ROUTER_VERSION" \
      github.com/cloudnativelabs/kube-router/v2/cmd/kube-router
  ) > "$LOGS/kube-router.log" 2>&1 ||
    { tail -20 "$LOGS/kube-router.log" >&2; die "kube-router build failed (log: $LOGS/kube-router.log)"; }
  log "kube-router $KUBE_ROUTER_VERSION: built in $((SECONDS - t))s"
else log "kube-router $KUBE_ROUTER_VERSION: cached"; fi

# pause: our own tiny static program (the sandbox's "infra" process).
PAUSE_SRC=$HERE/images/pause.c
psum=$(sha256sum "$PAUSE_SRC" | cut -c1-12)
PAUSE_BIN=$CACHE/pause-$psum/bin
if [[ ! -x $PAUSE_BIN/pause ]]; then
  mkdir -p "$PAUSE_BIN"
  gcc -Os -static -o "$PAUSE_BIN/pause" "$PAUSE_SRC" && strip "$PAUSE_BIN/pause"
  log "pause: built"
fi
