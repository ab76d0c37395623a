"""What the segment engine's synced mark costs a synced batch on this disk:
`bench/synced_mark_cost.py [--batches 2000] [--rounds 6]`.

    .venv/bin/python bench/synced_mark_cost.py --dir ~/.cache

A synced batch of the segment engine is a frame appended to the active segment and one
fdatasync of it; after it the engine rewrites its synced mark (`segments/synced`, 24 bytes)
in place with one pwrite and no sync of its own (storage/segment_engine.py). This times the
two shapes in the same files, in rounds that alternate which goes first (the load of a
shared machine drifts): "frame" (write 1 KiB + fdatasync) and "frame+mark" (the same, then
the pwrite of the mark), and prints per round the median and p90 per batch, and the medians
of the rounds. The pwrite itself costs microseconds; what could cost more is the disk work
the dirty mark adds to later syncs (its inode's times, its page written back), which shows
here as a slower fdatasync.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import load


def run(directory: Path, batches: int, mark: bool) -> list[float]:
    """Per-batch times (µs) of `batches` synced 1 KiB frames, with or without the mark."""
    frame = os.urandom(1024)
    seg = os.open(directory / "segment", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    mark_fd = os.open(directory / "synced", os.O_RDWR | os.O_CREAT, 0o644)
    os.pwrite(mark_fd, bytes(24), 0)
    os.fsync(mark_fd)
    times = []
    size = 0
    try:
        for _ in range(batches):
            t0 = time.perf_counter_ns()
            os.lseek(seg, size, os.SEEK_SET)
            size += os.write(seg, frame)
            os.fdatasync(seg)
            if mark:
                os.pwrite(mark_fd, size.to_bytes(8, "little") * 3, 0)
            times.append((time.perf_counter_ns() - t0) / 1000)
    finally:
        os.close(seg)
        os.close(mark_fd)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--dir", type=Path, default=Path.home() / ".cache")
    args = parser.parse_args()
    medians: dict[str, list[float]] = {"frame": [], "frame+mark": []}
    with tempfile.TemporaryDirectory(prefix="rlog-mark-", dir=args.dir) as d:
        for r in range(args.rounds):
            order = [False, True] if r % 2 == 0 else [True, False]
            for mark in order:
                name = "frame+mark" if mark else "frame"
                at = load()
                times = sorted(run(Path(d), args.batches, mark))
                p50 = statistics.median(times)
                p90 = times[int(len(times) * 0.9)]
                medians[name].append(p50)
                row = {"round": r, "shape": name, "load": at, "p50_us": p50, "p90_us": p90}
                print(json.dumps(row), flush=True)
    for name, values in medians.items():
        print(f"{name}: median of rounds' p50 {statistics.median(values):.0f} µs", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
