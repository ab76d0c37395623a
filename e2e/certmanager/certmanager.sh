#!/usr/bin/env bash
# cert-manager on the local cluster, for the e2e test of spec.tls.issuerRef
# (e2e/operator/test_cert_manager.py). Everything comes from the Go module proxy:
#
#   certmanager.sh build      controller, webhook and cainjector binaries (static), built from
#                             the published module github.com/cert-manager/cert-manager at
#                             $CERT_MANAGER_VERSION with the small entry points in cmd/ (the
#                             upstream commands live in unpublished modules); cached by version
#                             and by the hash of cmd/
#   certmanager.sh images     one OCI archive per binary (ociarchive.py, no daemon), cached
#   certmanager.sh import     load the archives into the running cluster's containerd
#   certmanager.sh install    CRDs, RBAC, Deployments and webhook configurations rendered with
#                             helm from the chart inside the module (deploy/charts/cert-manager),
#                             our images swapped in; waits until the webhook answers
#   certmanager.sh render     prints what install applies
#   certmanager.sh uninstall  removes the release and its namespace (the chart keeps the CRDs)
#   certmanager.sh all        build + images + import + install
# Needs go, helm and kubectl (make cluster-up puts them in place) and a running cluster.
source "$(dirname "$0")/../cluster/lib.sh"
export PATH=$PATH:/usr/local/go/bin  # where the Go tarball installs, if not on PATH

CERT_MANAGER_VERSION=${CERT_MANAGER_VERSION:-v1.19.4}
CM_NS=cert-manager
CM_MOD=github.com/cert-manager/cert-manager
SRC=$REPO/e2e/certmanager/cmd
COMPONENTS=(controller webhook cainjector)
CM_IMAGE_PREFIX=docker.io/rlog/cert-manager

src_hash() { (cd "$SRC" && find . -name '*.go' | sort | xargs sha256sum) | sha256sum | cut -c1-12; }
CM_BIN=$CACHE/cert-manager-$CERT_MANAGER_VERSION-$(src_hash)/bin
# Tagged by content too: a rebuilt binary changes the Deployment, so install rolls it out.
image_tag() { echo "$CERT_MANAGER_VERSION-$(sha256sum "$CM_BIN/$1" | cut -c1-12)"; }

