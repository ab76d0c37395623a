#!/usr/bin/env bash
# Build a go-fuse program: powerfs (tests/powerfs: the FUSE file system that drops what was
# not synced), or the one in the directory given (bench/slowfs: a disk with slow syncs), on
# go-fuse fetched through the Go module proxy at the version its go.sum pins, into a cache
# dir named after a hash of its sources, so a changed source builds anew and an unchanged
# one never does. Idempotent. Prints the binary's path on stdout.
#
#   tests/powerfs/build.sh [DIR]
#
# Mounting: as root, both call mount(2) themselves (go-fuse's DirectMount), so fusermount
# is not needed and not installed; they need /dev/fuse (the fuse module). Not as root, they
# need fusermount3: Debian's fuse3 package, which this script installs when it can (apt-get).
set -euo pipefail

HERE=$(cd "${1:-$(dirname "${BASH_SOURCE[0]}")}" && pwd)
NAME=$(basename "$HERE")
CACHE=${RLOG_POWERFS_CACHE:-$HOME/.cache/rlog-powerfs}

export GOFLAGS=${GOFLAGS:--buildvcs=false}
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export PATH=$PATH:/usr/local/go/bin  # where the Go tarball installs, if not on PATH

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

command -v go >/dev/null || die "go is not installed ($NAME is a Go program)"
[[ -e /dev/fuse ]] || modprobe fuse 2>/dev/null || true
[[ -e /dev/fuse ]] || die "/dev/fuse is missing: this kernel has no FUSE (modprobe fuse)"
if (( EUID != 0 )) && ! command -v fusermount3 >/dev/null; then
  log "not root and no fusermount3: installing Debian's fuse3"
  { sudo -n apt-get install -y fuse3 >&2 || apt-get install -y fuse3 >&2; } \
    || die "$NAME needs root or fusermount3 (apt-get install fuse3)"
fi

hash=$(cd "$HERE" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-16)
BIN=$CACHE/$hash/$NAME
mkdir -p "$CACHE"

# One build at a time (parallel test runs share the cache).
exec 9>"$CACHE/build.lock"
flock 9

if [[ ! -x $BIN ]]; then
  log "building $NAME ($(go version | cut -d' ' -f3)) into $BIN"
  mkdir -p "$CACHE/$hash"
  (cd "$HERE" && go build -mod=readonly -o "$BIN.tmp" .) || die "go build failed"
  mv -f "$BIN.tmp" "$BIN"
fi
echo "$BIN"
