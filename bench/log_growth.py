"""Batched appends on one log as it grows, then after a truncation: `bench/log_growth.py`.

    .venv/bin/python bench/log_growth.py [--runs 8] [--truncate-after 5] [--seconds 6]
                                         [--size 1024] [--engine auto] [--dir DIR]

One 3-replica `DevCluster` (data on the real disk); `--runs` runs of `rlog bench` (8 writers x
64 values per call) one after the other, each on the log the ones before it left; after
`--truncate-after` runs the log is truncated below what the leader learned, so the runs
after it write into space the engine frees and reuses (LMDB's free pages; the segment
engine's files are unlinked and new ones made). One JSON line per run: entries/s, p50, each
replica's CPU per entry (user + system, /proc) and the leader's data dir size.

On this VM a growing log gets slower and a truncated one fast again, with the same code
and the same engine (docs/performance.md, "What the host does to disk-bound figures").
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from machine import cpu_seconds

from rlog.client import Client
from rlog.storage import AUTO, ENGINE_CHOICES
from rlog.tools.dev import DevCluster


def du_mb(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) >> 20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--truncate-after", type=int, default=5, metavar="N")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default=AUTO,
        help="the replicas' storage engine (default auto: the default engine, on fresh dirs)",
    )
    parser.add_argument("--dir", default=str(Path.home() / ".cache/rlog-bench/log-growth"))
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    with DevCluster(3, root, storage_engine=args.engine) as cluster:
        leader = cluster.wait_for_leader()
        endpoint = cluster.endpoints[leader]
        pids = [cluster.pid(i) for i in range(3)]
        for run in range(args.runs):
            truncated_to = None
            if run == args.truncate_after:
                with Client(endpoint) as client:
                    truncated_to = client.status().learned
                    client.truncate(truncated_to)
            before = [cpu_seconds(pid) if pid else 0.0 for pid in pids]
            command = [sys.executable, "-m", "rlog.tools.cli", "bench", "-e", endpoint, "--json"]
            command += ["--mode", "concurrent", "--concurrency", "8", "--batch", "64"]
            command += ["--size", str(args.size), "--duration", str(args.seconds)]
            command += ["--warmup", "20"]
            out = subprocess.run(command, capture_output=True, text=True, check=True)
            result = json.loads(out.stdout)
            cpu = [
                round((cpu_seconds(pid) - was) / max(result["entries"], 1) * 1e6, 1)
                if pid
                else None
                for pid, was in zip(pids, before, strict=True)
            ]
            row = {
                "run": run,
                "truncated_to": truncated_to,
                "entries_per_s": round(result["entries_per_s"]),
                "p50_ms": result["latency_ms"]["p50"],
                "cpu_us_per_entry": {"leader": cpu[leader], "replicas": cpu},
                "leader_data_mb": du_mb(cluster.data_dir(leader)),
            }
            print(json.dumps(row), flush=True)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
