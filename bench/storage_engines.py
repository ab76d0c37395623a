"""Group-commit throughput of the storage engines on this machine's real disk.

    .venv/bin/python bench/storage_engines.py [--dir DIR] [--seconds S] [--engines a,b]
        [--suite actions|runs|all] [--rounds R]

Suite `actions` (per-position records, as before runs): for every engine, synced batches of
N actions (N = 1, 16, 64, 256) with 1 KiB values, each batch one
`apply(WriteBatch(sync=True))` = one durable commit; then one unsynced cell for contrast;
then a scan of a 100k-entry log and the deletion of its 100k prefix.

Suite `runs` (one record per run, docs/data-path.md): synced group commits of K runs of
64 x 1 KiB values (K = 1, 4, 16), each batch one durable commit; then reads of a 64 MiB log
of runs (after one untimed pass, so both read from the page cache): one `scan_records` over
all of it, catch-up-like reads (consecutive `scan_records` ranges of 500 positions that
start and end inside runs, so both ends are clipped), and the time to open that data dir
again (a restart). Every cell runs once per engine per round, engines interleaved (the
order rotates each round), and the tables give each engine's median over the rounds.

Prints markdown tables (docs/storage-engines.md keeps them).

The data dir must be on a real disk: /tmp may be tmpfs, where fsync costs nothing.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from rlog import packed
from rlog.proto import rlog_pb2 as pb
from rlog.storage import ENGINES, StorageError, WriteBatch, open_storage

VALUE = os.urandom(1024)
SIZES = (1, 16, 64, 256)
FILL = 110_000
PREFIX = 100_000
RUN_VALUES = 64  # values per run (one client batch)
RUNS_PER_COMMIT = (1, 4, 16)
READ_RUNS = 1024  # 64 MiB of runs for the read cells
CATCH_UP_SPAN = 500  # positions per catch-up read (not a multiple of RUN_VALUES)


def fs_type(path: Path) -> str:
    try:
        out = subprocess.run(
            ["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def actions(first: int, n: int) -> list[pb.Action]:
    return [
        pb.Action(position=p, performed=1, type=pb.APPEND, value=VALUE)
        for p in range(first, first + n)
    ]


def commit_cell(engine: str, d: Path, n: int, seconds: float, sync: bool) -> dict[str, float]:
    store = open_storage(d, engine)
    try:
        meta = pb.Metadata(status=pb.VOTING, promised=1)
        lat: list[float] = []
        pos = 1
        # Build batches outside the timed part (the server hands storage ready protobufs);
        # only their positions change from one apply to the next.
        batches = [
            WriteBatch(metadata=meta, actions=actions(i * n + 1, n), sync=sync) for i in range(8)
        ]
        start = time.perf_counter()
        while True:
            b = batches[len(lat) % len(batches)]
            for k, a in enumerate(b.actions):
                a.position = pos + k
            t0 = time.perf_counter()
            store.apply(b)
            t1 = time.perf_counter()
            lat.append(t1 - t0)
            pos += n
            if t1 - start >= seconds and len(lat) >= 5:
                break
        elapsed = time.perf_counter() - start
    finally:
        store.close()
    lat.sort()
    count = len(lat)
    return {
        "batches_s": count / elapsed,
        "entries_s": count * n / elapsed,
        "mb_s": count * n * len(VALUE) / elapsed / 1e6,
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[min(count - 1, int(count * 0.99))] * 1e3,
        "count": count,
    }


def scan_and_delete(engine: str, d: Path) -> dict[str, float]:
    store = open_storage(d, engine)
    try:
        t0 = time.perf_counter()
        for first in range(0, FILL, 1000):
            store.apply(WriteBatch(actions=actions(first, 1000), sync=False))
        store.apply(WriteBatch(sync=True))
        fill = time.perf_counter() - t0
        t0 = time.perf_counter()
        n = sum(1 for _ in store.scan(0, FILL))
        scan = time.perf_counter() - t0
        assert n == FILL, n
        t0 = time.perf_counter()
        store.apply(WriteBatch(delete_below=PREFIX, sync=True))
        delete = time.perf_counter() - t0
        t0 = time.perf_counter()
        begin = store.first_position()
        first_after = time.perf_counter() - t0
        assert begin == PREFIX, begin
    finally:
        store.close()
    return {
        "fill_entries_s": FILL / fill,
        "scan_entries_s": FILL / scan,
        "scan_mb_s": FILL * len(VALUE) / scan / 1e6,
        "delete_ms": delete * 1e3,
        "first_after_ms": first_after * 1e3,
    }


def make_runs(n: int) -> list[pb.Run]:
    data, offsets = packed.pack([VALUE] * RUN_VALUES)
    head = pb.Action(type=pb.APPEND, performed=1, learned=True, origin_proposal=1)
    return [packed.make_run(1 + i * RUN_VALUES, head, data, offsets) for i in range(n)]


def run_commit_cell(engine: str, d: Path, k: int, seconds: float) -> dict[str, float]:
    """Synced group commits of k runs each (the runs built before the clock starts)."""
    store = open_storage(d, engine)
    try:
        meta = pb.Metadata(status=pb.VOTING, promised=1)
        runs = make_runs(k)
        lat: list[float] = []
        pos = 1
        start = time.perf_counter()
        while True:
            for i, r in enumerate(runs):
                r.first = pos + i * RUN_VALUES
            t0 = time.perf_counter()
            store.apply(WriteBatch(metadata=meta, runs=runs, sync=True))
            t1 = time.perf_counter()
            lat.append(t1 - t0)
            pos += k * RUN_VALUES
            if t1 - start >= seconds and len(lat) >= 5:
                break
        elapsed = time.perf_counter() - start
    finally:
        store.close()
    lat.sort()
    count = len(lat)
    return {
        "commits_s": count / elapsed,
        "entries_s": count * k * RUN_VALUES / elapsed,
        "mb_s": count * k * RUN_VALUES * len(VALUE) / elapsed / 1e6,
        "p50_ms": statistics.median(lat) * 1e3,
        "p99_ms": lat[min(count - 1, int(count * 0.99))] * 1e3,
    }


def run_read_cell(engine: str, d: Path) -> dict[str, float]:
    """Fill READ_RUNS runs (16 per commit), then read them back whole and as catch-up."""
    store = open_storage(d, engine)
    try:
        runs = make_runs(16)
        for b in range(READ_RUNS // 16):
            for i, r in enumerate(runs):
                r.first = 1 + (b * 16 + i) * RUN_VALUES
            store.apply(WriteBatch(runs=runs, sync=False))
        store.apply(WriteBatch(sync=True))
        last = READ_RUNS * RUN_VALUES
        nbytes = last * len(VALUE)
        for _ in store.scan_records(0, last):  # warm: both timed reads find the page cache hot
            pass
        t0 = time.perf_counter()
        got = sum(len(r.data) for r in store.scan_records(0, last) if isinstance(r, pb.Run))
        scan = time.perf_counter() - t0
        assert got == nbytes, got
        lat: list[float] = []
        got = 0
        t0 = time.perf_counter()
        for first in range(1 + RUN_VALUES // 3, last + 1, CATCH_UP_SPAN):
            t1 = time.perf_counter()
            for r in store.scan_records(first, first + CATCH_UP_SPAN - 1):
                assert isinstance(r, pb.Run)
                got += len(r.data)
            lat.append(time.perf_counter() - t1)
        catch_up = time.perf_counter() - t0
    finally:
        store.close()
    t0 = time.perf_counter()
    open_storage(d, engine).close()  # a restart: what opening a 64 MiB log costs
    reopen = time.perf_counter() - t0
    lat.sort()
    return {
        "reopen_ms": reopen * 1e3,
        "scan_mb_s": nbytes / scan / 1e6,
        "catch_up_mb_s": got / catch_up / 1e6,
        "catch_up_p50_ms": statistics.median(lat) * 1e3,
    }


def runs_suite(root: Path, engines: list[str], seconds: float, rounds: int) -> None:
    commits: dict[tuple[str, int], list[dict[str, float]]] = {}
    reads: dict[str, list[dict[str, float]]] = {}
    for rnd in range(rounds):
        order = engines[rnd % len(engines) :] + engines[: rnd % len(engines)]
        for k in RUNS_PER_COMMIT:
            for engine in order:
                d = root / f"{engine}-runs-{k}"
                shutil.rmtree(d, ignore_errors=True)
                try:
                    r = run_commit_cell(engine, d, k, seconds)
                finally:
                    shutil.rmtree(d, ignore_errors=True)
                commits.setdefault((engine, k), []).append(r)
                print(
                    f"  round {rnd} {engine} runs={k}: {r['commits_s']:.0f} commits/s "
                    f"{r['mb_s']:.1f} MB/s p50 {r['p50_ms']:.2f} ms",
                    file=sys.stderr,
                    flush=True,
                )
        for engine in order:
            d = root / f"{engine}-runs-read"
            shutil.rmtree(d, ignore_errors=True)
            try:
                r = run_read_cell(engine, d)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            reads.setdefault(engine, []).append(r)
            print(
                f"  round {rnd} {engine} reads: scan {r['scan_mb_s']:.0f} MB/s "
                f"catch-up {r['catch_up_mb_s']:.0f} MB/s reopen {r['reopen_ms']:.1f} ms",
                file=sys.stderr,
                flush=True,
            )

    def med(cells: list[dict[str, float]], key: str) -> float:
        return statistics.median(c[key] for c in cells)

    def spread(cells: list[dict[str, float]], key: str, fmt: str) -> str:
        lo, hi = min(c[key] for c in cells), max(c[key] for c in cells)
        return f"{lo:{fmt}}-{hi:{fmt}}"

    print(
        f"| engine | runs per commit | commits/s (median of {rounds}) | range | MB/s | "
        "p50 ms | p99 ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for k in RUNS_PER_COMMIT:
        for engine in engines:
            cells = commits[(engine, k)]
            print(
                f"| {engine} | {k} | {med(cells, 'commits_s'):,.0f} | "
                f"{spread(cells, 'commits_s', ',.0f')} | {med(cells, 'mb_s'):.1f} | "
                f"{med(cells, 'p50_ms'):.2f} | {med(cells, 'p99_ms'):.2f} |"
            )
    print()
    print(
        f"| engine | scan_records MB/s (median of {rounds}) | range | catch-up MB/s | range "
        f"| catch-up p50 ms per {CATCH_UP_SPAN} positions | reopen ms |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for engine in engines:
        cells = reads[engine]
        print(
            f"| {engine} | {med(cells, 'scan_mb_s'):,.0f} | {spread(cells, 'scan_mb_s', ',.0f')} "
            f"| {med(cells, 'catch_up_mb_s'):,.0f} | {spread(cells, 'catch_up_mb_s', ',.0f')} "
            f"| {med(cells, 'catch_up_p50_ms'):.2f} | {med(cells, 'reopen_ms'):.1f} |"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path.home() / "rlog-storage-bench")
    ap.add_argument("--seconds", type=float, default=2.0, help="per group-commit cell")
    ap.add_argument("--engines", default=",".join(e for e in ENGINES if e != "memory"))
    ap.add_argument("--suite", choices=("actions", "runs", "all"), default="all")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (runs suite)")
    args = ap.parse_args()
    root: Path = args.dir
    root.mkdir(parents=True, exist_ok=True)
    fstype = fs_type(root)
    if fstype in ("tmpfs", "ramfs"):
        print(f"{root} is on {fstype}: fsync is free there, pick a real disk", file=sys.stderr)
        return 2
    print(
        f"# storage engines, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{os.cpu_count()} cpus, python {platform.python_version()}, dir {root} ({fstype}), "
        f"{args.seconds:g}s per cell, 1 KiB values\n"
    )
    if args.suite in ("runs", "all"):
        runs_suite(root, args.engines.split(","), args.seconds, args.rounds)
        print()
    if args.suite == "runs":
        return 0
    rows = []
    extra = []
    for engine in args.engines.split(","):
        for n, sync in [*((n, True) for n in SIZES), (64, False)]:
            d = root / f"{engine}-{n}-{sync}"
            shutil.rmtree(d, ignore_errors=True)
            try:
                r = commit_cell(engine, d, n, args.seconds, sync)
            except StorageError as exc:
                print(f"skip {engine}: {exc}", file=sys.stderr)
                break
            finally:
                shutil.rmtree(d, ignore_errors=True)
            rows.append((engine, n, sync, r))
            print(
                f"  {engine} N={n} sync={sync}: {r['batches_s']:.0f} batches/s "
                f"p50 {r['p50_ms']:.2f} ms",
                file=sys.stderr,
                flush=True,
            )
        else:
            d = root / f"{engine}-scan"
            shutil.rmtree(d, ignore_errors=True)
            try:
                extra.append((engine, scan_and_delete(engine, d)))
            finally:
                shutil.rmtree(d, ignore_errors=True)
    print(
        "| engine | N | sync | batches/s (= durable commits/s) | entries/s | MB/s "
        "| p50 ms | p99 ms |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for engine, n, sync, r in rows:
        print(
            f"| {engine} | {n} | {'yes' if sync else 'no'} | {r['batches_s']:,.0f} | "
            f"{r['entries_s']:,.0f} | {r['mb_s']:.1f} | {r['p50_ms']:.2f} | {r['p99_ms']:.2f} |"
        )
    print()
    print(
        f"| engine | fill {FILL // 1000}k unsynced entries/s | scan entries/s | scan MB/s | "
        f"delete_below {PREFIX // 1000}k prefix ms | first_position after ms |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for engine, r in extra:
        print(
            f"| {engine} | {r['fill_entries_s']:,.0f} | {r['scan_entries_s']:,.0f} | "
            f"{r['scan_mb_s']:.0f} | {r['delete_ms']:,.0f} | {r['first_after_ms']:.2f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
