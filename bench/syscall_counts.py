"""System calls per serial append of each replica, trees compared: `bench/syscall_counts.py`.

    .venv/bin/python bench/syscall_counts.py --count 300 /path/to/before /path/to/after

For each tree (a repository root, its `replica_image` first on PYTHONPATH for the replicas
and the bench client), start a fresh 3-replica `DevCluster` (default engine, data on the
real disk), run 20 serial appends untimed, then attach `strace -c -f` to every replica
(all threads) while `rlog bench --mode serial` appends `--count` values of 1 KiB one at a
time, and print, per replica (leader first), the calls per append of each system call,
the largest first. Counts do not move with the machine's load the way latencies do: a
sync, a write or a wake-up more per append shows as a whole number more here. A replica's
timers (heartbeats, leases) add calls per second, not per append: they show as fractions
that grow when a run is slower, `--idle` seconds of an idle log measure them.

strace slows every call it sees: time nothing with it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from machine import load  # noqa: E402

from rlog.tools.dev import DevCluster  # noqa: E402

# `strace -c` summary rows: % time, seconds, usecs/call, calls, [errors], syscall.
ROW = re.compile(r"^\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(?:\d+\s+)?(\w+)\s*$")


def parse_summary(text: str) -> dict[str, int]:
    """Calls by system call name from an `strace -c` summary."""
    calls = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match and match.group(2) != "total":
            calls[match.group(2)] = int(match.group(1))
    return calls


def traced(pids: list[int], out: Path, run: list[str], env: dict[str, str]) -> list[dict[str, int]]:
    """Run `run` with every pid traced (`strace -c -f`); the calls of each pid meanwhile."""
    tracers = []
    for i, pid in enumerate(pids):
        command = ["strace", "-c", "-f", "-o", str(out / f"strace.{i}"), "-p", str(pid)]
        tracers.append(subprocess.Popen(command, stderr=subprocess.DEVNULL))
    time.sleep(1.0)  # strace attaches every thread before the run starts
    try:
        if run:
            subprocess.run(run, check=True, capture_output=True, env=env, timeout=900)
    finally:
        for tracer in tracers:
            tracer.send_signal(signal.SIGINT)
        for tracer in tracers:
            tracer.wait(timeout=60)
    return [parse_summary((out / f"strace.{i}").read_text()) for i in range(len(pids))]


def measure(tree: Path, count: int, idle: float, workdir: Path) -> dict[str, object]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree / "replica_image"), *filter(None, [env.get("PYTHONPATH")])]
    )
    directory = workdir / tree.name
    with DevCluster(3, directory, env=env) as cluster:
        leader = cluster.wait_for_leader()
        order = [leader, *(i for i in range(3) if i != leader)]
        pids = [cluster.pid(i) or 0 for i in order]
        bench = [sys.executable, "-m", "rlog.tools.cli", "bench", "-e", cluster.endpoints[leader]]
        bench += ["--mode", "serial", "--size", "1024", "--warmup", "0", "--json"]
        subprocess.run([*bench, "--count", "20"], check=True, capture_output=True, env=env)
        load_at = load()
        started = time.monotonic()
        busy = traced(pids, directory, [*bench, "--count", str(count)], env)
        seconds = time.monotonic() - started
        quiet: list[dict[str, int]] = []
        if idle:
            quiet = traced(pids, directory, ["sleep", str(idle)], env)
    roles = ["leader", "follower", "follower"]
    return {
        "tree": str(tree),
        "load": load_at,
        "seconds": round(seconds, 1),
        "replicas": [
            {
                "role": role,
                "per_append": {k: round(v / count, 2) for k, v in sorted(c.items())},
                "idle_per_s": {k: round(v / idle, 1) for k, v in q.items()} if idle else {},
            }
            for role, c, q in zip(roles, busy, quiet or [{}] * 3, strict=True)
        ],
    }


def show(result: dict[str, object], top: int) -> None:
    print(f"{result['tree']} (load {result['load']}, {result['seconds']} s):", file=sys.stderr)
    for replica in result["replicas"]:  # type: ignore[attr-defined]
        calls = replica["per_append"]
        total = sum(calls.values())
        largest = sorted(calls.items(), key=lambda kv: -kv[1])[:top]
        cells = ", ".join(f"{name} {n:g}" for name, n in largest)
        print(f"  {replica['role']}: {total:.1f} calls/append: {cells}", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--count", type=int, default=300, help="serial appends traced")
    parser.add_argument("--idle", type=float, default=0.0, help="seconds of idle log traced")
    parser.add_argument("--top", type=int, default=12, help="system calls shown per replica")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlog-syscalls-", dir=Path.home() / ".cache") as d:
        for tree in args.trees:
            result = measure(tree.resolve(), args.count, args.idle, Path(d))
            print(json.dumps(result), flush=True)
            show(result, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
