"""What each replica's event loop runs per append: `bench/loop_counts.py [--count 1000]`.

    .venv/bin/python bench/loop_counts.py --count 1000 [--batch 1] [--tree DIR]

Starts a 3-replica `rlog dev` log whose replicas run this file first (`--as-replica`): it
makes their event loop a subclass of uvloop's that counts, by the callback's or
coroutine's name, every `call_soon`, `call_later`/`call_at`, `call_soon_threadsafe` and
`create_task` (gRPC's own included: its calls and servers schedule through the loop too;
libuv's I/O callbacks are not counted). Then it appends `--count` values of 1 KiB one
append at a time (`--batch` values per append) and prints, per replica, the counts per
append of the window, the largest first, and the unary calls each replica served and made
per append. A loop turn and a task cost CPU on every append; a count that grows with the
appends where none is expected is a place to look (it is how a linger timer that sent
learned ranges on their own was found, docs/performance.md, "What each change bought").

The counting costs CPU of its own: time nothing with it.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve().parents[1]
if "--as-replica" not in sys.argv[1:2]:  # a replica takes rlog from its PYTHONPATH (--tree)
    sys.path.insert(0, str(HERE / "replica_image"))

COUNTS_ENV = "RLOG_LOOP_COUNTS"  # where a counting replica writes its counts on SIGUSR1
SERVED = "task AioServer._request_registered_call"  # a unary call served
MADE = "task UnaryUnaryCall._invoke"  # a unary call made


def _name(callback: Any) -> str:
    function = getattr(callback, "__func__", callback)
    return getattr(function, "__qualname__", None) or type(callback).__name__


def install_counting_loop() -> None:
    """Make the replica's loop count what it schedules (in the replica, before it starts)."""
    import uvloop

    from rlog import event_loop

    counts: collections.Counter[str] = collections.Counter()

    base: Any = uvloop.Loop  # its C signatures are narrower than asyncio's stubs

    class CountingLoop(base):
        def call_soon(self, callback: Any, *args: Any, **kwargs: Any) -> Any:
            counts["call_soon " + _name(callback)] += 1
            return super().call_soon(callback, *args, **kwargs)

        def call_later(self, delay: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
            counts["call_later " + _name(callback)] += 1
            return super().call_later(delay, callback, *args, **kwargs)

        def call_at(self, when: float, callback: Any, *args: Any, **kwargs: Any) -> Any:
            counts["call_at " + _name(callback)] += 1
            return super().call_at(when, callback, *args, **kwargs)

        def call_soon_threadsafe(self, callback: Any, *args: Any, **kwargs: Any) -> Any:
            counts["threadsafe " + _name(callback)] += 1
            return super().call_soon_threadsafe(callback, *args, **kwargs)

        def create_task(self, coro: Any, **kwargs: Any) -> Any:
            counts["task " + getattr(coro, "__qualname__", type(coro).__name__)] += 1
            return super().create_task(coro, **kwargs)

    event_loop.loop_factory = lambda: CountingLoop
    path = os.environ[COUNTS_ENV]

    def dump(*_: object) -> None:
        Path(path).write_text(json.dumps(counts))

    signal.signal(signal.SIGUSR1, dump)


def as_replica(argv: list[str]) -> int:
    install_counting_loop()
    from rlog.tools.cli import main as rlog_main

    return rlog_main(argv)


def snapshot(cluster: Any, base: Path) -> dict[int, collections.Counter[str]]:
    """Every replica's counts so far."""
    for i in range(3):
        (base / f"counts-{i}.json").unlink(missing_ok=True)
        pid = cluster.pid(i)
        if pid is not None:
            os.kill(pid, signal.SIGUSR1)
    counts: dict[int, collections.Counter[str]] = {}
    deadline = time.monotonic() + 10
    for i in range(3):
        path = base / f"counts-{i}.json"
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.05)  # written in one call; let it finish
        counts[i] = collections.Counter(json.loads(path.read_text()))
    return counts


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--as-replica":
        return as_replica(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="appends")
    parser.add_argument("--batch", type=int, default=1, help="1 KiB values per append")
    parser.add_argument("--top", type=int, default=12, help="lines per replica")
    parser.add_argument(
        "--tree", type=Path, default=HERE, help="the replicas' source tree (default this one)"
    )
    args = parser.parse_args()

    from rlog import event_loop
    from rlog.client import AsyncClient

    base = Path(tempfile.mkdtemp(prefix="rlog-loop-counts-"))
    env = harness.tree_env(args.tree)

    def env_of(i: int) -> dict[str, str]:
        return {**env, COUNTS_ENV: str(base / f"counts-{i}.json")}

    async def append(endpoint: str) -> None:
        values = [os.urandom(1024)] * args.batch
        async with AsyncClient(endpoint, timeout=10) as client:
            for _ in range(args.count):
                await client.append(values)

    with harness.wrapped_cluster(__file__, base / "cluster", env_of) as cluster:
        leader = cluster.wait_for_leader()
        event_loop.run(append(cluster.endpoints[leader]))  # warm: sessions, streams
        before = snapshot(cluster, base)
        event_loop.run(append(cluster.endpoints[leader]))
        after = snapshot(cluster, base)
    for i in range(3):
        window = after[i] - before[i]
        role = "leader" if i == leader else "follower"
        total = sum(window.values()) / args.count
        print(f"replica {i} ({role}): {total:.1f} scheduled per append")
        for name, n in window.most_common(args.top):
            print(f"  {n / args.count:7.2f}  {name}")
        print(
            f"  unary calls per append: served {window[SERVED] / args.count:.2f}, "
            f"made {window[MADE] / args.count:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
