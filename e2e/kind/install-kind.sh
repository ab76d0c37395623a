#!/usr/bin/env bash
# kind itself, pinned ($KIND_VERSION), from the Go module proxy into $KIND_CACHE (cached).
source "$(dirname "$0")/lib.sh"
if [[ -x $KIND_BIN ]]; then log "kind $KIND_VERSION: cached"; exit 0; fi
t=$SECONDS; log "kind $KIND_VERSION: building"
mkdir -p "$(dirname "$KIND_BIN")"
GOBIN=$(dirname "$KIND_BIN") CGO_ENABLED=0 \
  go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kind@$KIND_VERSION" > "$KIND_LOGS/kind-build.log" 2>&1 ||
  { tail -20 "$KIND_LOGS/kind-build.log" >&2; die "kind build failed"; }
log "kind $KIND_VERSION: built in $((SECONDS - t))s"
