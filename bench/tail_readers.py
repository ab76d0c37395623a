"""What Tail readers that never read cost a replica (a hostile client, docs/faults.md): a 3-replica
log; `--readers` Tail calls from position 1 on replica 0 that are never read (their client's gRPC
receives until its flow-control window is full, the application takes nothing); then 32 MiB are
appended (32 calls of 4 x 256 KiB). Prints replica 0's RSS before and after, the RSS per reader, and
how long the appends took (the readers compete with them for the replica's event loop).

    .venv/bin/python bench/tail_readers.py [--readers 64] [--tail-response-bytes N]

Compare builds by running it with each build's package first on PYTHONPATH (the replicas are
started with the same interpreter and environment).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import grpc

from rlog.client import Client
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster
from rlog.wire import CLIENT_CHANNEL_OPTIONS


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--readers", type=int, default=64)
    parser.add_argument("--tail-response-bytes", type=int, default=None, metavar="N")
    args = parser.parse_args()
    replica_args = ["--max-tail-readers", str(max(args.readers, 1024))]
    if args.tail_response_bytes is not None:
        replica_args += ["--tail-response-bytes", str(args.tail_response_bytes)]
    with (
        tempfile.TemporaryDirectory() as root,
        DevCluster(3, Path(root), election_timeout=0.5, replica_args=replica_args) as cluster,
    ):
        with Client(cluster.endpoints) as client:
            client.append([b"first"])
        pid = cluster.pid(0) or 0
        channel = grpc.insecure_channel(cluster.endpoints[0], options=CLIENT_CHANNEL_OPTIONS)
        tail = channel.unary_stream("/rlog.v1.Log/Tail")
        request = pb.TailRequest(**{"from": 1}, stale=True).SerializeToString()
        before = rss_bytes(pid)
        calls = [tail(request) for _ in range(args.readers)]
        try:
            time.sleep(1.0)
            started = time.monotonic()
            with Client(cluster.endpoints) as client:
                for i in range(32):
                    client.append([bytes([i]) * (256 << 10) for _ in range(4)])
            took = time.monotonic() - started
            time.sleep(2.0)
            after = rss_bytes(pid)
        finally:
            for call in calls:
                call.cancel()
            channel.close()
    print(
        json.dumps(
            {
                "readers": args.readers,
                "tail_response_bytes": args.tail_response_bytes,
                "rss_before_mb": round(before / 1e6, 1),
                "rss_after_mb": round(after / 1e6, 1),
                "rss_per_reader_mb": round((after - before) / max(args.readers, 1) / 1e6, 2),
                "append_32mib_seconds": round(took, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
