#!/usr/bin/env bash
# make diagrams: each docs/diagrams/<name>.dot drawn to <name>.svg by Graphviz, the SVG
# stamped with the sha256 of its source (tests/test_docs.py fails when a .dot changed and
# its drawing did not). Installs Graphviz from Debian's packages when `dot` is missing.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }
if ! command -v dot >/dev/null; then
  log "installing graphviz (apt)"
  apt-get install -y -q graphviz >/dev/null || die "cannot install graphviz: install it by hand"
fi
for src in "$here"/*.dot; do
  out=${src%.dot}.svg
  sum=$(sha256sum "$src" | cut -d' ' -f1)
  dot -Tsvg "$src" | sed "1a <!-- source: $(basename "$src") sha256 $sum -->" > "$out.tmp"
  mv "$out.tmp" "$out"
  log "$(basename "$out") drawn"
done
