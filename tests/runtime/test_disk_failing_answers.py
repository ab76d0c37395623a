"""What a replica whose disk fails answers (docs/faults.md, "A failing disk"): the writes
and appends that met the failing write end with UNAVAILABLE, reason DISK_FAILING and the
disk's error, never gRPC's UNKNOWN "Unexpected [StorageError]" (which is what a leader got
on its WriteStream to such a follower before).

The replica is a stand-in whose write's durability fails with the error the journal hands
its waiters when the disk fails (the engine's StorageError, caused by the OSError); the
real `ReplicaService` serves it on a real gRPC server in this process, called through the
real stub; appends go through the real `answer` of the AppendStream and the lane."""

from __future__ import annotations

import asyncio
import errno

import grpc
import pytest

from rlog.client.errors import OutcomeUnknownUnavailable, Unavailable, error_class
from rlog.packed import pack
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.runtime import appends
from rlog.runtime.leader_links import LeaderLinks
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.server import ReplicaService
from rlog.storage.base import CorruptRecord, StorageError
from rlog.wire import REASON, Reason


def disk_error() -> StorageError:
    """The error a segment write on a failing disk raises (and the journal passes on)."""
    try:
        try:
            raise OSError(errno.EIO, "Input/output error")
        except OSError as exc:
            raise StorageError(f"data dir /data: segment write failed: {exc}") from exc
    except StorageError as error:
        return error


class FailingReplica:
    """Decides every write ACCEPT; its batch's durability fails as on a failing disk."""

    def __init__(self) -> None:
        self.replica = self  # the service calls node.replica
        self.metrics = ReplicaMetrics(0)
        self.repair = self
        self.faults_seen: list[CorruptRecord] = []
        self.leader_links = LeaderLinks(lambda leader: None)  # the service counts streams

    def start_write(
        self, request: pb.WriteRequest
    ) -> tuple[pb.WriteResponse, asyncio.Future[None]]:
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(0.01, future.set_exception, disk_error())
        return pb.WriteResponse(verdict=pb.ACCEPT), future

    async def handle_write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        raise disk_error()

    async def append(self, *args: object) -> list[int]:
        raise disk_error()

    def storage_fault_seen(self, exc: CorruptRecord) -> None:
        self.faults_seen.append(exc)


async def serve(node: FailingReplica) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pbg.add_ReplicaServicer_to_server(ReplicaService(node), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


def check_disk_failing(error: grpc.aio.AioRpcError) -> None:
    assert error.code() == grpc.StatusCode.UNAVAILABLE, (error.code(), error.details())
    trailers = dict(error.trailing_metadata() or ())
    assert trailers.get(REASON) == Reason.DISK_FAILING.value
    assert "disk failing" in (error.details() or "")
    assert "Input/output error" in (error.details() or "")


async def test_a_write_stream_on_a_failing_disk_ends_unavailable_disk_failing() -> None:
    server, address = await serve(FailingReplica())
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            call = pbg.ReplicaStub(channel).WriteStream()
            await call.write(pb.WriteRequest(proposal=3, id=1))
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await asyncio.wait_for(call.read(), 10)
            check_disk_failing(raised.value)
    finally:
        await server.stop(None)


async def test_a_unary_write_on_a_failing_disk_ends_unavailable_disk_failing() -> None:
    server, address = await serve(FailingReplica())
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await pbg.ReplicaStub(channel).Write(pb.WriteRequest(proposal=3), timeout=10)
            check_disk_failing(raised.value)
    finally:
        await server.stop(None)


async def test_an_append_on_a_failing_disk_is_answered_disk_failing() -> None:
    data, offsets = pack([b"a"])
    response = await appends.answer(
        FailingReplica(), pb.AppendRequest(id=5, data=data, offsets=offsets), False
    )
    assert response.id == 5 and response.reason == Reason.DISK_FAILING.value
    assert response.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert "Input/output error" in response.error
    # The client: retry elsewhere; an append's outcome is unknown (others may hold it).
    assert error_class(Reason.DISK_FAILING) is Unavailable
    assert error_class(Reason.DISK_FAILING, mutating=True) is OutcomeUnknownUnavailable
