"""Catch-up speed of a wiped replica (issue 4): a 3-replica log holding `--megabytes` of
`--size`-byte entries; one follower loses its data dir and restarts; the time from its start
until it is VOTING again gives MB/s.

    .venv/bin/python bench/catchup.py [--megabytes 200] [--size 4096] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from rlog.client import Client
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=200)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--per-call", type=int, default=256)
    parser.add_argument("--dir", default=str(Path.home() / ".cache/rlog-bench/catchup"))
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    entries = int(args.megabytes * 1e6 // args.size)
    value = b"c" * args.size
    with DevCluster(3, root, election_timeout=1.0) as cluster:
        leader = cluster.wait_for_leader()
        started = time.monotonic()
        with Client(cluster.endpoints[leader], append_timeout=120) as client:
            written = 0
            while written < entries:
                n = min(args.per_call, entries - written)
                client.append([value] * n)
                written += n
        fill_seconds = time.monotonic() - started
        victim = next(i for i in range(3) if i != leader)
        cluster.wipe(victim)
        started = time.monotonic()
        cluster.start_replica(victim)
        seen_recovering = False
        while True:
            status = cluster.statuses(timeout=2)[victim]
            if status is not None:
                seen_recovering |= status.status == pb.RECOVERING
                if status.status == pb.VOTING:
                    break
            time.sleep(0.02)
        seconds = time.monotonic() - started
        learned = cluster.status(victim).learned
    megabytes = entries * args.size / 1e6
    result = {
        "entries": entries,
        "entry_bytes": args.size,
        "megabytes": round(megabytes, 1),
        "fill_seconds": round(fill_seconds, 2),
        "fill_mb_per_s": round(megabytes / fill_seconds, 1),
        "catchup_seconds": round(seconds, 2),
        "catchup_mb_per_s": round(megabytes / seconds, 1),
        "catchup_entries_per_s": round(entries / seconds),
        "victim_learned": learned,
        "seen_recovering": seen_recovering,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