build() {
  local missing=() c
  for c in "${COMPONENTS[@]}"; do [[ -x $CM_BIN/$c ]] || missing+=("$c"); done
  if ((${#missing[@]} == 0)); then log "cert-manager $CERT_MANAGER_VERSION: cached in $CM_BIN"; return; fi
  mkdir -p "$CACHE"
  exec 9>"$CACHE/cert-manager.lock"; flock 9
  local t0=$SECONDS work=$CACHE/build/cert-manager-$CERT_MANAGER_VERSION
  mkdir -p "$work" "$CM_BIN"
  # A wrapper module under the cert-manager import path: like the upstream commands, our
  # entry points use packages under its internal/ (the webhook server is one).
  rm -rf "$work/cmd"; cp -r "$SRC" "$work/cmd"
  ( cd "$work" || exit 1
    if [[ ! -f go.mod ]] || ! grep -q "$CM_MOD $CERT_MANAGER_VERSION" go.mod; then
      log "cert-manager $CERT_MANAGER_VERSION: preparing the wrapper module"
      rm -f go.mod go.sum
      go mod init "$CM_MOD/rlog-e2e" >/dev/null 2>&1
      go mod download -json "$CM_MOD@$CERT_MANAGER_VERSION" >/dev/null || die "no $CM_MOD@$CERT_MANAGER_VERSION"
      # Our go line must be at least cert-manager's.
      go mod edit -go="$(awk '$1=="go"{print $2; exit}' "$(go env GOMODCACHE)/cache/download/$CM_MOD/@v/$CERT_MANAGER_VERSION.mod")"
      go mod edit -require "$CM_MOD@$CERT_MANAGER_VERSION"
    fi
    go mod tidy > "$LOGS/cert-manager-tidy.log" 2>&1 ||
      { tail -20 "$LOGS/cert-manager-tidy.log" >&2; die "go mod tidy failed"; }
  ) || exit 1
  local ld="-s -w -X $CM_MOD/pkg/util.AppVersion=$CERT_MANAGER_VERSION -X $CM_MOD/pkg/util.AppGitCommit=module-proxy"
  for c in "${missing[@]}"; do
    local t=$SECONDS
    log "cert-manager $CERT_MANAGER_VERSION: building $c"
    ( cd "$work" && CGO_ENABLED=0 go build -trimpath -ldflags "$ld" -o "$CM_BIN/$c.tmp" "./cmd/$c" ) \
      > "$LOGS/cert-manager-$c.log" 2>&1 || { tail -30 "$LOGS/cert-manager-$c.log" >&2; die "building $c failed"; }
    mv "$CM_BIN/$c.tmp" "$CM_BIN/$c"
    log "cert-manager $CERT_MANAGER_VERSION: $c built in $((SECONDS - t))s"
  done
  log "cert-manager $CERT_MANAGER_VERSION: built in $((SECONDS - t0))s"
}

IMG=$CACHE/images

images() {
  build
  mkdir -p "$IMG"
  local c
  for c in "${COMPONENTS[@]}"; do
    local tag out
    tag=$(image_tag "$c")
    out=$IMG/cert-manager-$c-$tag.tar
    if [[ ! -f $out ]]; then
      local r; r=$(mktemp -d); mkdir -p "$r/bin" "$r/tmp"; chmod 1777 "$r/tmp"
      cp "$CM_BIN/$c" "$r/bin/$c"
      # The chart's pods say runAsNonRoot: the image's user must be a number other than 0.
      python3 "$REPO/e2e/cluster/ociarchive.py" "$r" "$CM_IMAGE_PREFIX-$c:$tag" "$out.tmp" \
        --entrypoint "/bin/$c" --user 1000:1000
      mv "$out.tmp" "$out"; rm -rf "$r"
      log "image $CM_IMAGE_PREFIX-$c:$tag: built"
    fi
    # Not numbered like the cluster's own archives, so images.sh import leaves them alone.
    ln -sf "$out" "$IMG/cert-manager-$c.tar"
  done
}

import_images() {
  images
  local c
  for c in "${COMPONENTS[@]}"; do
    ctr -a "$CTRD_SOCK" -n k8s.io images import "$IMG/cert-manager-$c.tar" >/dev/null ||
      die "import of cert-manager-$c failed"
  done
  log "cert-manager images imported into the cluster's containerd"
}

# The chart inside the module, with the Chart.yaml that upstream's release tool would write.
chart_dir() {
  local mod out=$CACHE/build/cert-manager-chart-$CERT_MANAGER_VERSION
  mod=$(go mod download -json "$CM_MOD@$CERT_MANAGER_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')
  if [[ ! -f $out/Chart.yaml ]]; then
    rm -rf "$out"; mkdir -p "$out"
    cp -r "$mod/deploy/charts/cert-manager/." "$out/"; chmod -R u+w "$out"
    sed -e "s/^version: .*/version: $CERT_MANAGER_VERSION/" -e "s/^appVersion: .*/appVersion: $CERT_MANAGER_VERSION/" \
      -e 's/{{IS_PRERELEASE}}/false/' "$out/Chart.template.yaml" > "$out/Chart.yaml"
  fi
  echo "$out"
}

helm_values() {
  local c key
  echo --set crds.enabled=true --set startupapicheck.enabled=false --set prometheus.enabled=false
  for c in "${COMPONENTS[@]}"; do
    key=${c/controller/}; key=${key:+$key.}
    echo --set "${key}image.repository=$CM_IMAGE_PREFIX-$c" --set "${key}image.tag=$(image_tag "$c")" \
      --set "${key}image.pullPolicy=Never"
  done
}

render() {
  # shellcheck disable=SC2046
  helm template cert-manager "$(chart_dir)" -n "$CM_NS" --kube-version "${KUBE_VERSION_FOR_RENDER:-$K8S_VERSION}" $(helm_values)
}

install() {
  import_images
  local t=$SECONDS
  # shellcheck disable=SC2046
  helm upgrade --install cert-manager "$(chart_dir)" -n "$CM_NS" --create-namespace \
    $(helm_values) --wait --timeout 5m >/dev/null || die "helm install of cert-manager failed"
  # The webhook answers once the cainjector has put its CA into the webhook configurations:
  # a dry-run create of an Issuer goes through it.
  local i
  for i in $(seq 1 60); do
    if kubectl create --dry-run=server -f - >/dev/null 2>&1 <<'YAML'
apiVersion: cert-manager.io/v1
kind: Issuer
metadata: {name: rlog-webhook-probe, namespace: default}
spec: {selfSigned: {}}
YAML
    then log "cert-manager $CERT_MANAGER_VERSION: installed, webhook answering ($((SECONDS - t))s)"; return; fi
    sleep 2
  done
  die "the cert-manager webhook does not answer (see kubectl -n $CM_NS logs deploy/cert-manager-webhook)"
}

uninstall() {
  helm uninstall cert-manager -n "$CM_NS" --wait >/dev/null 2>&1 || true
  kubectl delete namespace "$CM_NS" --ignore-not-found --wait=false
}

case ${1:-} in
  build) build ;;
  images) images ;;
  import) import_images ;;
  render) render ;;
  install) install ;;
  uninstall) uninstall ;;
  all) install ;;
  *) die "usage: certmanager.sh build|images|import|render|install|uninstall|all" ;;
esac
