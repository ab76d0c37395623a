#!/usr/bin/env bash
# Install Prometheus and promtool at a pinned version, built from the Go module proxy (no
# release tarballs, no vendored code), cached under ~/.cache/rlog-prometheus/<version>/bin.
# Prints that bin dir on stdout (everything else goes to stderr); a second run is instant.
#
#   e2e/monitoring/prometheus.sh            # -> /root/.cache/rlog-prometheus/v0.315.0/bin
#
# Prometheus 3.x is published as Go module versions v0.3XX.Y (v0.315.0 = Prometheus 3.15.0).
# Built with -tags remove_all_sd: only static, file and http service discovery (the tests
# use static targets), which cuts the cold build considerably. No web UI assets
# (builtinassets off): the HTTP API, which is all the tests use, is complete without them.
# Needs Go >= the `go` line of Prometheus' go.mod (1.26.0 for v0.315.0); GOTOOLCHAIN=local,
# so an older Go fails loudly instead of fetching a toolchain.
# Why v0.315.0 and not v0.316.0 (newest): v0.316.0 needs module versions the proxy serves
# as 403 "not available" (github.com/pb33f/go-yaml v0.1.1, among others).
set -euo pipefail

VERSION=${RLOG_PROMETHEUS_VERSION:-v0.315.0}
ROOT=${RLOG_PROMETHEUS_CACHE:-$HOME/.cache/rlog-prometheus}
DIR=$ROOT/$VERSION
BIN=$DIR/bin

log() { printf '[%s] prometheus.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

have() { [[ -x $BIN/prometheus && -x $BIN/promtool ]]; }

if have; then echo "$BIN"; exit 0; fi

GO=$(command -v go || true)
[[ -n $GO ]] || { [[ -x /usr/local/go/bin/go ]] && GO=/usr/local/go/bin/go; }
[[ -n $GO ]] || die "Go is needed to build Prometheus $VERSION (not on PATH, not /usr/local/go/bin/go)"

mkdir -p "$DIR"
# One build at a time (parallel test runs, CI retries): the loser waits, then finds it cached.
exec 9> "$DIR/.lock"
flock 9
if have; then echo "$BIN"; exit 0; fi

# v0.315.0 -> 3.15.0 (the version `prometheus --version` reports)
minor=${VERSION#v0.3}; minor=${minor%%.*}; patch=${VERSION##*.}
PROM_VERSION=3.$((10#$minor)).$patch
LD="-s -w -X github.com/prometheus/common/version.Version=$PROM_VERSION"
LD+=" -X github.com/prometheus/common/version.Branch=module-proxy"
LD+=" -X github.com/prometheus/common/version.BuildUser=rlog"

TMP=$DIR/bin.tmp
SRC=$DIR/src
LOG=$DIR/build.log
rm -rf "$TMP" "$SRC"
mkdir -p "$TMP"
t=$SECONDS
log "building Prometheus $PROM_VERSION ($VERSION) with $($GO version) (log: $LOG)"
export GOTOOLCHAIN=${GOTOOLCHAIN:-local} GOWORK=off CGO_ENABLED=0 GOFLAGS=${GOFLAGS:--buildvcs=false}
# Build inside Prometheus' own module (a copy of the proxy's zip), not with
# `go install pkg@version`: its go.mod has replace/exclude lines (which `go install @v`
# refuses), and as the main module they apply exactly as upstream builds it.
cd "$DIR"
if ! {
  moddir=$("$GO" mod download -json "github.com/prometheus/prometheus@$VERSION" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p') && [[ -n $moddir ]] &&
    cp -r "$moddir" "$SRC" && chmod -R u+w "$SRC" &&
    cd "$SRC" &&
    "$GO" build -trimpath -tags remove_all_sd -ldflags "$LD" -o "$TMP/" ./cmd/prometheus ./cmd/promtool
} > "$LOG" 2>&1; then
  tail -30 "$LOG" >&2
  die "building Prometheus $VERSION failed (log: $LOG)"
fi
cd /
rm -rf "$SRC"
"$TMP/prometheus" --version > /dev/null 2>&1 || die "the built prometheus does not run"
"$TMP/promtool" --version > /dev/null 2>&1 || die "the built promtool does not run"
rm -rf "$BIN"
mv "$TMP" "$BIN"
log "built Prometheus $PROM_VERSION in $((SECONDS - t))s"
echo "$BIN"
