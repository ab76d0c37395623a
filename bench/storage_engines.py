"""Group-commit throughput of the storage engines on this machine's real disk.

    .venv/bin/python bench/storage_engines.py [--dir DIR] [--seconds S] [--engines a,b]

For every engine: synced batches of N actions (N = 1, 16, 64, 256) with 1 KiB values, each
batch one `apply(WriteBatch(sync=True))` = one durable commit; then one unsynced cell for
contrast; then a scan of a 100k-entry log and the deletion of its 100k prefix. Prints a
markdown table (docs/storage-engines.md keeps one).

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

from rlog.proto import rlog_pb2 as pb
from rlog.storage import ENGINES, StorageError, WriteBatch, open_storage

VALUE = os.urandom(1024)
SIZES = (1, 16, 64, 256)
FILL = 110_000
PREFIX = 100_000


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path.home() / "rlog-storage-bench")
    ap.add_argument("--seconds", type=float, default=2.0, help="per group-commit cell")
    ap.add_argument("--engines", default=",".join(e for e in ENGINES if e != "memory"))
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
