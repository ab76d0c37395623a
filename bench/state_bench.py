"""Replicated state (rlog.state) on a fresh 3-replica `DevCluster` (default engine, real disk).

    bench/state_bench.py [--seconds 5] [--rounds 2] [--writers 1,16,256] [--prefill 10000]
                         [--recovery 100000] [--dir DIR]

- throughput: W writer coroutines share one `AsyncState`; each stores its own variable
  (100-byte values) again and again with the version it got back. Batching on (the
  Registrar's: mutations queued during an append go out together as the next one) and off
  (one append per mutation), interleaved in each round. Prints mutations/s, appends/s,
  mutations per append, p50/p99 latency of a store, and the log bytes per mutation: the diff
  entries actually appended, next to what full-state writes would have cost (the whole state,
  encoded as one entry, per append: computed from the state at the end of the run, not
  written). `--prefill N` first stores N other 100-byte variables, so the state is of a
  realistic size for that comparison.
- recovery: stores `--recovery` 100-byte variables (batched, no automatic snapshot), then
  times a fresh `AsyncState` recovering them by replaying the diffs; then writes a snapshot
  (`compact`) and times recovery from it.

One JSON object per result on stdout; `uptime` before each block on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from rlog.client import AsyncClient  # noqa: E402
from rlog.state import AsyncState, Variable  # noqa: E402
from rlog.state.format import NO_SNAPSHOT, snapshot_chunks  # noqa: E402
from rlog.tools.dev import DevCluster  # noqa: E402

VALUE = b"v" * 100


def load() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def emit(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


async def fill(state: AsyncState, prefix: str, count: int, concurrency: int = 256) -> None:
    async def one(start: int) -> None:
        for i in range(start, count, concurrency):
            await state.store(Variable(f"{prefix}{i}", VALUE, 0))

    await asyncio.gather(*(one(s) for s in range(min(concurrency, count))))


def full_state_bytes(state: AsyncState) -> int:
    image = state._image
    assert image is not None
    chunks = snapshot_chunks(0, NO_SNAPSHOT, image.counter, image.snapshot_items(), 1 << 62)
    return sum(len(c) for c in chunks)


async def throughput(
    endpoints: str, writers: int, batching: bool, seconds: float, run: str
) -> dict[str, Any]:
    client = AsyncClient(endpoints)
    state = AsyncState(client, batching=batching, compact=False)
    await state.recover()
    latencies: list[float] = []
    mutations = 0

    await state.sync()  # each writer's version, read before the clock starts

    async def writer(i: int) -> None:
        nonlocal mutations
        name = f"{run}-w{i}"
        version = state.cached(name).version
        while time.monotonic() < stop:
            started = time.monotonic()
            stored = await state.store(Variable(name, VALUE, version))
            assert stored is not None, "a writer's own variable moved under it"
            latencies.append(time.monotonic() - started)
            version = stored.version
            mutations += 1

    appends_before, bytes_before = state.appends, state.appended_bytes
    started = time.monotonic()
    stop = started + seconds
    await asyncio.gather(*(writer(i) for i in range(writers)))
    elapsed = time.monotonic() - started
    appends = state.appends - appends_before
    appended = state.appended_bytes - bytes_before
    full = full_state_bytes(state)
    latencies.sort()
    result = {
        "mode": "throughput",
        "writers": writers,
        "batching": batching,
        "mutations_per_s": round(mutations / elapsed, 1),
        "appends_per_s": round(appends / elapsed, 1),
        "mutations_per_append": round(mutations / max(appends, 1), 2),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p99_ms": round(1000 * latencies[int(0.99 * (len(latencies) - 1))], 1),
        "diff_bytes_per_mutation": round(appended / max(mutations, 1), 1),
        "state_variables": len(state._image.variables) if state._image else 0,
        "full_state_bytes_per_mutation": round(full * appends / max(mutations, 1), 1),
    }
    await client.close()
    return result


async def recovery(endpoints: str, count: int) -> list[dict[str, Any]]:
    client = AsyncClient(endpoints)
    writer = AsyncState(client, compact=False)
    await writer.recover()
    started = time.monotonic()
    await fill(writer, "r", count)
    fill_s = time.monotonic() - started
    results = []

    async def timed_recovery(what: str) -> None:
        reader_client = AsyncClient(endpoints)
        reader = AsyncState(reader_client)
        started = time.monotonic()
        await reader.recover()
        elapsed = time.monotonic() - started
        status = await reader_client.status()
        results.append(
            {
                "mode": "recovery",
                "from": what,
                "variables": len(await reader.names()),
                "seconds": round(elapsed, 2),
                "log_begin": status.begin,
                "log_end": status.end,
                "fill_mutations_per_s": round(count / fill_s, 1),
                "load": load(),
            }
        )
        await reader_client.close()

    await timed_recovery("diffs")
    started = time.monotonic()
    await writer.compact()
    compact_s = time.monotonic() - started
    await timed_recovery("snapshot")
    results[-1]["compact_seconds"] = round(compact_s, 2)
    results[-1]["snapshot_bytes"] = full_state_bytes(writer)
    await client.close()
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--writers", default="1,16,256")
    parser.add_argument("--prefill", type=int, default=10_000)
    parser.add_argument("--recovery", type=int, default=100_000)
    parser.add_argument("--dir", default=None, help="cluster dir (default: a temp dir)")
    args = parser.parse_args()
    writer_counts = [int(w) for w in args.writers.split(",") if w]
    base = Path(args.dir or tempfile.mkdtemp(prefix="state-bench-", dir=os.environ.get("TMPDIR")))
    with DevCluster(3, base / "throughput", election_timeout=1.0) as cluster:
        cluster.wait_for_leader()
        endpoints = ",".join(cluster.endpoints)
        if args.prefill:
            print(f"prefill {args.prefill}: {load()}", file=sys.stderr)
            asyncio.run(_prefill(endpoints, args.prefill))
        for round_ in range(1, args.rounds + 1):
            for writers in writer_counts:
                order = [True, False] if round_ % 2 else [False, True]
                for batching in order:
                    uptime = load()
                    print(
                        f"round {round_} writers {writers} batching {batching}: {uptime}",
                        file=sys.stderr,
                    )
                    result = asyncio.run(
                        throughput(endpoints, writers, batching, args.seconds, f"r{round_}")
                    )
                    emit({"round": round_, "load": uptime, **result})
    if args.recovery:
        with DevCluster(3, base / "recovery", election_timeout=1.0) as cluster:
            cluster.wait_for_leader()
            print(f"recovery {args.recovery}: {load()}", file=sys.stderr)
            for record in asyncio.run(recovery(",".join(cluster.endpoints), args.recovery)):
                emit(record)
    return 0


async def _prefill(endpoints: str, count: int) -> None:
    client = AsyncClient(endpoints)
    state = AsyncState(client, compact=False)
    await state.recover()
    await fill(state, "p", count)
    await client.close()


if __name__ == "__main__":
    sys.exit(main())
