#!/bin/bash
# Interleaved A/B of catch-up: bench/catchup.py (this tree's harness) against the replica code
# of two source trees, alternating, PAIRS pairs; one JSON line per run, prefixed "old|new N load".
#   git archive <old commit> | tar -x -C /tmp/old    # a tree of the old code
#   bench/catchup_ab.sh /tmp/old . 50 3
set -euo pipefail
OLD=$(cd "$1" && pwd); NEW=$(cd "$2" && pwd); MB=${3:-50}; PAIRS=${4:-3}
HERE=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${BENCH_PYTHON:-$HERE/.venv/bin/python}
for i in $(seq 1 "$PAIRS"); do
  for side in old new; do
    tree=$OLD; [ "$side" = new ] && tree=$NEW
    echo -n "$side $i $(cut -d' ' -f1 /proc/loadavg) "
    PYTHONPATH=$tree/replica_image:$tree/operator:$tree "$PYTHON" "$HERE/bench/catchup.py" \
      --megabytes "$MB" --dir "${BENCH_DIR:-$HOME/.cache/rlog-bench}/catchup-ab" | tail -1
  done
done
