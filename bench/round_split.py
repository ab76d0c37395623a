"""Where a batched append round's time goes: the group commits of each replica (how many,
how long each, how many entries each, how much of the run the disk was syncing) and the
leader's batches, from the replicas' own Prometheus histograms, around one `rlog bench`
batched run on a fresh 3-replica `rlog dev` log with the write lane and the client's lane.

    .venv/bin/python bench/round_split.py [--size 1024] [--seconds 8] [--writers 8]
                                          [--batch 64] [--no-exactly-once]

`rlog_fsync_latency_seconds` times one group commit's write and sync, `rlog_flush_actions`
its entries, `rlog_append_latency_seconds` a leader batch from admission to done and
`rlog_write_batch_entries` its entries. The round a writer sees is its entries in flight
over the rate; what the leader's batch does not account for is the client's side and the
lane (docs/performance.md, "What bounds each figure now").
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from harness import add_batched_arguments, run_batched
from machine import load

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from rlog.tools.dev import DevCluster  # noqa: E402

HISTOGRAMS = (
    "rlog_fsync_latency_seconds",
    "rlog_flush_actions",
    "rlog_append_latency_seconds",
    "rlog_write_batch_entries",
)
SAMPLE = re.compile(r"^(?P<name>[a-z_]+)_(?P<part>sum|count)(?:\{[^}]*\})? (?P<value>\S+)$")


def scrape(port: int) -> dict[str, float]:
    """`<histogram>_sum` and `_count` of HISTOGRAMS from a replica's /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    found: dict[str, float] = {}
    for line in text.splitlines():
        match = SAMPLE.match(line)
        if match and match["name"] in HISTOGRAMS:
            key = f"{match['name']}_{match['part']}"
            found[key] = found.get(key, 0.0) + float(match["value"])
    return found


def mean(sums: dict[str, float], name: str) -> float:
    count = sums.get(f"{name}_count", 0.0)
    return sums.get(f"{name}_sum", 0.0) / count if count else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_batched_arguments(parser, size=1024, seconds=8.0)
    parser.add_argument(
        "--no-exactly-once",
        action="store_true",
        help="the bench client without sessions: each writer's append its own request",
    )
    parser.add_argument(
        "--dir",
        help="the cluster dir, which must not hold a log yet (replica-<i> in it may be links "
        "to other file systems); kept afterwards. Default: a new one under ~/.cache, removed",
    )
    args = parser.parse_args()
    base = Path.home() / ".cache/rlog-bench"
    base.mkdir(parents=True, exist_ok=True)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="round-split-", dir=base))
    try:
        with DevCluster(3, root, metrics=True, write_lane_offset=1) as cluster:
            leader = cluster.wait_for_leader()
            ports = [p for p in cluster.metrics_ports if p is not None]
            extra = ["--lane"] + (["--no-exactly-once"] if args.no_exactly_once else [])
            started_load = load()
            before = [scrape(p) for p in ports]
            started = time.monotonic()
            result = run_batched(cluster.endpoints[leader], args, extra)
            # The histograms cover the warm-up and the client's start too: their share of
            # the time is over this whole window, not the bench's own seconds.
            window = time.monotonic() - started
            after = [scrape(p) for p in ports]
    finally:
        if not args.dir:
            shutil.rmtree(root, ignore_errors=True)
    rate = result["entries_per_s"]
    replicas = {}
    batch_ms = batch_entries = 0.0
    for i, (b, a) in enumerate(zip(before, after, strict=True)):
        delta = {key: a[key] - b.get(key, 0.0) for key in a}
        commits = delta.get("rlog_fsync_latency_seconds_count", 0.0)
        replicas[f"replica {i}{' (leader)' if i == leader else ''}"] = {
            "group_commits": int(commits),
            "commit_ms": round(1000 * mean(delta, "rlog_fsync_latency_seconds"), 2),
            "entries_per_commit": round(mean(delta, "rlog_flush_actions")),
            "syncing_share": round(delta.get("rlog_fsync_latency_seconds_sum", 0.0) / window, 2),
        }
        if i == leader:
            batch_ms = 1000 * mean(delta, "rlog_append_latency_seconds")
            batch_entries = mean(delta, "rlog_write_batch_entries")
    in_flight = args.writers * args.batch
    round_ms = 1000 * in_flight / rate if rate else 0.0
    record = {
        "size": args.size,
        "writers": args.writers,
        "batch": args.batch,
        "exactly_once": not args.no_exactly_once,
        "entries_per_s": round(rate),
        "load": started_load,
        "round_ms": round(round_ms, 2),  # entries in flight over the rate
        "leader_batch_ms": round(batch_ms, 2),
        "leader_batch_entries": round(batch_entries),
        "outside_leader_batch_ms": round(round_ms - batch_ms, 2),
        "replicas": replicas,
    }
    for name, r in replicas.items():
        print(
            f"{name:20s} {r['group_commits']:5d} group commits of {r['commit_ms']:5.2f} ms, "
            f"{r['entries_per_commit']:4d} entries each, syncing {r['syncing_share']:.0%} of "
            "the time",
            file=sys.stderr,
        )
    print(
        f"{rate:,.0f} entries/s; a round {round_ms:.2f} ms, of which the leader's batch "
        f"{batch_ms:.2f} ms ({batch_entries:.0f} entries); load {started_load}",
        file=sys.stderr,
    )
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
