#!/usr/bin/env bash
# A/B of the admission work (conditional and exactly-once appends): the same `rlog bench`
# modes against two 3-replica `rlog dev` logs, one running the checkout BEFORE (a path to a
# checkout of the base branch) and one this checkout, interleaved round by round so that a
# machine loaded by other jobs weighs on both alike. This checkout is measured twice: with
# client sessions (the default: every append deduplicated) and with --no-exactly-once.
#   bench/admission_ab.sh BEFORE_CHECKOUT [ROUNDS] [SECONDS]
# Prints one JSON line per run: {"variant", "mode", "round", "result"}.
set -euo pipefail
cd "$(dirname "$0")/.."
before=$(cd "$1" && pwd)
rounds=${2:-2}
seconds=${3:-8}
after=$(pwd)
py=${BENCH_PYTHON:-/work/main/.venv/bin/python}
work=${BENCH_DIR:-$HOME/.cache/rlog-bench}/admission-ab
rm -rf "$work"
mkdir -p "$work"

start_log() {  # name checkout (in this shell: `rlog dev` stops when its parent exits)
  local name=$1 checkout=$2
  PYTHONPATH=$checkout/replica_image "$py" -m rlog.tools.cli dev --replicas 3 \
    --dir "$work/$name" >"$work/$name.out" 2>&1 &
  echo $! >"$work/$name.pid"
}
leader_of() {  # name -> the leader's address `rlog dev` printed
  for _ in $(seq 600); do grep -q "^leader:" "$work/$1.out" && break; sleep 0.1; done
  sed -n 's/^leader: replica [0-9]* (\(.*\))$/\1/p' "$work/$1.out"
}
stop_logs() {
  for pid in "$work"/*.pid; do kill -TERM "$(cat "$pid")" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap stop_logs EXIT
start_log before "$before"
start_log after "$after"
leader_before=$(leader_of before)
leader_after=$(leader_of after)
[ -n "$leader_before" ] && [ -n "$leader_after" ] || { cat "$work"/*.out >&2; exit 1; }

run() {  # variant checkout leader mode round args...
  local variant=$1 checkout=$2 leader=$3 mode=$4 round=$5
  shift 5
  echo "== $(date -u +%H:%M:%S) $variant $mode round $round" >&2
  PYTHONPATH=$checkout/replica_image "$py" -m rlog.tools.cli bench --endpoint "$leader" \
    --json --size 1024 "$@" \
    | sed "s/^/{\"variant\": \"$variant\", \"mode\": \"$mode\", \"round\": $round, \"result\": /; s/\$/}/"
}
for round in $(seq "$rounds"); do
  for mode in serial concurrent-unary concurrent-stream batched-64; do
    case $mode in
      serial) args=(--mode serial --count 500 --warmup 20) ;;
      concurrent-unary) args=(--mode concurrent --concurrency 64 --duration "$seconds") ;;
      concurrent-stream) args=(--mode concurrent --concurrency 64 --duration "$seconds" --stream) ;;
      batched-64) args=(--mode concurrent --concurrency 8 --batch 64 --duration "$seconds") ;;
    esac
    run before "$before" "$leader_before" "$mode" "$round" "${args[@]}"
    run after "$after" "$leader_after" "$mode" "$round" "${args[@]}"
    run after-no-sessions "$after" "$leader_after" "$mode" "$round" "${args[@]}" --no-exactly-once
  done
done
