#!/usr/bin/env bash
# rlog next to etcd, same machine, same run (before the kit): 3 members/replicas on loopback, data
# on the real disk, 1 KiB entries, Python gRPC clients on both sides.
#   serial:     one writer, one append/put at a time -> p50/p99 latency
#   concurrent: 64 writers, one single-entry append/put in flight each -> acknowledged/s
#               (rlog: to the leader with one unary call per append, and multiplexed on
#               AppendStream; etcd: to the raft leader, its best case)
#   batched:    rlog only, 64 entries per append call, 8 writers -> entries/s
# Usage: bench/rlog_vs_etcd.sh [SECONDS]   (results: bench/results/rlog_vs_etcd-<date>.jsonl)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-15}
py=${RLOG_BENCH_PYTHON:-.venv/bin/python}
rlog="$py -m rlog.tools.cli"
work=${RLOG_BENCH_DIR:-$HOME/.cache/rlog-bench}
mkdir -p "$work" bench/results
out=bench/results/rlog_vs_etcd-$(date +%Y%m%d-%H%M).jsonl
: >"$out"

note() { echo "== $*" >&2; }

note "etcd: 3 members"
bench/etcd_cluster.sh stop "$work/etcd" >/dev/null 2>&1 || true
bench/etcd_cluster.sh start "$work/etcd" >&2
$py bench/etcd_put.py --serial 2000 --concurrency 64 --duration "$seconds" \
  | sed 's/^/{"system": "etcd", "result": /; s/$/}/' >>"$out"
bench/etcd_cluster.sh stop "$work/etcd" >&2

note "rlog: 3 replicas"
rm -rf "$work/rlog"
$rlog dev --replicas 3 --dir "$work/rlog" >"$work/rlog-dev.out" 2>&1 &
dev=$!
trap 'kill -TERM $dev 2>/dev/null; wait $dev 2>/dev/null || true' EXIT
for _ in $(seq 300); do grep -q '^leader:' "$work/rlog-dev.out" && break; sleep 0.1; done
leader=$(sed -n 's/^leader: replica [0-9]* (\(.*\))$/\1/p' "$work/rlog-dev.out")
[ -n "$leader" ] || { cat "$work/rlog-dev.out" >&2; exit 1; }
run() {  # label, rlog bench args...
  local label=$1; shift
  $rlog bench --endpoint "$leader" --json --size 1024 "$@" \
    | sed "s/^/{\"system\": \"rlog\", \"mode\": \"$label\", \"result\": /; s/\$/}/" >>"$out"
}
run serial --mode serial --count 2000 --warmup 50
run concurrent-unary --mode concurrent --concurrency 64 --batch 1 --duration "$seconds"
run concurrent-stream --mode concurrent --concurrency 64 --batch 1 --duration "$seconds" --stream
run batched-64 --mode concurrent --concurrency 8 --batch 64 --duration "$seconds"
note "results in $out"
cat "$out"
