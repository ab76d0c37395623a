"""Synced writes by the kind of file space they land on: appended (new space), over space
`posix_fallocate` reserved first, and over space written with zeros first.

    python bench/synced_space.py [--size 262144] [--writers 3] [--seconds 5] [--rounds 2]
                                 [--modes new,falloc,zeroed] [--dir ~/.cache/rlog-bench]

Each of `--writers` processes (one per replica) writes `--size` bytes and fdatasyncs, over
and over for `--seconds`, into its own file; one line per mode and round with each writer's
MB/s and syncs/s (docs/performance.md, "Tried and not taken": why the segment engine does
not zero-fill ahead although the zeroed rows are the fastest).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import time
from pathlib import Path

SPACE = 256 << 20  # bytes each writer's file may take


def writer(path: Path, mode: str, size: int, seconds: float, out: multiprocessing.Queue) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if mode == "falloc":
            os.posix_fallocate(fd, 0, SPACE)
            os.fsync(fd)
        elif mode == "zeroed":
            zeros = bytes(1 << 20)
            for _ in range(SPACE >> 20):
                os.write(fd, zeros)
            os.fsync(fd)
        os.lseek(fd, 0, os.SEEK_SET)
        data = os.urandom(size)
        writes = 0
        start = time.perf_counter()
        while time.perf_counter() < start + seconds and (writes + 1) * size <= SPACE:
            os.write(fd, data)
            os.fdatasync(fd)
            writes += 1
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        path.unlink()
    out.put((writes * size / elapsed / 1e6, writes / elapsed))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=256 << 10, help="bytes per synced write")
    parser.add_argument("--writers", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="new,falloc,zeroed")
    parser.add_argument("--dir", default=str(Path.home() / ".cache" / "rlog-bench"))
    args = parser.parse_args()
    modes = args.modes.split(",")
    unknown = set(modes) - {"new", "falloc", "zeroed"}
    if unknown:
        parser.error(f"unknown modes {sorted(unknown)}: new, falloc, zeroed")
    work = Path(args.dir) / "synced-space"
    work.mkdir(parents=True, exist_ok=True)
    for _ in range(args.rounds):
        for mode in modes:
            out: multiprocessing.Queue = multiprocessing.Queue()
            procs = [
                multiprocessing.Process(
                    target=writer, args=(work / f"w{i}-{mode}", mode, args.size, args.seconds, out)
                )
                for i in range(args.writers)
            ]
            for proc in procs:
                proc.start()
            for proc in procs:
                proc.join()
            rates = [out.get() for _ in procs]
            mb = ", ".join(f"{m:.0f}" for m, _ in rates)
            syncs = ", ".join(f"{s:.0f}" for _, s in rates)
            print(f"{mode:7s} {args.size:>9d} B: MB/s each {mb}; syncs/s each {syncs}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
