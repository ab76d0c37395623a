"""`rlog bench`: append (or read) benchmarks against a running log.

- serial (like `mesos-log benchmark`): one writer, one append at a time; with --trace FILE
  every append writes a line `<unix timestamp> <bytes> <milliseconds>`;
- concurrent: C writers (asyncio tasks sharing one AsyncClient), each appending B values per
  call, for --count values in all or for --duration seconds;
- `--read N`: the same, each operation a read of the N entries appended first (a
  linearizable read; `--stale`: a stale read of the contacted replica), instead of an append.

Both report acknowledged appends/s (calls), entries/s, MB/s (payload, 10^6 bytes) and the
latency percentiles of the calls. A progress bar goes to stderr unless --json or stderr is
not a terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import time
from collections.abc import Awaitable, Callable
from typing import IO, TYPE_CHECKING, Any

from rlog import event_loop
from rlog.client import AsyncClient
from rlog.config import ConfigError

if TYPE_CHECKING:
    from tqdm import tqdm


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=["serial", "concurrent"], default="serial")
    parser.add_argument(
        "--count", type=int, help="values to append in all (default 1000 without --duration)"
    )
    parser.add_argument("--size", type=int, default=1024, metavar="BYTES", help="value size")
    parser.add_argument(
        "--concurrency", type=int, default=16, metavar="C", help="concurrent writers"
    )
    parser.add_argument("--batch", type=int, default=1, metavar="B", help="values per append")
    parser.add_argument("--duration", type=float, metavar="S", help="run for S seconds")
    parser.add_argument("--trace", metavar="FILE", help="per-append lines: timestamp bytes ms")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--warmup", type=int, default=0, help="untimed appends first")
    parser.add_argument(
        "--read",
        type=int,
        metavar="N",
        help="benchmark reads: append N values first, then each operation reads them all",
    )
    parser.add_argument(
        "--stale", action="store_true", help="with --read: stale reads (no leader round)"
    )
    parser.add_argument(
        "--stream",
        action="store_true",
        help="multiplex the appends on one AppendStream call (instead of one call each)",
    )
    parser.add_argument(
        "--lane",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="append on the leader's append lane once it is open, as every client does by "
        "default (--no-lane: a gRPC call each); the summary's `lane` says which it was",
    )
    parser.add_argument(
        "--no-exactly-once",
        dest="exactly_once",
        action="store_false",
        help="append without a client session (no dedupe of retries): the cost of sessions",
    )


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 if empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, math.ceil(q / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


def summarize(
    mode: str,
    latencies: list[float],
    entries: int,
    size: int,
    elapsed: float,
    extra: dict[str, Any],
) -> dict[str, Any]:
    ordered = sorted(latencies)
    elapsed = max(elapsed, 1e-9)
    return {
        "mode": mode,
        **extra,
        "size": size,
        "appends": len(latencies),
        "entries": entries,
        "bytes": entries * size,
        "seconds": round(elapsed, 6),
        "appends_per_s": round(len(latencies) / elapsed, 2),
        "entries_per_s": round(entries / elapsed, 2),
        "mb_per_s": round(entries * size / elapsed / 1e6, 3),
        "latency_ms": {
            "mean": round(sum(ordered) / len(ordered) * 1000, 3) if ordered else 0.0,
            "p50": round(percentile(ordered, 50) * 1000, 3),
            "p90": round(percentile(ordered, 90) * 1000, 3),
            "p99": round(percentile(ordered, 99) * 1000, 3),
            "max": round(ordered[-1] * 1000, 3) if ordered else 0.0,
        },
    }


def _progress(total: int | None, args: argparse.Namespace, unit: str) -> tqdm[Any]:
    # Imported here, not with the module: every `rlog` command (a replica's start too)
    # builds the `bench` subcommand's arguments, and tqdm's import is ~45 ms of that.
    from tqdm import tqdm

    disable = args.json or not sys.stderr.isatty()
    return tqdm(total=total, unit=unit, disable=disable, file=sys.stderr, dynamic_ncols=True)


async def _serial(
    client: AsyncClient, args: argparse.Namespace, trace: IO[str] | None
) -> dict[str, Any]:
    value = os.urandom(args.size)
    limit = args.count if args.count is not None else (None if args.duration else 1000)
    latencies: list[float] = []
    operation = await _operation(client, args, [value])
    for _ in range(args.warmup):
        await operation()
    bar = _progress(limit, args, "read" if args.read else "append")
    try:
        started = time.perf_counter()
        stop_at = started + args.duration if args.duration else math.inf
        while (limit is None or len(latencies) < limit) and time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            await operation()
            latency = time.perf_counter() - t0
            latencies.append(latency)
            if trace is not None:
                trace.write(f"{time.time():.6f} {args.size} {latency * 1000:.3f}\n")
            bar.update(1)
        elapsed = time.perf_counter() - started
    finally:
        bar.close()
    return summarize("serial", latencies, len(latencies), args.size, elapsed, _extra(args, client))


async def _concurrent(
    client: AsyncClient, args: argparse.Namespace, trace: IO[str] | None
) -> dict[str, Any]:
    value = os.urandom(args.size)
    batch = [value] * args.batch
    limit = args.count if args.count is not None else (None if args.duration else 10_000)
    latencies: list[float] = []
    claimed = 0
    entries = 0
    operation = await _operation(client, args, batch)
    for _ in range(args.warmup):
        await operation()
    bar = _progress(limit, args, "entry")
    started = time.perf_counter()
    stop_at = started + args.duration if args.duration else math.inf

    async def writer() -> None:
        nonlocal claimed, entries
        while time.perf_counter() < stop_at:
            if limit is not None:
                n = min(args.batch, limit - claimed)
                if n <= 0:
                    return
            else:
                n = args.batch
            claimed += n
            t0 = time.perf_counter()
            if args.read:
                await operation()
            else:
                await client.append(batch if n == args.batch else batch[:n])
            latency = time.perf_counter() - t0
            latencies.append(latency)
            entries += n
            if trace is not None:
                trace.write(f"{time.time():.6f} {n * args.size} {latency * 1000:.3f}\n")
            bar.update(n)

    try:
        await asyncio.gather(*(writer() for _ in range(args.concurrency)))
    finally:
        bar.close()
    elapsed = time.perf_counter() - started
    return summarize(
        "concurrent",
        latencies,
        entries,
        args.size,
        elapsed,
        {
            "concurrency": args.concurrency,
            "batch": args.batch,
            "stream": args.stream,
            **_extra(args, client),
        },
    )


async def _operation(
    client: AsyncClient, args: argparse.Namespace, values: list[bytes]
) -> Callable[[], Awaitable[object]]:
    """What one benchmarked call does: append `values`, or (--read N) read the N entries
    appended here first."""
    if not args.read:
        return lambda: client.append(values)
    positions = await client.append([os.urandom(args.size) for _ in range(args.read)])
    first, last = positions[0], positions[-1]

    async def read() -> int:
        return sum([1 async for _ in client.read(first, last, stale=args.stale)])

    return read


def _extra(args: argparse.Namespace, client: AsyncClient) -> dict[str, Any]:
    extra: dict[str, Any] = {"lane": client.lane}
    return {**extra, "read": args.read, "stale": args.stale} if args.read else extra


async def _run(args: argparse.Namespace, trace: IO[str] | None) -> dict[str, Any]:
    from rlog.tools.client_args import credentials_of

    async with AsyncClient(
        args.endpoint,
        timeout=args.timeout,
        stream=args.stream,
        exactly_once=args.exactly_once,
        credentials=credentials_of(args),
        lane=args.lane,
    ) as client:
        if args.mode == "serial":
            return await _serial(client, args, trace)
        return await _concurrent(client, args, trace)


def format_summary(result: dict[str, Any]) -> str:
    lat = result["latency_ms"]
    what = f"reads of {result['read']} entries" if result.get("read") else "entries"
    head = f"{result['mode']}: {result['entries']} {what} of {result['size']} bytes"
    if result["mode"] == "concurrent":
        head += f", {result['concurrency']} writers x {result['batch']} values per append"
    return "\n".join(
        [
            head + f" in {result['seconds']:.2f} s",
            f"  {result['appends_per_s']:.1f} appends/s  {result['entries_per_s']:.1f} entries/s"
            f"  {result['mb_per_s']:.2f} MB/s",
            f"  latency ms: p50 {lat['p50']:.2f}  p90 {lat['p90']:.2f}  p99 {lat['p99']:.2f}"
            f"  max {lat['max']:.2f}  mean {lat['mean']:.2f}",
        ]
    )


def run(args: argparse.Namespace) -> int:
    for name in ("size", "concurrency", "batch"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name} must be at least 1")
    if args.count is not None and args.count < 1:
        raise ConfigError("--count must be at least 1")
    if args.duration is not None and not args.duration > 0:
        raise ConfigError("--duration must be positive")
    if args.warmup < 0:
        raise ConfigError("--warmup must not be negative")
    if args.read is not None and args.read < 1:
        raise ConfigError("--read must be at least 1")
    if args.stale and not args.read:
        raise ConfigError("--stale needs --read N")
    if args.stream and args.lane:
        raise ConfigError(
            "--lane and --stream exclude each other: the stream already "
            "multiplexes the appends on one call"
        )
    if args.trace:
        with open(args.trace, "w") as trace:
            result = event_loop.run(_run(args, trace))
    else:
        result = event_loop.run(_run(args, None))
    if args.json:
        print(json.dumps(result))
    else:
        print(format_summary(result))
    return 0
