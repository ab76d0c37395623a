"""Python function calls per serial append on each replica's event loop, trees compared:
`bench/call_counts.py`.

    .venv/bin/python bench/call_counts.py --count 500 /path/to/before /path/to/after

For each tree (a repository root: its `replica_image` first on PYTHONPATH), starts a
3-replica log whose replicas run this file first (`--as-replica`): it turns cProfile on in
the replica's main thread (the event loop: rlog's rules and drivers, gRPC's Python side).
Then it appends `--count` values of 1 KiB one at a time (after as many untimed), and prints,
per replica (leader first), the calls per append in the window (less what the replica's
timers call in as long a time, measured over `--idle` seconds of the idle log after it), and
the functions whose calls per append differ most between the first tree and each later
one. A call count does not move with the machine's load: a function more per append is
work more per append, where CPU seconds on a shared machine hardly tell 5% from noise.
(The storage thread is not profiled: `bench/syscall_counts.py` counts its system calls.)

cProfile slows every call: time nothing with it.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve().parents[1]
if "--as-replica" not in sys.argv[1:2]:  # a replica takes rlog from its PYTHONPATH
    sys.path.insert(0, str(HERE / "replica_image"))

COUNTS_ENV = "RLOG_CALL_COUNTS"  # where a profiled replica writes its counts on SIGUSR1


def _label(code: Any) -> str:
    if isinstance(code, str):  # a builtin: "<built-in method ...>", its address left out
        return re.sub(r" at 0x[0-9a-f]+", "", code)
    path = Path(code.co_filename)
    parts = path.parts
    where = "/".join(parts[parts.index("rlog") :]) if "rlog" in parts else path.name
    return f"{where}:{code.co_name}"


def install_profiler() -> None:
    profiler = cProfile.Profile()
    path = os.environ[COUNTS_ENV]

    def dump(*_: object) -> None:
        counts: dict[str, int] = {}
        for entry in profiler.getstats():
            label = _label(entry.code)
            counts[label] = counts.get(label, 0) + entry.callcount
        Path(path).write_text(json.dumps(counts))

    signal.signal(signal.SIGUSR1, dump)
    profiler.enable()


def as_replica(argv: list[str]) -> int:
    install_profiler()
    from rlog.tools.cli import main as rlog_main

    return rlog_main(argv)


def snapshot(cluster: Any, base: Path) -> dict[int, dict[str, int]]:
    """Every replica's call counts so far."""
    for i in range(3):
        (base / f"counts-{i}.json").unlink(missing_ok=True)
        pid = cluster.pid(i)
        if pid is not None:
            os.kill(pid, signal.SIGUSR1)
    counts: dict[int, dict[str, int]] = {}
    deadline = time.monotonic() + 20
    for i in range(3):
        path = base / f"counts-{i}.json"
        while time.monotonic() < deadline:
            try:
                counts[i] = json.loads(path.read_text())
                break
            except (FileNotFoundError, json.JSONDecodeError):  # not yet, or half written
                time.sleep(0.05)
    return counts


def measure(tree: Path, count: int, idle: float, base: Path) -> list[dict[str, float]]:
    """Calls per append of each replica, leader first."""
    from rlog import event_loop
    from rlog.client import AsyncClient

    env = harness.tree_env(tree)

    def env_of(i: int) -> dict[str, str]:
        return {**env, COUNTS_ENV: str(base / f"counts-{i}.json")}

    async def append(endpoint: str) -> None:
        value = os.urandom(1024)
        async with AsyncClient(endpoint, timeout=10) as client:
            for _ in range(count):
                await client.append([value])

    with harness.wrapped_cluster(__file__, base / tree.name, env_of) as cluster:
        leader = cluster.wait_for_leader()
        event_loop.run(append(cluster.endpoints[leader]))  # warm: sessions, streams
        before = snapshot(cluster, base)
        started = time.monotonic()
        event_loop.run(append(cluster.endpoints[leader]))
        seconds = time.monotonic() - started
        after = snapshot(cluster, base)
        time.sleep(idle)
        quiet = snapshot(cluster, base) if idle else after
    order = [leader, *(i for i in range(3) if i != leader)]
    calls = []
    for i in order:
        per_append = {}
        for name, n in after[i].items():
            n -= before[i].get(name, 0)
            if idle:  # the timers' share of the window: as many calls per second as idle
                n -= (quiet[i].get(name, 0) - after[i].get(name, 0)) / idle * seconds
            if abs(n) >= count / 100:
                per_append[name] = n / count
        calls.append(per_append)
    return calls


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--as-replica":
        return as_replica(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--count", type=int, default=500, help="appends")
    parser.add_argument(
        "--idle", type=float, default=5.0, help="seconds of idle log: the timers' calls per s"
    )
    parser.add_argument("--top", type=int, default=15, help="differences shown per replica")
    args = parser.parse_args()
    roles = ["leader", "follower", "follower"]
    results = []
    with tempfile.TemporaryDirectory(prefix="rlog-call-counts-") as d:
        for tree in args.trees:
            calls = measure(tree.resolve(), args.count, args.idle, Path(d))
            results.append(calls)
            print(json.dumps({"tree": str(tree), "replicas": calls}), flush=True)
            totals = ", ".join(
                f"{role} {sum(c.values()):.0f}" for role, c in zip(roles, calls, strict=True)
            )
            print(f"{tree}: calls per append: {totals}", file=sys.stderr)
    for tree, calls in zip(args.trees[1:], results[1:], strict=True):
        print(f"{tree} - {args.trees[0]}, calls per append:", file=sys.stderr)
        for role, new, old in zip(roles, calls, results[0], strict=True):
            diff = {k: new.get(k, 0) - old.get(k, 0) for k in {*new, *old}}
            largest = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[: args.top]
            print(f"  {role}: {sum(diff.values()):+.1f}", file=sys.stderr)
            for name, n in largest:
                print(f"    {n:+7.2f}  {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
