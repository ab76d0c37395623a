"""The replica's health for Kubernetes' native `grpc:` probes: the standard `grpc.health.v1`
service (grpcio-health-checking's servicer) on a plaintext port of its own.

- service "" (the server): SERVING while the replica process serves, from the moment its
  storage is open and its gRPC port bound, whatever its status (a replica catching up is
  alive): the startup and liveness probes;
- service `READY_SERVICE` ("rlog.v1.Log"): SERVING only while the replica is VOTING: the
  readiness probe, so the client Service sends no client to a replica that is recovering;
- both NOT_SERVING from the moment the replica is asked to stop (it drains meanwhile).

Why a port of its own rather than the replica's gRPC port: the kubelet's gRPC probe speaks
neither TLS nor mutual TLS, and the replica's port requires both when TLS is on. The health
port serves that one service and nothing else, in plaintext, whatever the replica's
transport: what it tells (alive, VOTING) is less than the plaintext metrics port tells.
The alternative rejected: an `exec` probe running `rlog status` (a Python interpreter and a
gRPC client started in the pod every 10 s), which is what the replicas used before.
"""

from __future__ import annotations

import asyncio
from typing import TypeAlias

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# `health.aio` is the package's documented asyncio servicer; its re-export (`_async as
# aio`) is not one strict mypy counts as public.
from grpc_health.v1.health import aio as health_aio  # type: ignore[attr-defined]

from rlog.proto import rlog_pb2 as pb

SERVER = ""  # the whole server, as the health protocol names it
READY_SERVICE = pb.DESCRIPTOR.services_by_name["Log"].full_name  # "rlog.v1.Log"

ServingStatus: TypeAlias = health_pb2.HealthCheckResponse.ServingStatus.ValueType
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def readiness(status: pb.Status.ValueType) -> ServingStatus:
    """What READY_SERVICE answers for a replica of this status: only a VOTING replica holds
    every chosen entry and takes part in quorums."""
    return SERVING if status == pb.VOTING else NOT_SERVING


class Health:
    """The health the port reports, kept current by `update` (the node calls it whenever
    it refreshes its status) and ended by `stopping`."""

    def __init__(self) -> None:
        self.servicer = health_aio.HealthServicer()
        self._ready: ServingStatus | None = None
        self._pending: set[asyncio.Task[None]] = set()

    def update(self, status: pb.Status.ValueType) -> None:
        """Report `status`; a change is handed to the servicer (whose `set` wakes its
        watchers, hence a task) in the order the changes came."""
        ready = readiness(status)
        if ready == self._ready:
            return
        self._ready = ready
        task = asyncio.get_running_loop().create_task(self.servicer.set(READY_SERVICE, ready))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def serving(self) -> None:
        """The replica serves: its storage open, its ports bound, its node started."""
        await self.servicer.set(SERVER, SERVING)

    async def stopping(self) -> None:
        """Every service NOT_SERVING for good: the replica was asked to stop."""
        await self.servicer.enter_graceful_shutdown()


async def serve_health(health: Health, host: str, port: int) -> grpc.aio.Server:
    """Start a plaintext gRPC server on host:port with the health service alone, every
    service NOT_SERVING until `health.serving()`."""
    await health.servicer.set(SERVER, NOT_SERVING)
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.servicer, server)
    try:
        server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:
        raise OSError(f"cannot listen on {host}:{port}: address in use or invalid") from None
    await server.start()
    return server
