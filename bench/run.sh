#!/usr/bin/env bash
# `make bench`: rlog next to etcd 3.4 in one go (bench/kit.py), one results file
# bench/results/bench-<date>.jsonl with every figure of bench/targets.json, a summary
# bench/results/bench-<date>.md, and the plots redrawn into bench/plots/ (bench/plots.py).
# About 10 minutes on a 2-core machine; BENCH_QUICK=1 about 3. Variables (docs/performance.md):
#   BENCH_QUICK=1          3 s runs, 300 serial appends, 20 MB catch-up, no Spark
#   BENCH_SECONDS          each timed run (default 8, quick 3)
#   BENCH_SERIAL           serial appends/puts (default 1000, quick 300)
#   BENCH_WRITERS          writer counts of the concurrency sweep (default 1,4,16,64)
#   BENCH_SIZES            value sizes of the MB/s sweep (default 128,1024,4096,16384)
#   BENCH_CATCHUP_MB       log size of the catch-up run (default 200, quick 20)
#   BENCH_ETCD=0           rlog only (default: etcd 3.4 too; installs etcd-server if missing)
#   BENCH_FIVE=0           skip the 5-replica runs
#   BENCH_SPARK=0|1        Spark source and sink (default: on when pyspark is installed,
#                          off in quick mode); BENCH_SPARK_ROWS (1000000) rows into noop,
#                          BENCH_SPARK_SINK_ROWS (200000) through the sink
#   BENCH_STORAGE=1        also the storage engines (bench/storage_engines.py)
#   BENCH_PLOTS=0          do not redraw bench/plots/
#   BENCH_DIR              work dirs (default ~/.cache/rlog-bench; never tmpfs: fsync is free)
#   BENCH_PYTHON           the interpreter (`make bench` passes the venv's)
#   BENCH_VOLUME           what BENCH_DIR is on, for the summary (bench/slow_disk.sh sets it)
set -euo pipefail
cd "$(dirname "$0")/.."

py=${BENCH_PYTHON:-.venv/bin/python}
work=${BENCH_DIR:-$HOME/.cache/rlog-bench}
out=bench/results/bench-$(date -u +%Y%m%d-%H%M).jsonl
args=(--out "$out" --work "$work/kit" --python "$py")
[ "${BENCH_QUICK:-0}" = 1 ] && args+=(--quick)
[ -n "${BENCH_SECONDS:-}" ] && args+=(--seconds "$BENCH_SECONDS")
[ -n "${BENCH_SERIAL:-}" ] && args+=(--serial "$BENCH_SERIAL")
[ -n "${BENCH_WRITERS:-}" ] && args+=(--writers "$BENCH_WRITERS")
[ -n "${BENCH_SIZES:-}" ] && args+=(--sizes "$BENCH_SIZES")
[ -n "${BENCH_CATCHUP_MB:-}" ] && args+=(--catchup-mb "$BENCH_CATCHUP_MB")
[ "${BENCH_ETCD:-1}" = 0 ] && args+=(--no-etcd)
[ "${BENCH_FIVE:-1}" = 0 ] && args+=(--no-five)
[ "${BENCH_SPARK:-}" = 1 ] && args+=(--spark)
[ "${BENCH_SPARK:-}" = 0 ] && args+=(--no-spark)
[ -n "${BENCH_SPARK_ROWS:-}" ] && args+=(--spark-rows "$BENCH_SPARK_ROWS")
[ -n "${BENCH_SPARK_SINK_ROWS:-}" ] && args+=(--spark-sink-rows "$BENCH_SPARK_SINK_ROWS")
[ -n "${BENCH_VOLUME:-}" ] && args+=(--volume "$BENCH_VOLUME")

"$py" bench/kit.py "${args[@]}"
if [ "${BENCH_STORAGE:-0}" = 1 ]; then
  echo "== storage engines -> ${out%.jsonl}-storage.md" >&2
  "$py" bench/storage_engines.py --dir "$work/storage" --seconds "${BENCH_STORAGE_SECONDS:-1}" \
    >"${out%.jsonl}-storage.md"
fi
if [ "${BENCH_PLOTS:-1}" = 1 ]; then
  "$py" bench/plots.py "$out"
fi
