"""What the disk alone allows the batched benchmarks: `--writers` processes (one per replica)
each append `--size`-byte writes to a file of its own, each write followed by fdatasync
(a group commit of one batch), for `--seconds`; prints every writer's MB/s, syncs/s and
fdatasync latency quantiles, and their sum. No rlog code runs: the sum is the ceiling for
what 3 replicas on one disk can make durable together, i.e. 3 x the acknowledged MB/s of a
3-replica log on this machine.

    .venv/bin/python bench/disk_ceiling.py [--writers 3] [--size 262144] [--seconds 10]
                                           [--piece BYTES] [--rewrite BYTES] [--dir DIR]
                                           [--drop-behind BYTES] [--json FILE]

By default each file grows (to 1 GiB, then the writer wraps to offset 0), so the timed writes
land on blocks the file system allocates afresh. `--rewrite BYTES` first writes BYTES to each
file (untimed, one sync) and wraps there, so every timed write lands on blocks written
before. On this VM the two differ by up to 10x (docs/performance.md, "What the host does to
disk-bound figures"): a log that keeps growing writes new space, one that is truncated
reuses its own.

`--piece BYTES` issues each synced write as write calls of at most BYTES (as the segment
engine does, 1 MiB): on this VM's kernel a single call of 2 MiB or more gets large page-cache
folios that fault in the host page by page, several times slower (docs/performance.md,
"What the host does to disk-bound figures").

`--drop-behind BYTES` drops each file's synced pages more than BYTES behind its writes from
the page cache, as the segment engine does (rlog/storage/page_cache.py): the next writes then
reuse those pages instead of taking free pages the VM may have handed back to its host. Each
writer's system time per MB written is reported either way.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from machine import load

# A file grows to at most this, then the writer starts over at offset 0 (rewriting blocks
# already allocated, as a log's storage engine reuses its pages).
WRAP_BYTES = 1 << 30
DROP_STEP = 4 << 20
DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", 4)


def _writer(
    path: str,
    size: int,
    piece: int,
    seconds: float,
    rewrite: int,
    drop_behind: int,
    ready: Any,  # a multiprocessing.Barrier: every writer starts its timed writes together
    out: multiprocessing.Queue,  # type: ignore[type-arg]
) -> None:
    block = os.urandom(size)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        wrap = WRAP_BYTES
        if rewrite:
            for offset in range(0, rewrite, size):
                os.pwrite(fd, block, offset)
            os.fdatasync(fd)
            wrap = max(rewrite, 2 * size)
        ready.wait()
        offset, syncs, written, dropped = 0, 0, 0, 0
        sync_s: list[float] = []
        began = time.monotonic()
        system_before = os.times().system
        view = memoryview(block)
        while time.monotonic() - began < seconds:
            for start in range(0, size, piece):
                os.pwrite(fd, view[start : start + piece], offset + start)
            synced_at = time.monotonic()
            os.fdatasync(fd)
            sync_s.append(time.monotonic() - synced_at)
            if drop_behind and offset + size - drop_behind - dropped >= DROP_STEP:
                # as the segment engine does (rlog/storage/page_cache.py)
                os.posix_fadvise(fd, dropped, offset + size - drop_behind - dropped, DONTNEED)
                dropped = offset + size - drop_behind
            offset = 0 if offset + 2 * size > wrap else offset + size
            dropped = 0 if offset == 0 else dropped
            syncs += 1
            written += size
        elapsed = time.monotonic() - began
        out.put(
            {
                "syncs_per_s": syncs / elapsed,
                "mb_per_s": written / elapsed / 1e6,
                "system_ms_per_mb": (os.times().system - system_before) * 1e3 / (written / 1e6),
                "sync_ms": {q: round(quantile(sync_s, q) * 1e3, 3) for q in ("p50", "p90", "p99")},
            }
        )
    finally:
        os.close(fd)


def quantile(values: list[float], q: str) -> float:
    """The nearest-rank quantile "p50", "p90", "p99" of `values`."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(float(q[1:]) / 100 * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--size", type=int, default=256 * 1024, help="bytes per synced write")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument(
        "--piece",
        type=int,
        default=0,
        metavar="BYTES",
        help="issue each synced write as calls of at most BYTES (default: one call)",
    )
    parser.add_argument(
        "--rewrite",
        type=int,
        default=0,
        metavar="BYTES",
        help="write each file to BYTES first and wrap there (timed writes on written blocks)",
    )
    parser.add_argument(
        "--drop-behind",
        type=int,
        default=0,
        metavar="BYTES",
        help="drop each file's synced pages more than BYTES behind its writes from the page "
        "cache (POSIX_FADV_DONTNEED), as the segment engine does; 0: keep them (default)",
    )
    parser.add_argument("--dir", type=Path, default=None, help="where (default: ~/.cache)")
    parser.add_argument("--json", type=Path, default=None, help="append the result here")
    args = parser.parse_args()
    if args.writers < 1 or args.size < 1 or args.seconds <= 0 or args.piece < 0:
        parser.error("--writers, --size and --seconds must be positive, --piece not negative")
    piece = args.piece or args.size
    base = args.dir or Path.home() / ".cache"
    base.mkdir(parents=True, exist_ok=True)
    where = Path(tempfile.mkdtemp(prefix="rlog-disk-ceiling-", dir=base))
    try:
        out: multiprocessing.Queue = multiprocessing.Queue()  # type: ignore[type-arg]
        ready = multiprocessing.Barrier(args.writers)
        load_before = load()
        procs = [
            multiprocessing.Process(
                target=_writer,
                args=(
                    str(where / f"w{i}"),
                    args.size,
                    piece,
                    args.seconds,
                    args.rewrite,
                    args.drop_behind,
                    ready,
                    out,
                ),
            )
            for i in range(args.writers)
        ]
        for p in procs:
            p.start()
        results = [out.get() for _ in procs]
        for p in procs:
            p.join()
    finally:
        shutil.rmtree(where, ignore_errors=True)
    total = sum(r["mb_per_s"] for r in results)
    summary = {
        "writers": args.writers,
        "size": args.size,
        "piece": piece,
        "seconds": args.seconds,
        "rewrite": args.rewrite,
        "drop_behind": args.drop_behind,
        "dir": str(base),
        "each_mb_per_s": [round(r["mb_per_s"], 1) for r in results],
        "each_syncs_per_s": [round(r["syncs_per_s"], 1) for r in results],
        "each_system_ms_per_mb": [round(r["system_ms_per_mb"], 2) for r in results],
        "each_sync_ms": [r["sync_ms"] for r in results],
        "total_mb_per_s": round(total, 1),
        "per_writer_share_mb_per_s": round(total / args.writers, 1),
        "load_before": load_before,
        "load_after": load(),
    }
    print(json.dumps(summary))
    if args.json:
        with args.json.open("a") as f:
            f.write(json.dumps(summary) + "\n")


if __name__ == "__main__":
    main()
