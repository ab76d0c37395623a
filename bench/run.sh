#!/usr/bin/env bash
# `make bench`: the default benchmark set, a few minutes on a 2-core machine. Each step
# writes its raw output under bench/results/bench-<date>/ and a summary.md collects them.
#   1. storage engines: group-commit throughput of every installed engine on the real disk
#      (bench/storage_engines.py, BENCH_STORAGE_SECONDS per cell);
#   2. `rlog bench` against a 3-replica `rlog dev` log (lmdb, data on the real disk): serial
#      (1000 appends, one at a time: latency), concurrent (BENCH_WRITERS writers, one unary call
#      per append), concurrent on one AppendStream, and batched (8 writers x 64 entries per
#      call), each for BENCH_SECONDS;
#   3. catch-up: a wiped follower of a log holding BENCH_CATCHUP_MB of 4 KiB entries,
#      time until it is VOTING again (bench/catchup.py).
# Longer runs, only when asked:
#   BENCH_ETCD=1   rlog next to etcd 3.4 in the same run (bench/rlog_vs_etcd.sh; installs
#                  etcd-server from the distribution if missing);
#   BENCH_SPARK=1  the Spark source and sink (bench/spark_source.py, bench/spark_sink.py)
#                  with BENCH_SPARK_ROWS rows.
# Work dirs go under BENCH_DIR (default ~/.cache/rlog-bench; never tmpfs: fsync is free there).
set -euo pipefail
cd "$(dirname "$0")/.."

py=${BENCH_PYTHON:-.venv/bin/python}
seconds=${BENCH_SECONDS:-10}
storage_seconds=${BENCH_STORAGE_SECONDS:-1}
writers=${BENCH_WRITERS:-64}
catchup_mb=${BENCH_CATCHUP_MB:-50}
spark_rows=${BENCH_SPARK_ROWS:-200000}
work=${BENCH_DIR:-$HOME/.cache/rlog-bench}
out=bench/results/bench-$(date -u +%Y%m%d-%H%M)
mkdir -p "$work" "$out"
rlog=("$py" -m rlog.tools.cli)
started=$(date +%s)

note() { echo "== $(date -u +%H:%M:%S) $*" >&2; }

note "storage engines (${storage_seconds}s per cell) -> $out/storage_engines.md"
"$py" bench/storage_engines.py --dir "$work/storage" --seconds "$storage_seconds" \
  >"$out/storage_engines.md"

note "rlog bench against a 3-replica rlog dev log -> $out/rlog_bench.jsonl"
rm -rf "$work/dev"
"${rlog[@]}" dev --replicas 3 --dir "$work/dev" >"$work/rlog-dev.out" 2>&1 &
dev=$!
stop_dev() { kill -TERM "$dev" 2>/dev/null && wait "$dev" 2>/dev/null || true; }
trap stop_dev EXIT
for _ in $(seq 600); do grep -q "^leader:" "$work/rlog-dev.out" && break; sleep 0.1; done
leader=$(sed -n 's/^leader: replica [0-9]* (\(.*\))$/\1/p' "$work/rlog-dev.out")
[ -n "$leader" ] || { cat "$work/rlog-dev.out" >&2; exit 1; }
: >"$out/rlog_bench.jsonl"
run_bench() {  # label, rlog bench args...
  local label=$1
  shift
  note "  $label"
  "${rlog[@]}" bench --endpoint "$leader" --json --size 1024 "$@" \
    | sed "s/^/{\"mode\": \"$label\", \"result\": /; s/\$/}/" >>"$out/rlog_bench.jsonl"
}
run_bench serial --mode serial --count 1000 --warmup 20
run_bench concurrent-unary --mode concurrent --concurrency "$writers" --duration "$seconds"
run_bench concurrent-stream --mode concurrent --concurrency "$writers" --duration "$seconds" --stream
run_bench batched-64 --mode concurrent --concurrency 8 --batch 64 --duration "$seconds"
stop_dev
trap - EXIT

note "catch-up of a wiped follower (${catchup_mb} MB) -> $out/catchup.json"
"$py" bench/catchup.py --megabytes "$catchup_mb" --dir "$work/catchup" >"$out/catchup.json"

if [ "${BENCH_ETCD:-0}" = 1 ]; then
  note "rlog vs etcd (${seconds}s per concurrent phase)"
  RLOG_BENCH_DIR=$work RLOG_BENCH_PYTHON=$py bench/rlog_vs_etcd.sh "$seconds" 2>&1 \
    | tee "$out/rlog_vs_etcd.out" >&2
fi
if [ "${BENCH_SPARK:-0}" = 1 ]; then
  note "Spark source and sink ($spark_rows rows)"
  "$py" bench/spark_source.py --entries "$spark_rows" --repeat 1 --sink-rows "$spark_rows" \
    --dir "$work/spark-source" >"$out/spark_source.out" 2>&1
  "$py" bench/spark_sink.py --rows "$spark_rows" --in-flight 1,4 --dir "$work/spark-sink" \
    >"$out/spark_sink.out" 2>&1
fi

"$py" - "$out" "$(($(date +%s) - started))" <<'EOF' | tee "$out/summary.md"
import json, os, platform, sys
from pathlib import Path

out, wall = Path(sys.argv[1]), int(sys.argv[2])
load = os.getloadavg()
print(f"# make bench: {out.name}, {platform.node()}, {os.cpu_count()} cpus, "
      f"load {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, wall time {wall // 60}m{wall % 60:02d}s\n")
print("## rlog bench (3 replicas, lmdb, 1 KiB values, to the leader)\n")
print("| mode | appends/s | entries/s | MB/s | p50 ms | p99 ms |")
print("|---|---:|---:|---:|---:|---:|")
for line in (out / "rlog_bench.jsonl").read_text().splitlines():
    row = json.loads(line)
    r, lat = row["result"], row["result"]["latency_ms"]
    print(f"| {row['mode']} | {r['appends_per_s']:,.0f} | {r['entries_per_s']:,.0f} | "
          f"{r['mb_per_s']:.1f} | {lat['p50']:.2f} | {lat['p99']:.2f} |")
c = json.loads((out / "catchup.json").read_text())
print(f"\n## catch-up\n\n{c['entries']:,} entries ({c['megabytes']} MB): filled at "
      f"{c['fill_mb_per_s']} MB/s; a wiped follower was VOTING again after "
      f"{c['catchup_seconds']} s ({c['catchup_mb_per_s']} MB/s)\n")
print("## storage engines (group commit, 1 KiB values)\n")
print((out / "storage_engines.md").read_text().split("\n", 2)[2].strip())
for extra in ("rlog_vs_etcd.out", "spark_source.out", "spark_sink.out"):
    if (out / extra).exists():
        print(f"\n## {extra}: see {out / extra}")
EOF
