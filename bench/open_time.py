"""How long a replica's storage takes to open (a restart) as its log grows: `bench/open_time.py`.

    .venv/bin/python bench/open_time.py [--engines lmdb,segment] [--megabytes 256,1024]
                                        [--dir DIR] [--full-replay]

For each engine and size, writes a data dir of that many MiB of 1 KiB values in two shapes
(runs of 64 values, as batched appends store them; single values, as serial appends do),
closes it and opens it twice (the page cache warm both times, as after a process restart),
then a third time under tracemalloc for the Python heap the open store holds (the segment
engine's index; LMDB keeps its pages in the page cache, not the heap), printing one JSON
line per cell. `--full-replay` removes the segment engine's index
snapshots before opening (what opening cost before them). The data dir must be on a real
disk.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "replica_image"))

from rlog import packed
from rlog.proto import rlog_pb2 as pb
from rlog.storage import WriteBatch, open_storage

HEAD = pb.Action(type=pb.APPEND, performed=1, learned=True, origin_proposal=1)


def fill(directory: Path, engine: str, megabytes: int, per_run: int) -> None:
    store = open_storage(directory, engine)
    position, written, total = 1, 0, megabytes << 20
    value = b"x" * 1024
    data, offsets = packed.pack([value] * per_run)
    try:
        while written < total:
            runs = []
            for _ in range(max(1, 64 // per_run)):
                runs.append(packed.make_run(position, HEAD, data, offsets))
                position += per_run
                written += 1024 * per_run
            store.apply(WriteBatch(runs=runs, sync=False))
        store.apply(WriteBatch(metadata=pb.Metadata(status=pb.VOTING, log_id="open-time")))
    finally:
        store.close()


def timed_open(directory: Path, engine: str) -> float:
    started = time.perf_counter()
    store = open_storage(directory, engine)
    elapsed = time.perf_counter() - started
    store.close()
    return elapsed


def held_heap(directory: Path, engine: str) -> tuple[float, float]:
    """MiB of Python heap the open store holds, and the peak while opening."""
    tracemalloc.start()
    try:
        store = open_storage(directory, engine)
        held, peak = tracemalloc.get_traced_memory()
        store.close()
    finally:
        tracemalloc.stop()
    return held / 2**20, peak / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", default="lmdb,segment")
    parser.add_argument("--megabytes", default="256,1024")
    parser.add_argument("--dir", default=str(Path.home() / ".cache/rlog-bench/open-time"))
    parser.add_argument("--full-replay", action="store_true")
    args = parser.parse_args()
    root = Path(args.dir)
    for megabytes in (int(m) for m in args.megabytes.split(",")):
        for shape, per_run in (("runs of 64", 64), ("single values", 1)):
            for engine in args.engines.split(","):
                shutil.rmtree(root, ignore_errors=True)
                root.mkdir(parents=True)
                directory = root / engine
                fill(directory, engine, megabytes, per_run)
                if args.full_replay:
                    for snapshot in directory.glob("segments/*.idx"):
                        snapshot.unlink()
                first = timed_open(directory, engine)
                again = timed_open(directory, engine)
                held, peak = held_heap(directory, engine)
                print(
                    json.dumps(
                        {
                            "engine": engine,
                            "megabytes": megabytes,
                            "shape": shape,
                            "full_replay": args.full_replay,
                            "open_ms": round(first * 1e3, 1),
                            "open_again_ms": round(again * 1e3, 1),
                            "records": megabytes * 1024 // per_run,
                            "heap_held_mb": round(held, 1),
                            "heap_peak_mb": round(peak, 1),
                        }
                    ),
                    flush=True,
                )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
