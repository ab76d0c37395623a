"""The floor of a serial append on this stack, with no rlog code: `bench/append_floor.py`.

    bench/append_floor.py --rounds 3 [--loop uvloop] [--count 2000]

A serial append crosses gRPC four times (client -> leader, leader -> follower, and back)
and waits for two syncs in parallel (the leader's and the follower's; the quorum of three is
those two). This script builds exactly that path from bare grpc.aio and os.fdatasync in
three processes, with nothing else in it:

- a "follower" process serves a bidirectional stream; for each message it writes the
  message to a file and fdatasyncs it (`--sync`), then answers 8 bytes;
- a "leader" process serves a unary call; for each request it sends the request on its
  open stream to the follower, writes and fdatasyncs the request to a file of its own in
  a thread meanwhile (`--sync`), and answers when both are done;
- the client (this process) makes `--count` unary calls one after the other, 1 KiB each,
  and prints the median and p99 round trip, and the leader's and the follower's CPU time
  per call (to set beside a replica's CPU per serial append).

Variants per round, in turn so they see the same load: `hops` (no syncs: the gRPC
crossings and the event loops alone), `synced` (the two syncs as well). A third row times
one bare unary round trip client -> leader (what one crossing pair costs). Compare the
`synced` median with etcd's serial put measured in the same minutes (`bench/etcd_put.py`):
no rlog code can make a serial append faster than this floor on this machine.
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

import grpc
import harness
from machine import cpu_seconds

PAYLOAD = 1100  # a 1 KiB append with its framing
_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 1024 * 1024),
    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
]
WARMUP = 100  # untimed calls first


def _same(data: bytes) -> bytes:
    return data


def _run(loop: str, main: Any) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def _append_synced(fd: int, data: bytes) -> None:
    os.write(fd, data)
    os.fdatasync(fd)


async def follower(port: int, path: str, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    async def stream(requests: Any, context: Any) -> Any:
        async for request in requests:
            if sync:
                # In a thread, as a replica's storage does (its loop stays free).
                await asyncio.to_thread(_append_synced, fd, request)
            yield b"accepted"

    methods = {"Write": grpc.stream_stream_rpc_method_handler(stream, _same, _same)}
    await harness.serve(port, "floor.Follower", methods, _OPTIONS)


async def leader(port: int, follower_port: int, path: str, sync: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{follower_port}", options=_OPTIONS)
    call = channel.stream_stream("/floor.Follower/Write", _same, _same)(None)
    lock = asyncio.Lock()  # one write on the stream at a time, answers in order

    async def to_follower(request: bytes) -> None:
        async with lock:
            await call.write(request)
            await call.read()

    async def append(request: bytes, context: Any) -> bytes:
        if sync:
            await asyncio.gather(
                to_follower(request), asyncio.to_thread(_append_synced, fd, request)
            )
        else:
            await to_follower(request)
        return b"chosen"

    async def ping(request: bytes, context: Any) -> bytes:
        return b"pong"

    methods = {
        "Append": grpc.unary_unary_rpc_method_handler(append, _same, _same),
        "Ping": grpc.unary_unary_rpc_method_handler(ping, _same, _same),
    }
    await harness.serve(port, "floor.Leader", methods, _OPTIONS)


async def client(port: int, count: int, method: str, payload_size: int) -> dict[str, float]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=_OPTIONS) as channel:
        call = channel.unary_unary(f"/floor.Leader/{method}", _same, _same)
        payload = os.urandom(payload_size)
        for _ in range(WARMUP):
            await call(payload)
        times = []
        for _ in range(count):
            started = time.perf_counter()
            await call(payload)
            times.append(time.perf_counter() - started)
    times.sort()
    return {
        "p50_ms": round(statistics.median(times) * 1000, 3),
        "p99_ms": round(times[int(len(times) * 0.99) - 1] * 1000, 3),
    }


def _start(args: list[str]) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), *args], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None
    if process.stdout.readline().strip() != "ready":
        process.kill()
        raise SystemExit(f"{args[0]} did not start")
    return process


def one(
    loop: str, variant: str, count: int, port: int, workdir: str, payload: int
) -> dict[str, Any]:
    sync = "1" if variant == "synced" else "0"
    processes = [
        _start(["--as-follower", loop, str(port + 1), f"{workdir}/follower.data", sync]),
        _start(["--as-leader", loop, str(port), str(port + 1), f"{workdir}/leader.data", sync]),
    ]
    load = Path("/proc/loadavg").read_text().split()[0]
    try:
        method = "Ping" if variant == "ping" else "Append"
        before = [cpu_seconds(p.pid) for p in processes]
        client_before = time.process_time()
        result = _run(loop, client(port, count, method, payload))
        client_cpu = time.process_time() - client_before
        after = [cpu_seconds(p.pid) for p in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait()
    calls = count + WARMUP
    cpu = {
        f"{name}_cpu_us_per_call": round((b - a) / calls * 1e6)
        for name, a, b in zip(("follower", "leader"), before, after, strict=True)
    }
    cpu["client_cpu_us_per_call"] = round(client_cpu / calls * 1e6)
    return {
        "variant": variant,
        "loop": loop,
        "load": load,
        "payload": payload,
        "count": count,
        **result,
        **cpu,
    }


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--as-follower":
        loop, port, path, sync = sys.argv[2:6]
        _run(loop, follower(int(port), path, sync == "1"))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "--as-leader":
        loop, port, follower_port, path, sync = sys.argv[2:7]
        _run(loop, leader(int(port), int(follower_port), path, sync == "1"))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--count", type=int, default=2000, help="timed calls per variant")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument(
        "--payload", type=int, default=PAYLOAD, help="bytes per call (65600: 64 x 1 KiB)"
    )
    parser.add_argument("--port", type=int, default=23890)
    parser.add_argument(
        "--dir", default=str(Path.home() / ".cache"), help="where the synced files go (a real disk)"
    )
    parser.add_argument("--json", metavar="FILE", help="also append the rows here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="append-floor-") as workdir:
        for _ in range(args.rounds):
            for variant in ("ping", "hops", "synced"):
                row = one(args.loop, variant, args.count, args.port, workdir, args.payload)
                print(json.dumps(row), flush=True)
                if args.json:
                    with open(args.json, "a") as out:
                        out.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
