#!/usr/bin/env bash
# Build the Kubernetes server components and kubectl from the Go module proxy.
# k8s.io/kubernetes requires its staging modules at v0.0.0 (replaced in-tree), so
# `go install k8s.io/kubernetes/cmd/...@v` is refused. We build inside a wrapper
# module that replaces every k8s.io/* v0.0.0 requirement with the published v0.X.Y.
# Output: $CACHE/kubernetes-$K8S_VERSION/bin/{kube-apiserver,...}
source "$(dirname "$0")/lib.sh"

CMDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
# kubeadm only for the kind node image (e2e/kind/), whose nodes run `kubeadm init`
[[ ${K8S_WITH_KUBEADM:-0} == 1 ]] && CMDS+=(kubeadm)
out=$K8S_BIN
missing=()
for c in "${CMDS[@]}"; do [[ -x $out/$c ]] || missing+=("$c"); done
if ((${#missing[@]} == 0)); then log "kubernetes $K8S_VERSION: cached"; exit 0; fi

t0=$SECONDS
staging=v0.${K8S_VERSION#v1.}         # v1.34.4 -> v0.34.4
work=$CACHE/build/kubernetes-$K8S_VERSION
mkdir -p "$work" "$out"
cd "$work" || exit 1
if [[ ! -f go.mod ]] || ! grep -q "k8s.io/kubernetes $K8S_VERSION" go.mod || ! grep -q cmd/kubeadm tools.go; then
  log "kubernetes $K8S_VERSION: preparing wrapper module"
  rm -f go.mod go.sum
  go mod init rlog.local/k8sbuild >/dev/null 2>&1
  go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null
  kmod=$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/$K8S_VERSION.mod
  [[ -f $kmod ]] || die "no go.mod for k8s.io/kubernetes@$K8S_VERSION"
  # Go language version of the kubernetes module (our go.mod must be >= it).
  gover=$(awk '$1=="go"{print $2; exit}' "$kmod")
  go mod edit -go="$gover"
  # Every staging module required at v0.0.0 -> published version.
  awk '/v0\.0\.0$/ && $1 ~ /^k8s\.io\// {print $1}' "$kmod" | sort -u > staging.txt
  while read -r m; do go mod edit -replace "$m=$m@$staging"; done < staging.txt
  go mod edit -require "k8s.io/kubernetes@$K8S_VERSION"
  # Non-staging replace directives of kubernetes itself (if any) must be copied too.
  awk '/^replace \(/{f=1;next} f&&/^\)/{f=0} f&&$3=="=>"&&$1!~/^k8s\.io\//{print $1"="$4"@"$5}' "$kmod" |
    while read -r r; do go mod edit -replace "$r"; done
  cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kubeadm"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
	_ "k8s.io/kubectl/pkg/cmd"
)
GO
  go get "k8s.io/kubernetes@$K8S_VERSION" >/dev/null 2>&1 || true
  go mod tidy -e >/dev/null 2>&1 || true
  go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" \
    "k8s.io/kubernetes/cmd/kubeadm@$K8S_VERSION" \
    > "$LOGS/kubernetes-get.log" 2>&1 || { tail -20 "$LOGS/kubernetes-get.log" >&2; die "go get failed"; }
fi

ver=${K8S_VERSION#v}
major=${ver%%.*}; rest=${ver#*.}; minor=${rest%%.*}
date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
ld="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  ld+=" -X $p.gitVersion=$K8S_VERSION -X $p.gitMajor=$major -X $p.gitMinor=$minor"
  ld+=" -X $p.gitCommit=0000000000000000000000000000000000000000 -X $p.gitTreeState=clean -X $p.buildDate=$date"
done
for c in "${missing[@]}"; do
  t=$SECONDS
  log "kubernetes $K8S_VERSION: building $c"
  CGO_ENABLED=0 go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$ld" \
    -o "$out/$c.tmp" "k8s.io/kubernetes/cmd/$c"
  mv "$out/$c.tmp" "$out/$c"
  log "kubernetes $K8S_VERSION: $c built in $((SECONDS - t))s"
done
log "kubernetes $K8S_VERSION: done in $((SECONDS - t0))s"
