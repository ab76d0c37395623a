"""The wire contract: a replica's error reaches the client as the class its `Reason` names,
whatever its message says. Errors are raised through the real replica services
(`rlog.runtime.server`) on an in-process gRPC server and caught by the real clients."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from types import SimpleNamespace

import grpc
import pytest
from log_service import equip, serving

from rlog.client import AsyncClient
from rlog.client.errors import (
    REASON_CLASSES,
    ConditionFailed,
    DataCorrupt,
    EntryTooLarge,
    EpochFromFuture,
    FailedPrecondition,
    InvalidArgument,
    LogIdMismatch,
    NotVoting,
    OutcomeUnknown,
    OutcomeUnknownTimeout,
    OutcomeUnknownUnavailable,
    OutOfRange,
    PastEnd,
    ResourceExhausted,
    RlogError,
    SequenceForgotten,
    SessionExpired,
    SessionNotYours,
    Timeout,
    Truncated,
    Unavailable,
    UnknownSession,
    error_class,
    error_for,
    from_rpc_error,
)
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.runtime.errors import RpcError
from rlog.runtime.server import LogService
from rlog.wire import (
    BEGIN,
    CLIENT_CHANNEL_OPTIONS,
    END,
    NOT_ATTEMPTED,
    REASON,
    ErrorDetails,
    Reason,
    not_attempted,
)

# The contract, written out: reason -> (class for a read, class for an append).
EXPECTED: dict[Reason, tuple[type[RlogError], type[RlogError]]] = {
    Reason.TRUNCATED: (Truncated, Truncated),
    Reason.PAST_END: (PastEnd, PastEnd),
    Reason.INVALID_ARGUMENT: (InvalidArgument, InvalidArgument),
    Reason.ENTRY_TOO_LARGE: (EntryTooLarge, EntryTooLarge),
    Reason.NOT_VOTING: (NotVoting, NotVoting),
    Reason.LOG_ID_MISMATCH: (LogIdMismatch, LogIdMismatch),
    Reason.PROTOCOL_TOO_OLD: (FailedPrecondition, FailedPrecondition),
    Reason.NO_LEADER: (Unavailable, Unavailable),
    Reason.NOT_LEADER: (Unavailable, Unavailable),
    Reason.LEADER_UNAVAILABLE: (Unavailable, Unavailable),
    Reason.NOT_LEARNED: (Unavailable, Unavailable),
    Reason.LEADERSHIP_UNCONFIRMED: (Unavailable, Unavailable),
    Reason.STOPPING: (Unavailable, OutcomeUnknownUnavailable),
    Reason.TIMEOUT: (Timeout, OutcomeUnknownTimeout),
    Reason.OUTCOME_UNKNOWN: (OutcomeUnknown, OutcomeUnknown),
    Reason.INTERNAL: (RlogError, RlogError),
    Reason.CONDITION_FAILED: (ConditionFailed, ConditionFailed),
    Reason.SESSION_EXPIRED: (SessionExpired, SessionExpired),
    Reason.SEQUENCE_FORGOTTEN: (SequenceForgotten, SequenceForgotten),
    Reason.EPOCH_FROM_FUTURE: (EpochFromFuture, EpochFromFuture),
    Reason.UNKNOWN_SESSION: (UnknownSession, UnknownSession),
    Reason.SESSION_NOT_YOURS: (SessionNotYours, SessionNotYours),
    # Nothing was proposed: a full disk or a limit refuses the request before the protocol.
    Reason.DISK_FULL: (ResourceExhausted, ResourceExhausted),
    Reason.LIMIT_EXCEEDED: (ResourceExhausted, ResourceExhausted),
    # A read met a corrupt record (never served); an append that met one may have been
    # proposed already.
    Reason.CORRUPT_RECORD: (DataCorrupt, OutcomeUnknown),
    # The replica's disk fails: nothing stored there, but an append may be chosen elsewhere.
    Reason.DISK_FAILING: (Unavailable, OutcomeUnknownUnavailable),
}


def test_every_reason_has_a_class():
    assert set(REASON_CLASSES) == set(Reason) == set(EXPECTED)
    for reason, (read_class, append_class) in EXPECTED.items():
        assert error_class(reason, mutating=False) is read_class, reason
        assert error_class(reason, mutating=True) is append_class, reason


def test_a_reason_that_changed_nothing_is_unavailable_and_marked():
    for reason in Reason:
        trailers = dict(ErrorDetails(reason).trailers())
        assert trailers[REASON] == reason.value
        assert (NOT_ATTEMPTED in trailers) == reason.not_attempted
        if reason.not_attempted:
            assert reason.code == grpc.StatusCode.UNAVAILABLE
            assert not issubclass(error_class(reason, mutating=True), OutcomeUnknown)


def test_trailers_round_trip():
    details = ErrorDetails(Reason.TRUNCATED, begin=12)
    assert ErrorDetails.from_metadata(details.trailers()) == details
    details = ErrorDetails(Reason.PAST_END, end=7)
    assert dict(details.trailers())[END] == "7" and BEGIN not in dict(details.trailers())
    assert ErrorDetails.from_metadata(details.trailers()) == details
    assert ErrorDetails.from_metadata(None) is None
    assert ErrorDetails.from_metadata(((REASON, "NO_SUCH_REASON"),)) is None
    assert not_attempted(ErrorDetails(Reason.NOT_LEADER).trailers())
    details = ErrorDetails(Reason.CONDITION_FAILED, next_position=9, epoch=0)
    assert ErrorDetails.from_metadata(details.trailers()) == details


def test_a_failed_condition_carries_the_next_position_and_epoch():
    error = error_for(
        grpc.StatusCode.FAILED_PRECONDITION,
        "condition failed",
        why=ErrorDetails(Reason.CONDITION_FAILED, next_position=9, epoch=3),
    )
    assert isinstance(error, ConditionFailed)
    assert (error.next_position, error.epoch) == (9, 3)


def test_without_a_reason_the_message_is_not_parsed():
    """An error with no reason did not come from an rlog server's verdict: its text is not
    searched for rlog's own phrases."""
    error = error_for(grpc.StatusCode.OUT_OF_RANGE, "position 3 is truncated: the log begins at 5")
    assert type(error) is OutOfRange
    error = error_for(grpc.StatusCode.INVALID_ARGUMENT, "exceeds the maximum entry size")
    assert type(error) is InvalidArgument
    # gRPC's own connect failures (its library's texts) still say no server was reached.
    error = error_for(
        grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses", "h:1", mutating=True
    )
    assert type(error) is Unavailable and "cannot reach h:1" in str(error)


