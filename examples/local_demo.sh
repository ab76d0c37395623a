#!/usr/bin/env bash
# The demo until the operator lands: a local 3-replica log run by `rlog dev` (real replica
# processes on loopback), a few appends and reads through the CLI, then every replica's
# status. Usage: examples/local_demo.sh [path/to/rlog]
set -euo pipefail
RLOG=${1:-rlog}
dir=$(mktemp -d "${TMPDIR:-/tmp}/rlog-demo.XXXXXX")
out="$dir/dev.out"
"$RLOG" dev --replicas 3 --dir "$dir/log" >"$out" 2>&1 &
dev=$!
trap 'kill -TERM $dev 2>/dev/null; wait $dev 2>/dev/null; rm -rf "$dir"' EXIT

for _ in $(seq 300); do
  grep -q '^leader:' "$out" && break
  kill -0 $dev 2>/dev/null || { cat "$out"; echo "rlog dev exited" >&2; exit 1; }
  sleep 0.1
done
grep -q '^leader:' "$out" || { cat "$out"; echo "no leader after 30 s" >&2; exit 1; }
cat "$out"
endpoints=$(sed -n 's/^replica [0-9]*: \([^ ]*\).*/\1/p' "$out" | paste -sd, -)
first=${endpoints%%,*}

echo
echo "\$ rlog append --endpoint $first 'hello' 'replicated' 'log'"
"$RLOG" append --endpoint "$first" hello replicated log
echo "\$ seq 1 5 | sed 's/^/entry-/' | rlog append --endpoint $first --stdin"
seq 1 5 | sed 's/^/entry-/' | "$RLOG" append --endpoint "$first" --stdin
echo "\$ rlog read --endpoint $first"
"$RLOG" read --endpoint "$first"
echo "\$ rlog read --endpoint $first --from 2 --to 3 --json"
"$RLOG" read --endpoint "$first" --from 2 --to 3 --json
echo "\$ rlog status --endpoint $endpoints --all"
"$RLOG" status --endpoint "$endpoints" --all
