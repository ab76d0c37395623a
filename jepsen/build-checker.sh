#!/usr/bin/env bash
# Build the linearizability checker (jepsen/checker: our model of the log, judged by
# Porcupine, fetched through the Go module proxy at the version go.sum pins) into a cache
# dir. Idempotent: rebuilt only when a source file is newer than the binary.
# Prints the binary's path on stdout.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SRC=$HERE/checker
CACHE=${RLOG_JEPSEN_CACHE:-$HOME/.cache/rlog-jepsen}
BIN=$CACHE/checker

export GOFLAGS=${GOFLAGS:--buildvcs=false}
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export PATH=$PATH:/usr/local/go/bin  # where the Go tarball installs, if not on PATH

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "go is not installed (the checker is a Go program)"
mkdir -p "$CACHE"

# One build at a time (parallel test runs share the cache).
exec 9>"$CACHE/build.lock"
flock 9

stale=0
if [[ ! -x $BIN ]]; then
  stale=1
else
  for f in "$SRC"/*.go "$SRC"/go.mod "$SRC"/go.sum; do
    [[ $f -nt $BIN ]] && stale=1
  done
fi
if (( stale )); then
  log "building the checker ($(go version | cut -d' ' -f3)) into $BIN"
  (cd "$SRC" && go build -mod=readonly -o "$BIN.tmp" .) || die "go build failed"
  mv -f "$BIN.tmp" "$BIN"
fi
echo "$BIN"