def test_rpc_error_status_code_follows_the_reason():
    for reason in Reason:
        if reason is Reason.INTERNAL:
            with pytest.raises(ValueError):
                RpcError(reason, "x")
            assert RpcError(reason, "x", code=grpc.StatusCode.UNKNOWN).code == (
                grpc.StatusCode.UNKNOWN
            )
        else:
            assert RpcError(reason, "x").code == reason.code


# ---- a replica's verdict forwarded by another replica --------------------------------------


def _leader_error(
    code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str], ...] = ()
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailers), details=details
    )


def test_a_forwarded_error_keeps_the_leaders_reason_and_fields():
    leader = _leader_error(
        grpc.StatusCode.OUT_OF_RANGE,
        "anything at all",
        ErrorDetails(Reason.TRUNCATED, begin=41).trailers(),
    )
    for mutating in (False, True):
        error = RpcError.from_leader(leader, mutating)
        assert error.details == ErrorDetails(Reason.TRUNCATED, begin=41)
        assert error.code == grpc.StatusCode.OUT_OF_RANGE
        assert error.message == "leader: anything at all"
    leader = _leader_error(
        grpc.StatusCode.UNAVAILABLE, "whatever", ErrorDetails(Reason.NOT_LEADER).trailers()
    )
    assert RpcError.from_leader(leader, mutating=True).reason is Reason.NOT_LEADER


