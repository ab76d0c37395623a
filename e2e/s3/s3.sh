#!/usr/bin/env bash
# A real S3-compatible server for the archive tests: versitygw (an S3 gateway over a POSIX
# directory), built from the Go module proxy at a pinned version into a cache dir, started
# on loopback. Idempotent: the build happens once; `start` on a running server only prints
# its address.
#
#   e2e/s3/s3.sh build                 # -> prints the binary's path
#   e2e/s3/s3.sh start DIR [PORT]      # serve DIR/data on 127.0.0.1:PORT (default: a free
#                                      # port); prints "http://127.0.0.1:PORT" on stdout
#   e2e/s3/s3.sh stop DIR              # stop the server started for DIR
#
# The root credentials are $RLOG_S3_ACCESS_KEY / $RLOG_S3_SECRET_KEY (defaults below, test
# only). Buckets are created by clients (CreateBucket) as directories under DIR/data. Other
# users live in DIR/iam (`versitygw admin create-user` on the same port; their rights come
# from bucket policies: tests/s3server.py).
set -euo pipefail

VERSION=${RLOG_VERSITYGW_VERSION:-v1.8.0}
CACHE=${RLOG_S3_CACHE:-$HOME/.cache/rlog-s3}
BIN=$CACHE/versitygw-$VERSION/bin/versitygw
ACCESS=${RLOG_S3_ACCESS_KEY:-rlogtest}
SECRET=${RLOG_S3_SECRET_KEY:-rlogtestsecret}

export GOFLAGS=${GOFLAGS:--buildvcs=false}
export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
export PATH=$PATH:/usr/local/go/bin  # where the Go tarball installs, if not on PATH

log() { printf '[%s] s3.sh: %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

build() {
  if [[ -x $BIN ]]; then echo "$BIN"; return; fi
  command -v go >/dev/null || die "Go is needed to build versitygw $VERSION (not on PATH)"
  mkdir -p "$CACHE"
  # One build at a time (parallel test runs share the cache): the loser finds it cached.
  exec 9>"$CACHE/build.lock"
  flock 9
  if [[ -x $BIN ]]; then echo "$BIN"; return; fi
  local t=$SECONDS logf=$CACHE/build-$VERSION.log
  log "versitygw $VERSION: building ($(go version | cut -d' ' -f3)) into $BIN"
  mkdir -p "$(dirname "$BIN")"
  GOFLAGS="$GOFLAGS -mod=mod" GOBIN=$(dirname "$BIN") CGO_ENABLED=0 \
    go install -trimpath -ldflags "-s -w" "github.com/versity/versitygw/cmd/versitygw@$VERSION" \
    >"$logf" 2>&1 || { tail -20 "$logf" >&2; die "versitygw build failed (log: $logf)"; }
  log "versitygw $VERSION: built in $((SECONDS - t))s"
  echo "$BIN"
}

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

running() { # DIR -> true if the server started for DIR is alive
  local pidf=$1/versitygw.pid
  [[ -f $pidf ]] && kill -0 "$(cat "$pidf")" 2>/dev/null
}

start() {
  local dir=${1:?usage: s3.sh start DIR [PORT]} port=${2:-}
  build >/dev/null
  mkdir -p "$dir/data" "$dir/iam"
  dir=$(cd "$dir" && pwd)
  if running "$dir"; then cat "$dir/endpoint"; return; fi
  [[ -n $port ]] || port=$(free_port)
  # --nometa would drop object metadata; the posix backend keeps it in xattrs, which the
  # filesystem must support (ext4, xfs, tmpfs on current kernels do).
  ROOT_ACCESS_KEY=$ACCESS ROOT_SECRET_KEY=$SECRET \
    setsid "$BIN" --port "127.0.0.1:$port" --iam-dir "$dir/iam" --iam-cache-disable \
    posix "$dir/data" >"$dir/versitygw.log" 2>&1 &
  echo $! >"$dir/versitygw.pid"
  local endpoint=http://127.0.0.1:$port
  for _ in $(seq 100); do
    if ! running "$dir"; then tail -20 "$dir/versitygw.log" >&2; die "versitygw exited"; fi
    if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$endpoint" >"$dir/endpoint"
      log "versitygw serving $dir/data at $endpoint (pid $(cat "$dir/versitygw.pid"))"
      echo "$endpoint"
      return
    fi
    sleep 0.1
  done
  die "versitygw did not listen on 127.0.0.1:$port within 10 s (log: $dir/versitygw.log)"
}

stop() {
  local dir=${1:?usage: s3.sh stop DIR}
  if running "$dir"; then
    local pid; pid=$(cat "$dir/versitygw.pid")
    kill "$pid"
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    log "versitygw stopped (pid $pid)"
  fi
  rm -f "$dir/versitygw.pid" "$dir/endpoint"
}

case ${1:-} in
  build) build ;;
  start) shift; start "$@" ;;
  stop) shift; stop "$@" ;;
  *) die "usage: s3.sh build | start DIR [PORT] | stop DIR" ;;
esac
