"""gRPC's own cost of a round trip between two Python processes: `bench/grpc_rtt.py`.

    bench/grpc_rtt.py --rounds 3 --variant asyncio: --variant uvloop: \\
        --variant asyncio:grpc.http2.bdp_probe=0

No rlog code: a grpc.aio server in a child process echoes 1,100 bytes, by a unary call and
as one message on a bidirectional stream; the client times 2,000 of each (after 200 untimed)
and prints the median round trip in µs. A variant is `LOOP:OPTION=VALUE,...` (the event loop
of both processes, gRPC options of both the server and the channel); the variants run in
turn, `--rounds` times, so they see the same load drift.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
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
    await harness.serve(port, "rtt.Echo", methods, options)


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
    return {
        "unary_us": round(statistics.median(unary_times) * 1e6),
        "stream_message_us": round(statistics.median(stream_times) * 1e6),
    }


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
    global PAYLOAD, REPLY, TIMED
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
    args = parser.parse_args()
    PAYLOAD, REPLY, TIMED = args.payload, args.reply, args.timed
    for _ in range(args.rounds):
        for variant in args.variant:
            print(json.dumps(one(variant, args.port)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
