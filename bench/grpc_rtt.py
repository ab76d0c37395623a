"""gRPC's own cost of a round trip between two Python processes: `bench/grpc_rtt.py`.

    bench/grpc_rtt.py --rounds 3 --variant asyncio: --variant uvloop: \\
        --variant asyncio:grpc.http2.bdp_probe=0

No rlog code: a grpc.aio server in a child process echoes 1,100 bytes, by a unary call and
as one message on a bidirectional stream; the client times 2,000 of each (after 200 untimed)
and prints the median round trip in µs. With `--raw`, the same child also echoes on a plain
asyncio TCP connection (TCP_NODELAY, the bytes as they come), timed the same way
(`raw_us`): what a message costs without gRPC (the write lane's transport). A variant is
`LOOP:OPTION=VALUE,...` (the event loop of both processes, gRPC options of both the server
and the channel); the variants run in turn, `--rounds` times, so they see the same load
drift.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import grpc
import harness

PAYLOAD = 1100  # about a 1 KiB append with its framing
REPLY = 0  # answer with the first REPLY bytes of the request (0: the whole request)
RAW = False  # also time a plain asyncio connection (port + 1)
TIMED = 2000
UNTIMED = 200


def options_of(spec: str) -> list[tuple[str, int]]:
    out = []
    for item in filter(None, spec.split(",")):
        name, _, value = item.partition("=")
        out.append((name, int(value)))
    return out


def _same(data: bytes) -> bytes:
    return data


async def serve(port: int, options: list[tuple[str, int]]) -> None:
    async def unary(request: bytes, context: Any) -> bytes:
        return request[:REPLY] if REPLY else request

    async def bidi(requests: Any, context: Any) -> Any:
        async for request in requests:
            yield request[:REPLY] if REPLY else request

    methods = {
        "Unary": grpc.unary_unary_rpc_method_handler(unary, _same, _same),
        "Stream": grpc.stream_stream_rpc_method_handler(bidi, _same, _same),
    }
    await asyncio.get_running_loop().create_server(_Echo, "127.0.0.1", port + 1)
    await harness.serve(port, "rtt.Echo", methods, options)


def _no_delay(transport: Any) -> None:
    transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Echo(asyncio.Protocol):
    """Answers every PAYLOAD bytes received with REPLY bytes (or the same count)."""

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.received = 0
        _no_delay(transport)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        while self.received >= PAYLOAD:
            self.received -= PAYLOAD
            self.transport.write(b"r" * (REPLY or PAYLOAD))


class _Timer(asyncio.Protocol):
    def __init__(self) -> None:
        self.received = 0
        self.answer: asyncio.Future[None] | None = None

    def connection_made(self, transport: Any) -> None:
        _no_delay(transport)

    def data_received(self, data: bytes) -> None:
        self.received += len(data)
        if self.received >= (REPLY or PAYLOAD) and self.answer is not None:
            self.received -= REPLY or PAYLOAD
            self.answer.set_result(None)


async def measure_raw(port: int) -> int:
    loop = asyncio.get_running_loop()
    transport, timer = await loop.create_connection(_Timer, "127.0.0.1", port + 1)
    payload = os.urandom(PAYLOAD)
    times = []
    for k in range(UNTIMED + TIMED):
        timer.answer = loop.create_future()
        started = time.perf_counter()
        transport.write(payload)
        await timer.answer
        if k >= UNTIMED:
            times.append(time.perf_counter() - started)
    transport.close()
    return round(statistics.median(times) * 1e6)


async def measure(port: int, options: list[tuple[str, int]]) -> dict[str, float]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options)
    unary = channel.unary_unary("/rtt.Echo/Unary", _same, _same)
    stream = channel.stream_stream("/rtt.Echo/Stream", _same, _same)
    payload = os.urandom(PAYLOAD)
    for _ in range(UNTIMED):
        await unary(payload)
    unary_times = []
    for _ in range(TIMED):
        started = time.perf_counter()
        await unary(payload)
        unary_times.append(time.perf_counter() - started)
    call = stream()
    for _ in range(UNTIMED):
        await call.write(payload)
        await call.read()
    stream_times = []
    for _ in range(TIMED):
        started = time.perf_counter()
        await call.write(payload)
        await call.read()
        stream_times.append(time.perf_counter() - started)
    call.cancel()
    await channel.close()
    result = {
        "unary_us": round(statistics.median(unary_times) * 1e6),
        "stream_message_us": round(statistics.median(stream_times) * 1e6),
    }
    if RAW:
        result["raw_us"] = await measure_raw(port)
    return result


def run(loop: str, main: Coroutine[Any, Any, Any]) -> Any:
    if loop == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def one(variant: str, port: int) -> dict[str, Any]:
    loop, _, spec = variant.partition(":")
    server = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__).resolve()),
            "--serve",
            str(port),
            variant,
            str(PAYLOAD),
            str(REPLY),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        server.stdout.readline()  # "ready"
        result = run(loop, measure(port, options_of(spec)))
    finally:
        server.kill()
        server.wait()
    load = Path("/proc/loadavg").read_text().split()[0]
    return {"variant": variant, "load": load, **result}


def main() -> int:
    global PAYLOAD, REPLY, TIMED, RAW
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        loop, _, spec = sys.argv[3].partition(":")
        PAYLOAD, REPLY = int(sys.argv[4]), int(sys.argv[5])
        run(loop, serve(int(sys.argv[2]), options_of(spec)))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--variant", action="append", required=True, metavar="LOOP:OPTIONS")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--port", type=int, default=23990)
    parser.add_argument("--payload", type=int, default=PAYLOAD, help="request bytes")
    parser.add_argument(
        "--reply", type=int, default=REPLY, help="answer bytes (default: echo the request)"
    )
    parser.add_argument("--timed", type=int, default=TIMED, help="timed round trips of each")
    parser.add_argument(
        "--raw", action="store_true", help="also a plain asyncio TCP connection (raw_us)"
    )
    args = parser.parse_args()
    PAYLOAD, REPLY, TIMED, RAW = args.payload, args.reply, args.timed, args.raw
    for _ in range(args.rounds):
        for variant in args.variant:
            print(json.dumps(one(variant, args.port)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
