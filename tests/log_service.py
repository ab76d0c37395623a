"""The real Log service (`rlog.runtime.server.LogService`) in process, over a stand-in node
that a test scripts, for the tests of what a client makes of a replica's answers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import grpc

from rlog.proto import rlog_pb2_grpc as pbg
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.server import LogService


@contextlib.asynccontextmanager
async def serving(node: object) -> AsyncIterator[str]:
    """The real Log service over a stand-in node, on a loopback port: its address."""
    server = grpc.aio.server()
    node.metrics = ReplicaMetrics(0)  # type: ignore[attr-defined]  # the service counts its calls
    pbg.add_LogServicer_to_server(LogService(node), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)
