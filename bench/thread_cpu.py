"""Replica CPU per appended entry by thread, trees compared: `bench/thread_cpu.py`.

    .venv/bin/python bench/thread_cpu.py [--mode serial] [--count 1500] [--seconds 10]
        [--rounds 2] [--tls] BEFORE AFTER

For each round and tree (a repository root: its `replica_image` first on PYTHONPATH for the
replicas and the bench client), starts a fresh 3-replica `DevCluster`, runs `rlog bench`
in one of `bench/ab.py`'s modes against the leader (serial: `--count` values of 1 KiB after
20 untimed; stream64, batched...: `--seconds` of them) and prints the CPU time per entry of
the three replicas together, by thread: `main` (the event loop),
the others by their name (gRPC's `event_engine`, `python` for the threads Python starts:
storage, fsync), read from /proc/PID/task before and after. Trees alternate within a round.
Says where a difference in `bench/ab.py`'s replica CPU per entry is, and whether it holds at
a lower load; CPU time still moves with the machine's load: compare rounds run close together.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import harness
from ab import mode_args

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from rlog.tools.dev import DevCluster  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def per_thread(pid: int) -> collections.Counter[str]:
    """CPU seconds so far of each of the process's threads, summed by name."""
    seconds: collections.Counter[str] = collections.Counter()
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            name = Path(f"/proc/{pid}/task/{task}/comm").read_text().strip()
            fields = Path(f"/proc/{pid}/task/{task}/stat").read_text().rsplit(")", 1)[1].split()
        except FileNotFoundError:  # the thread ended
            continue
        key = "main" if task == str(pid) else name.rstrip("0123456789_-")
        seconds[key] += (int(fields[11]) + int(fields[12])) / TICKS
    return seconds


def measure(
    tree: Path, mode: str, count: int, seconds: float, tls: bool, workdir: Path
) -> dict[str, float]:
    env = harness.tree_env(tree)
    with DevCluster(3, workdir / tree.name, env=env, tls=tls) as cluster:
        leader = cluster.wait_for_leader()
        bench = [sys.executable, "-m", "rlog.tools.cli", "bench", "-e", cluster.endpoints[leader]]
        bench += ["--json", *mode_args(mode, count, seconds)]
        if tls:
            pki = cluster.tls_dir
            bench += ["--ca", str(pki / "ca.pem"), "--cert", str(pki / "admin.pem")]
            bench += ["--key", str(pki / "admin-key.pem")]
        pids = [cluster.pid(i) or 0 for i in range(3)]
        before = [per_thread(pid) for pid in pids]
        done = subprocess.run(bench, check=True, capture_output=True, env=env, timeout=900)
        after = [per_thread(pid) for pid in pids]
    entries = json.loads(done.stdout.decode().strip().splitlines()[-1]).get("entries", count)
    used: collections.Counter[str] = collections.Counter()
    for old, new in zip(before, after, strict=True):
        for name, seconds in new.items():
            used[name] += seconds - old.get(name, 0)
    return {name: round(s / entries * 1e6, 1) for name, s in sorted(used.items()) if s > 0}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--mode", default="serial", help="a mode of bench/ab.py")
    parser.add_argument("--count", type=int, default=1500, help="serial appends")
    parser.add_argument("--seconds", type=float, default=10.0, help="other modes' length")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tls", action="store_true", help="mutual TLS and roles")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlog-thread-cpu-") as d:
        for _ in range(args.rounds):
            for tree in args.trees:
                load = os.getloadavg()[0]
                used = measure(
                    tree.resolve(), args.mode, args.count, args.seconds, args.tls, Path(d)
                )
                row = {"tree": str(tree), "mode": args.mode, "load": round(load, 2), "us": used}
                print(json.dumps(row))
                cells = ", ".join(f"{k} {v}" for k, v in used.items())
                print(f"{tree} (load {load:.1f}): µs per entry: {cells}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
