"""The real Log service (`rlog.runtime.server.LogService`) in process, over a stand-in node
that a test scripts, for the tests of what a client makes of a replica's answers."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc

from rlog.config import (
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_MAX_STREAM_INFLIGHT_BYTES,
    ReplicaConfig,
)
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.runtime.budgets import ReplicaBudget
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.server import LogService


def equip(node: object) -> None:
    """Give a stand-in node what the service reads of a node besides its drivers: its
    metrics (the service counts its calls), its budgets (runtime/budgets.py, the defaults)
    and a config (its append timeout)."""
    node.metrics = ReplicaMetrics(0)  # type: ignore[attr-defined]
    if not hasattr(node, "budget"):
        node.budget = ReplicaBudget(  # type: ignore[attr-defined]
            0, DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MAX_STREAM_INFLIGHT_BYTES
        )
    if not hasattr(node, "config"):
        node.config = ReplicaConfig(0, ["127.0.0.1:1"], Path("unused"))  # type: ignore[attr-defined]


@contextlib.asynccontextmanager
async def serving(node: object) -> AsyncIterator[str]:
    """The real Log service over a stand-in node, on a loopback port: its address."""
    server = grpc.aio.server()
    equip(node)
    pbg.add_LogServicer_to_server(LogService(node), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(grace=None)
