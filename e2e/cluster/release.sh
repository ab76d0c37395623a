#!/usr/bin/env bash
# make release: what a user installs rlog from, without this source tree, into dist/ (or
# $RLOG_DIST):
#   rlog-replica-image-<version>.tar, rlog-operator-image-<version>.tar  the images, tagged
#       docker.io/rlog/<name>:<version> only (docker-archive: `kind load image-archive`,
#       `docker load`, or `ctr -n k8s.io images import`, then push to your registry)
#   rlog-operator-<version>.tgz  the chart (`helm package`), whose defaults name those tags
#   kubectl-rlog-<version>.tar.gz, rlog-krew-<version>.yaml  `kubectl rlog` as one file and
#       its krew manifest (plugin_bundle.py; $RLOG_RELEASE_URL: where the archive is served)
#   SHA256SUMS
# <version> is the project version's SemVer spelling (rlog.version.semver). The images come
# from e2e/cluster/images.sh build (the same Dockerfiles and cache as the local cluster's).
source "$(dirname "$0")/lib.sh"

DIST=${RLOG_DIST:-$REPO/dist}
VERSION=$(PYTHONPATH=$REPO/replica_image python3 -m rlog.version) \
  || die "no SemVer spelling of replica_image/rlog/__init__.py's __version__"

step() { log "== $*"; }

step "images (e2e/cluster/images.sh build)"
"$HERE/images.sh" build

mkdir -p "$DIST"
rm -f "$DIST"/rlog-*-image-*.tar "$DIST"/rlog-operator-*.tgz "$DIST/SHA256SUMS"
for name in rlog-replica rlog-operator; do
  step "image $name:$VERSION -> $DIST/$name-image-$VERSION.tar"
  archive=$(readlink -f "$CACHE/images/50-$name.tar") || die "no $name archive: did the build fail?"
  python3 "$HERE/retag_archive.py" "$archive" "$DIST/$name-image-$VERSION.tar" \
    "docker.io/rlog/$name:$VERSION"
done

step "chart -> $DIST/rlog-operator-$VERSION.tgz"
helm=$HELM_BIN/helm
[[ -x $helm ]] || helm=$(command -v helm) || die "no helm (make cluster-up builds one)"
"$helm" lint --strict "$REPO/helm/rlog-operator" >/dev/null || die "helm lint --strict failed"
"$helm" package "$REPO/helm/rlog-operator" -d "$DIST" >/dev/null
[[ -f $DIST/rlog-operator-$VERSION.tgz ]] \
  || die "helm package wrote no rlog-operator-$VERSION.tgz: Chart.yaml's version differs from $VERSION"

step "kubectl rlog -> $DIST/kubectl-rlog-$VERSION.tar.gz, its krew manifest"
python=$REPO/.venv/bin/python # its pip, under constraints.txt
[[ -x $python ]] || python=python3
rm -f "$DIST"/kubectl-rlog-*.tar.gz "$DIST"/rlog-krew-*.yaml
"$python" "$HERE/plugin_bundle.py" "$VERSION" "$DIST" >/dev/null

(cd "$DIST" && sha256sum rlog-replica-image-"$VERSION".tar rlog-operator-image-"$VERSION".tar \
  rlog-operator-"$VERSION".tgz kubectl-rlog-"$VERSION".tar.gz rlog-krew-"$VERSION".yaml \
  > SHA256SUMS)
step "done: $DIST"
ls -l "$DIST" >&2
