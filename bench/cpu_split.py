"""Where a batched append's CPU goes, process by process: user and system time per entry of
each replica of a fresh 3-replica `rlog dev` log and of the `rlog bench` client.

    .venv/bin/python bench/cpu_split.py [--size 4096] [--seconds 6] [--writers 8] [--batch 64]
                                        [--lane]

It runs `rlog bench --mode concurrent` once against the leader and reads each replica's
utime and stime from /proc before and after, the client's from getrusage(RUSAGE_CHILDREN)
(its interpreter start included). `--lane` runs the shape `make bench` measures: the
replicas' write lanes and the client's append lane. The sum over the processes against the
machine's cores says whether a figure is CPU-bound here; system time against user time says
whether the kernel's write path or rlog's Python is the larger part (docs/performance.md,
"What the host does to disk-bound figures"). The log is fresh: its writes land on whatever
file space the file system hands out, see the same section before comparing runs.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
from pathlib import Path

from harness import add_batched_arguments, run_batched
from machine import cpu_split, load

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from rlog.tools.dev import DevCluster  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_batched_arguments(parser, size=4096, seconds=6.0)
    parser.add_argument("--dir", help="cluster dir (default: a new one under ~/.cache)")
    parser.add_argument(
        "--lane", action="store_true", help="write lanes and the client's append lane"
    )
    args = parser.parse_args()
    base = Path.home() / ".cache/rlog-bench"
    base.mkdir(parents=True, exist_ok=True)
    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="cpu-split-", dir=base))
    shutil.rmtree(root, ignore_errors=True)
    try:
        with DevCluster(3, root, write_lane_offset=1 if args.lane else 0) as cluster:
            leader = cluster.wait_for_leader()
            pids = {i: cluster.pid(i) for i in range(cluster.replicas)}
            before = {i: cpu_split(pid) for i, pid in pids.items() if pid is not None}
            client_before = resource.getrusage(resource.RUSAGE_CHILDREN)
            started_load = load()
            lane = ["--lane"] if args.lane else ["--no-lane"]
            result = run_batched(cluster.endpoints[leader], args, lane)
            client_after = resource.getrusage(resource.RUSAGE_CHILDREN)
            after = {i: cpu_split(pid) for i, pid in pids.items() if pid is not None}
    finally:
        shutil.rmtree(root, ignore_errors=True)
    entries = result["entries_per_s"] * result["seconds"]

    def per_entry(seconds: float) -> float:
        return round(seconds / entries * 1e6, 1)

    processes = {
        f"replica {i}{' (leader)' if i == leader else ''}": {
            "user_us": per_entry(after[i][0] - before[i][0]),
            "system_us": per_entry(after[i][1] - before[i][1]),
        }
        for i in before
    }
    processes["client"] = {
        "user_us": per_entry(client_after.ru_utime - client_before.ru_utime),
        "system_us": per_entry(client_after.ru_stime - client_before.ru_stime),
    }
    total = sum(p["user_us"] + p["system_us"] for p in processes.values())
    record = {
        "size": args.size,
        "writers": args.writers,
        "batch": args.batch,
        "lane": args.lane,
        "entries_per_s": round(result["entries_per_s"]),
        "mb_per_s": round(result["mb_per_s"], 1),
        "p50_ms": result["latency_ms"]["p50"],
        "load": started_load,
        "cpu_us_per_entry": processes,
        # cores kept busy by these processes at the measured rate
        "cores_busy": round(total * result["entries_per_s"] / 1e6, 2),
    }
    for name, split in processes.items():
        print(
            f"{name:20s} user {split['user_us']:6.1f}  system {split['system_us']:6.1f} µs/entry",
            file=sys.stderr,
        )
    print(
        f"{record['entries_per_s']:,} entries/s, {record['mb_per_s']} MB/s, p50 "
        f"{record['p50_ms']} ms; {record['cores_busy']} cores busy (load {started_load})",
        file=sys.stderr,
    )
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