def test_a_leader_call_broken_by_grpc_is_classified():
    refused = _leader_error(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
    assert RpcError.from_leader(refused, mutating=True).reason is Reason.LEADER_UNAVAILABLE
    broken = _leader_error(grpc.StatusCode.UNAVAILABLE, "Socket closed")
    assert RpcError.from_leader(broken, mutating=True).reason is Reason.OUTCOME_UNKNOWN
    assert RpcError.from_leader(broken, mutating=False).reason is Reason.LEADER_UNAVAILABLE
    late = _leader_error(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
    assert RpcError.from_leader(late, mutating=True).reason is Reason.TIMEOUT
    other = RpcError.from_leader(_leader_error(grpc.StatusCode.INTERNAL, "boom"), False)
    assert other.reason is Reason.INTERNAL and other.code == grpc.StatusCode.INTERNAL


# ---- through a real gRPC server ------------------------------------------------------------


class _FailingNode:
    """Stands in for a `Node` behind the real `LogService`: every call raises `error`."""

    def __init__(self) -> None:
        self.error: RpcError | None = None
        self.core = SimpleNamespace(status=pb.VOTING, begin=0)
        self.appender = self.coordinator_driver = self.reads = self  # drivers the service calls

    def _raise(self) -> None:
        assert self.error is not None
        raise self.error

    async def append(
        self, data: bytes, offsets: bytes, forwarded: bool, conditions: object = None
    ) -> list[int]:
        self._raise()
        return []

    async def truncate(self, to: int, forwarded: bool) -> int:
        self._raise()
        return 0

    async def read(
        self, request: pb.ReadRequest, forwarded: bool, deadline: float | None = None
    ) -> AsyncIterator[pb.ReadResponse]:
        self._raise()
        yield pb.ReadResponse()

    async def tail(self, request: pb.TailRequest) -> AsyncIterator[list[pb.Entry]]:
        self._raise()
        yield []


@pytest.fixture
async def failing_replica() -> AsyncIterator[tuple[str, _FailingNode]]:
    node = _FailingNode()
    async with serving(node) as address:
        yield address, node


def _random_error(reason: Reason) -> RpcError:
    # Arbitrary text, with phrases a text-searching client would have misread.
    message = f"{uuid.uuid4()} connection refused; begins at 3 (end 4) not attempted"
    code = grpc.StatusCode.UNKNOWN if reason is Reason.INTERNAL else None
    begin = 1234 if reason is Reason.TRUNCATED else None
    end = 5678 if reason is Reason.PAST_END else None
    failed = reason is Reason.CONDITION_FAILED
    return RpcError(
        reason,
        message,
        begin=begin,
        end=end,
        next_position=91 if failed else None,
        epoch=7 if failed else None,
        code=code,
    )


def _check(error: BaseException, expected: type[RlogError], sent: RpcError) -> None:
    assert type(error) is expected, (sent.reason, error)
    assert isinstance(error, RlogError)
    assert error.code == sent.code
    assert sent.message in str(error)
    if isinstance(error, Truncated):
        assert error.begin == 1234
    if isinstance(error, PastEnd):
        assert error.end == 5678
    if isinstance(error, ConditionFailed):
        assert (error.next_position, error.epoch) == (91, 7)


@pytest.mark.parametrize("reason", list(Reason), ids=lambda r: r.value)
async def test_each_reason_reaches_the_client_as_its_class(failing_replica, reason):
    endpoint, node = failing_replica
    sent = node.error = _random_error(reason)
    read_class, append_class = EXPECTED[reason]
    # One try per append (exactly_once=False): the classes, not the client's retries.
    async with AsyncClient(endpoint, timeout=10, append_timeout=10, exactly_once=False) as client:
        with pytest.raises(RlogError) as read:
            async for _ in client.read(from_=0, to=5):
                pass
        _check(read.value, read_class, sent)
        with pytest.raises(RlogError) as append:
            await client.append([b"x"])
        _check(append.value, append_class, sent)
        with pytest.raises(RlogError) as truncate:
            await client.truncate(3)
        _check(truncate.value, append_class, sent)
    async with AsyncClient(endpoint, append_timeout=10, stream=True, exactly_once=False) as client:
        with pytest.raises(RlogError) as streamed:
            await client.append([b"x"])
        # AppendStream carries the reason in its response, not in trailers.
        assert type(streamed.value) is append_class, (reason, streamed.value)
        if isinstance(streamed.value, ConditionFailed):
            assert (streamed.value.next_position, streamed.value.epoch) == (91, 7)
        if isinstance(streamed.value, Truncated):
            assert streamed.value.begin == 1234
        assert sent.message in str(streamed.value)


@pytest.mark.parametrize("reason", [Reason.TRUNCATED, Reason.PAST_END, Reason.NOT_VOTING])
async def test_the_blocking_grpc_api_reads_the_same_reasons(failing_replica, reason):
    """The Spark source calls replicas with grpc's blocking API: same trailers, same
    classes."""
    endpoint, node = failing_replica
    sent = node.error = _random_error(reason)

    def read() -> RlogError:
        with grpc.insecure_channel(endpoint, options=CLIENT_CHANNEL_OPTIONS) as channel:
            try:
                for _ in pbg.LogStub(channel).Read(pb.ReadRequest(), timeout=10):
                    pass
            except grpc.RpcError as exc:
                return from_rpc_error(exc, endpoint)
        raise AssertionError("the read did not fail")

    _check(await asyncio.to_thread(read), EXPECTED[reason][0], sent)


# ---- a call the server cancelled -----------------------------------------------------------


def test_a_cancelled_append_is_outcome_unknown_and_a_cancelled_read_is_not():
    """A CANCELLED status reaching the client was the server's doing (our own cancellation
    raises CancelledError in the caller): an append may have been applied, so it is an
    outcome-unknown error that exactly-once appends re-send under their session."""
    append = error_for(grpc.StatusCode.CANCELLED, "Cancelled", "h:1", mutating=True)
    assert type(append) is OutcomeUnknownUnavailable and "outcome unknown" in str(append)
    read = error_for(grpc.StatusCode.CANCELLED, "Cancelled", "h:1", mutating=False)
    assert type(read) is RlogError and not isinstance(read, OutcomeUnknown)


class _StuckNode(_FailingNode):
    """Appends that never finish: the server stopping cancels them."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived = asyncio.Event()

    async def append(
        self, data: bytes, offsets: bytes, forwarded: bool, conditions: object = None
    ) -> list[int]:
        self.arrived.set()
        await asyncio.sleep(3600)
        return []


async def test_a_replica_stopping_under_an_append_is_outcome_unknown():
    """A real server stopped (short grace) with an append in flight, as a replica asked to
    stop does: the client gets an outcome-unknown error, not a plain failure. (gRPC says
    UNAVAILABLE here; a replica that cancels a forwarded append as it stops says CANCELLED,
    which the drain e2e test saw end a continuous writer's append as a bare 'cancelled':
    the test above.)"""
    node = _StuckNode()
    server = grpc.aio.server()
    equip(node)  # what the service reads of a node besides its drivers
    pbg.add_LogServicer_to_server(LogService(node), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with AsyncClient(f"127.0.0.1:{port}", append_timeout=30, exactly_once=False) as client:
        call = asyncio.ensure_future(client.append([b"x"]))
        await asyncio.wait_for(node.arrived.wait(), 10)
        await server.stop(grace=0.2)
        with pytest.raises(OutcomeUnknown):
            await call
