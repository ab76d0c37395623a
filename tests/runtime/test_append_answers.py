"""How an append on the `AppendStream` or the append lane is answered (rlog/runtime/appends.py
`answer`): its positions, a refusal's error, a storage fault's error (a full disk, a corrupt
record) as the unary `Append` ends with it; and an append that raises anything else ends its
stream with an error, so the client never waits for an answer that never comes.

The replica is a stand-in whose `append` returns positions or raises what the test gives it;
the stream tests serve it with the real `LogService` on a real gRPC server in this process,
and append with the real client."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest

from rlog.client import AsyncClient
from rlog.client.errors import OutcomeUnknown, ResourceExhausted, Timeout
from rlog.config import ReplicaConfig
from rlog.lane.append import AppendLaneHandler
from rlog.packed import pack
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.protocol.admission import Conditions
from rlog.runtime import appends
from rlog.runtime.budgets import ReplicaBudget
from rlog.runtime.errors import RpcError
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.server import LogService
from rlog.storage.base import CorruptRecord, DiskFull
from rlog.wire import Reason

ENOSPC = "data dir /data: no space left on the device (segment write: No space left on device)"


class Replica:
    """Appends at positions from 1, or raises `fault`; keeps the faults it was told of."""

    def __init__(self, fault: BaseException | None = None) -> None:
        self.fault = fault
        self.next = 1
        self.faults_seen: list[CorruptRecord] = []
        self.metrics = ReplicaMetrics(0)
        self.config = ReplicaConfig(0, ["127.0.0.1:1"], Path("unused"))
        self.budget = ReplicaBudget(0, 1 << 30, 1 << 26)
        self.appender = self.coordinator_driver = self.reads = self  # drivers the service calls

    async def append(
        self, data: bytes, offsets: bytes, forwarded: bool, conditions: Conditions
    ) -> list[int]:
        if self.fault is not None:
            raise self.fault
        count = len(offsets) // 4 - 1
        positions = list(range(self.next, self.next + count))
        self.next += count
        return positions

    def storage_fault_seen(self, exc: CorruptRecord) -> None:
        self.faults_seen.append(exc)


def request(request_id: int = 7, values: tuple[bytes, ...] = (b"a", b"b")) -> pb.AppendRequest:
    data, offsets = pack(list(values))
    return pb.AppendRequest(id=request_id, data=data, offsets=offsets)


async def test_positions_are_answered_with_the_request_id() -> None:
    response = await appends.answer(Replica(), request(), False)
    assert (response.id, response.code, response.first, response.count) == (7, 0, 1, 2)


async def test_a_refusal_is_answered_with_its_reason() -> None:
    replica = Replica(RpcError(Reason.NOT_LEADER, "this replica is not the leader"))
    response = await appends.answer(replica, request(), False)
    assert response.id == 7
    assert response.code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert response.reason == Reason.NOT_LEADER.value
    assert response.error == "this replica is not the leader"


async def test_a_full_disk_is_answered_disk_full() -> None:
    response = await appends.answer(Replica(DiskFull(ENOSPC)), request(), False)
    assert response.id == 7
    assert response.code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
    assert response.reason == Reason.DISK_FULL.value
    assert response.error == ENOSPC


async def test_a_corrupt_record_is_answered_corrupt_record_and_reported() -> None:
    fault = CorruptRecord(41, "checksum mismatch")
    replica = Replica(fault)
    response = await appends.answer(replica, request(), False)
    assert response.id == 7
    assert response.code == grpc.StatusCode.DATA_LOSS.value[0]
    assert response.reason == Reason.CORRUPT_RECORD.value
    assert "position 41 is corrupt" in response.error
    assert replica.faults_seen == [fault]  # the replica repairs it


async def test_anything_else_propagates() -> None:
    with pytest.raises(RuntimeError, match="a bug"):
        await appends.answer(Replica(RuntimeError("a bug")), request(), False)


class _Transport:
    def __init__(self) -> None:
        self.closed = asyncio.Event()

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...

    def is_closing(self) -> bool:
        return self.closed.is_set()

    def close(self) -> None:
        self.closed.set()


async def test_the_lane_answers_a_full_disk_disk_full() -> None:
    sent: list[bytes] = []
    lane = AppendLaneHandler(
        Replica(DiskFull(ENOSPC)),
        _Transport(),  # type: ignore[arg-type]
        sent.append,
        lambda: None,
        ReplicaBudget(0, 1 << 30, 1 << 26).stream(),
    )
    assert lane.frame(request(3).SerializeToString()) == ""
    while not sent:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    response = pb.AppendResponse.FromString(sent[0])
    assert (response.id, response.reason, response.error) == (3, Reason.DISK_FULL.value, ENOSPC)


async def test_a_lane_append_that_raises_closes_the_lane_not_in_silence(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A bug (not a refusal, not a storage fault) has no answer to give: the lane closes,
    # which fails every append pending on it at the client at once, as the AppendStream
    # ends with INTERNAL; the append that raised is logged.
    sent: list[bytes] = []
    transport = _Transport()
    lane = AppendLaneHandler(
        Replica(RuntimeError("a bug")),
        transport,  # type: ignore[arg-type]
        sent.append,
        lambda: None,
        ReplicaBudget(0, 1 << 30, 1 << 26).stream(),
    )
    with caplog.at_level(logging.ERROR, logger="rlog.lane"):
        assert lane.frame(request(3).SerializeToString()) == ""
        await asyncio.wait_for(transport.closed.wait(), 10)
    assert sent == []
    assert "a bug" in caplog.text


async def all_released(replica: HeldReplica) -> None:
    """Every byte the budget lent is given back. The server releases an answer's share once
    its write returns, which can be after the client has read the answer: a check made right
    after the last read raced that (512 bytes still out, under four test workers)."""
    budget = replica.budget.budget
    for _ in range(1000):
        if budget.in_flight == 0:
            return
        await asyncio.sleep(0.01)
    assert budget.in_flight == 0, f"{budget.in_flight} bytes never given back"


async def serve(replica: Replica) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pbg.add_LogServicer_to_server(LogService(replica), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


StreamTo = Callable[[Replica], Awaitable[AsyncClient]]


@pytest.fixture
async def stream_to() -> AsyncIterator[StreamTo]:
    """`stream_to(replica)`: a stream client (no sessions, 20 s per append) of the
    replica served in this process."""
    servers: list[grpc.aio.Server] = []
    clients: list[AsyncClient] = []

    async def open_client(replica: Replica) -> AsyncClient:
        server, address = await serve(replica)
        servers.append(server)
        client = AsyncClient([address], stream=True, exactly_once=False, append_timeout=20)
        clients.append(client)
        return client

    yield open_client
    for client in clients:
        await client.close()
    for server in servers:
        await server.stop(None)


async def test_a_stream_append_on_a_full_disk_is_answered_disk_full(stream_to: StreamTo) -> None:
    client = await stream_to(Replica(DiskFull(ENOSPC)))
    with pytest.raises(ResourceExhausted, match="no space left"):
        await client.append([b"a", b"b"])


async def test_a_stream_append_that_raises_ends_the_stream_not_in_silence(
    stream_to: StreamTo, caplog: pytest.LogCaptureFixture
) -> None:
    replica = Replica()
    client = await stream_to(replica)
    assert await client.append([b"a"]) == [1]
    replica.fault = RuntimeError("a bug")
    with caplog.at_level(logging.ERROR, logger="rlog.server"):
        with pytest.raises(OutcomeUnknown) as raised:
            await client.append([b"b"])
    assert not isinstance(raised.value, Timeout)  # the stream broke; no deadline ran out
    assert "an append on this stream failed: RuntimeError('a bug')" in str(raised.value)
    assert "an append on an AppendStream failed" in caplog.text
    assert "a bug" in caplog.text
    # The client opens a new stream for its next append.
    replica.fault = None
    assert await client.append([b"c"]) == [2]


class HeldReplica(Replica):
    """Every append waits for `go`; the appends started so far are counted, and the
    stream-budget waits of its `budget` recorded."""

    def __init__(self, stream_limit: int) -> None:
        super().__init__()
        self.go = asyncio.Event()
        self.started = 0
        self.waits: list[str] = []
        self.budget = ReplicaBudget(0, 1 << 30, stream_limit, on_wait=self.waits.append)

    async def append(
        self, data: bytes, offsets: bytes, forwarded: bool, conditions: Conditions
    ) -> list[int]:
        self.started += 1
        await self.go.wait()
        return await super().append(data, offsets, forwarded, conditions)


async def test_an_append_stream_over_its_budget_is_not_read_until_answers_go_out() -> None:
    # Appends of 100 KiB against a stream budget of 256 KiB: two are admitted (with their
    # answers' share); the stream's third is read and waits for room, and the stream is
    # read no further (backpressure, no error) until appends are answered; then all are.
    replica = HeldReplica(256 * 1024)
    server, address = await serve(replica)
    channel = grpc.aio.insecure_channel(address)
    try:
        call = channel.stream_stream(
            "/rlog.v1.Log/AppendStream",
            request_serializer=pb.AppendRequest.SerializeToString,
            response_deserializer=pb.AppendResponse.FromString,
        )()

        async def send() -> None:
            for i in range(1, 11):
                await call.write(request(i, (b"v" * 100 * 1024,)))
            await call.done_writing()

        sending = asyncio.ensure_future(send())
        for _ in range(1000):  # the reader reaches the third append
            if replica.waits:
                break
            await asyncio.sleep(0.01)
        assert replica.waits == ["stream"], f"{replica.started} appends read, none held back"
        assert replica.started == 2
        replica.go.set()
        answers = [await call.read() for _ in range(10)]
        assert sorted(a.id for a in answers) == list(range(1, 11))
        assert all(a.code == 0 and a.count == 1 for a in answers)
        await sending
        await all_released(replica)
    finally:
        await channel.close()
        await server.stop(None)


async def test_a_unary_append_over_the_replica_budget_is_refused_before_its_deadline() -> None:
    # The replica's budget holds one 100 KiB append (held); a second unary Append waits its
    # turn until shortly before its deadline, then is refused RESOURCE_EXHAUSTED
    # (LIMIT_EXCEEDED), nothing appended; once room comes back the same append goes through.
    replica = HeldReplica(1 << 30)
    replica.budget = ReplicaBudget(0, 150 * 1024, 1 << 30)
    server, address = await serve(replica)
    channel = grpc.aio.insecure_channel(address)
    try:
        append = channel.unary_unary(
            "/rlog.v1.Log/Append",
            request_serializer=pb.AppendRequest.SerializeToString,
            response_deserializer=pb.AppendResponse.FromString,
        )
        held = asyncio.ensure_future(append(request(1, (b"v" * 100 * 1024,)), timeout=30))
        for _ in range(1000):
            if replica.started:
                break
            await asyncio.sleep(0.01)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await append(request(2, (b"w" * 100 * 1024,)), timeout=1.0)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-inflight-bytes" in (refused.value.details() or "")
        trailers = dict(refused.value.trailing_metadata() or ())
        assert Reason.LIMIT_EXCEEDED.value in trailers.values()
        assert replica.started == 1  # the refused one never reached the replica
        replica.go.set()
        assert (await held).count == 1
        assert (await append(request(3, (b"x" * 100 * 1024,)), timeout=30)).count == 1
        await all_released(replica)
    finally:
        await channel.close()
        await server.stop(None)
