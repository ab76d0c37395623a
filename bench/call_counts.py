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

`--stream N` drives the stream load instead (`rlog bench --mode concurrent --concurrency N
--batch 1 --stream`): N writers of single-entry appends on one client's AppendStream, which
coalesces the appends queued while it is busy into one request. How many entries a request
carries depends on timing, so this mode prints the calls per entry and per request (the
client's count of requests sent): work per request (a message's checks, its deserializer,
its budget reservation) shows in the second, work per entry in the first. `--tls` runs the
log with mutual TLS and roles (`DevCluster(tls=True)`, the client as admin), where the
peer and caller checks act.

cProfile slows every call: time nothing with it.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve().parents[1]
if sys.argv[1:2] not in (["--as-replica"], ["--as-client"]):  # those take the tree's rlog
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
        # Not profiled: its own calls (a label per function seen) would land in the next
        # window, more of them the more functions a tree has.
        profiler.disable()
        counts: dict[str, int] = {}
        for entry in profiler.getstats():
            label = _label(entry.code)
            counts[label] = counts.get(label, 0) + entry.callcount
        Path(path).write_text(json.dumps(counts))
        profiler.enable()

    signal.signal(signal.SIGUSR1, dump)
    profiler.enable()


def as_replica(argv: list[str]) -> int:
    install_profiler()
    from rlog.tools.cli import main as rlog_main

    return rlog_main(argv)


def as_client(argv: list[str]) -> int:
    """Append argv's count of values with argv's writers (0: serial, unary) to the endpoint,
    with the tree's client (a client of another build may not speak its protocol, e.g. its
    session secrets); print the requests it sent."""
    from rlog import event_loop
    from rlog.client import AsyncClient
    from rlog.client.security import Credentials

    endpoint, count, writers, tls_dir = argv[0], int(argv[1]), int(argv[2]), argv[3]
    credentials = None
    if tls_dir:
        pki = Path(tls_dir)
        credentials = Credentials.from_files(
            pki / "ca.pem", pki / "admin.pem", pki / "admin-key.pem"
        )

    async def append() -> int:
        value = os.urandom(1024)
        async with AsyncClient(
            endpoint, timeout=10, stream=writers > 0, credentials=credentials
        ) as client:
            if not writers:
                for _ in range(count):
                    await client.append([value])
                return count

            async def writer(n: int) -> None:
                for _ in range(n):
                    await client.append([value])

            share = [count // writers + (w < count % writers) for w in range(writers)]
            await asyncio.gather(*(writer(n) for n in share))
            return client.append_requests

    print(event_loop.run(append()))
    return 0


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


def measure(
    tree: Path, count: int, idle: float, base: Path, writers: int = 0, tls: bool = False
) -> tuple[list[dict[str, float]], int]:
    """Calls per append (per entry with `writers`) of each replica, leader first, and the
    requests the client sent in the window."""
    env = harness.tree_env(tree)

    def env_of(i: int) -> dict[str, str]:
        return {**env, COUNTS_ENV: str(base / f"counts-{i}.json")}

    def append(cluster: Any, endpoint: str) -> int:
        tls_dir = str(cluster.tls_dir) if tls else ""
        command = [sys.executable, __file__, "--as-client", endpoint, str(count)]
        command += [str(writers), tls_dir]
        out = subprocess.run(command, env=env, check=True, capture_output=True, text=True)
        return int(out.stdout.split()[-1])

    with harness.wrapped_cluster(__file__, base / tree.name, env_of, tls=tls) as cluster:
        leader = cluster.wait_for_leader()
        append(cluster, cluster.endpoints[leader])  # warm: connections, sessions, caches
        before = snapshot(cluster, base)
        started = time.monotonic()
        requests = append(cluster, cluster.endpoints[leader])
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
    return calls, requests


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--as-replica":
        return as_replica(sys.argv[2:])
    if len(sys.argv) > 1 and sys.argv[1] == "--as-client":
        return as_client(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trees", nargs="+", type=Path)
    parser.add_argument("--count", type=int, default=500, help="appends")
    parser.add_argument(
        "--idle", type=float, default=5.0, help="seconds of idle log: the timers' calls per s"
    )
    parser.add_argument("--top", type=int, default=15, help="differences shown per replica")
    parser.add_argument(
        "--stream", type=int, default=0, metavar="N", help="N writers on one AppendStream"
    )
    parser.add_argument("--tls", action="store_true", help="mutual TLS and roles")
    args = parser.parse_args()
    roles = ["leader", "follower", "follower"]
    unit = "entry" if args.stream else "append"
    results = []
    with tempfile.TemporaryDirectory(prefix="rlog-call-counts-") as d:
        for tree in args.trees:
            calls, requests = measure(
                tree.resolve(), args.count, args.idle, Path(d), args.stream, args.tls
            )
            results.append(calls)
            row = {"tree": str(tree), "replicas": calls, "requests": requests}
            print(json.dumps(row), flush=True)
            totals = ", ".join(
                f"{role} {sum(c.values()):.0f}" for role, c in zip(roles, calls, strict=True)
            )
            print(f"{tree}: calls per {unit}: {totals}", file=sys.stderr)
            if args.stream:
                per_request = args.count / max(requests, 1)
                totals = ", ".join(
                    f"{role} {sum(c.values()) * per_request:.0f}"
                    for role, c in zip(roles, calls, strict=True)
                )
                print(
                    f"  {requests} requests ({per_request:.1f} entries each): "
                    f"calls per request: {totals}",
                    file=sys.stderr,
                )
    for tree, calls in zip(args.trees[1:], results[1:], strict=True):
        print(f"{tree} - {args.trees[0]}, calls per {unit}:", file=sys.stderr)
        for role, new, old in zip(roles, calls, results[0], strict=True):
            diff = {k: new.get(k, 0) - old.get(k, 0) for k in {*new, *old}}
            largest = sorted(diff.items(), key=lambda kv: -abs(kv[1]))[: args.top]
            print(f"  {role}: {sum(diff.values()):+.1f}", file=sys.stderr)
            for name, n in largest:
                print(f"    {n:+7.2f}  {name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
