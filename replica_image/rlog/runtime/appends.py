"""A client's append as it arrives and as it is answered, whatever carried it (a unary
`Append`, the `AppendStream`, the append lane): its packed values, its conditions, and the
`AppendResponse` that says its positions or its error (a storage fault's too, as
rlog/runtime/faults.py says it: the stream and the lane answer it as the unary call ends)."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from rlog.packed import PackedError, pack
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import Conditions
from rlog.runtime.errors import RpcError
from rlog.runtime.faults import error_of
from rlog.storage.base import CorruptRecord, StorageError
from rlog.wire import Reason


def answered(positions: list[int], request_id: int = 0) -> pb.AppendResponse:
    """An append's answer: `first` and `count` (an atomic batch's positions are
    consecutive; a list that is not would go back as `positions`)."""
    if positions and positions[-1] - positions[0] + 1 != len(positions):
        return pb.AppendResponse(id=request_id, positions=positions)
    first = positions[0] if positions else 0
    return pb.AppendResponse(id=request_id, first=first, count=len(positions))


def refused(request_id: int, error: RpcError) -> pb.AppendResponse:
    """An append's error as an answer on a stream or a lane: the gRPC status code, the
    message, and the reason and fields a unary call carries in its trailers."""
    details = error.details
    return pb.AppendResponse(
        id=request_id,
        code=error.code.value[0],
        error=error.message,
        reason=error.reason.value,
        next_position=details.next_position or 0,
        epoch=details.epoch or 0,
        begin=details.begin,
    )


def conditions_of(request: pb.AppendRequest) -> Conditions:
    """An append's admission conditions and session (rlog.protocol.admission)."""
    return Conditions(
        session=request.session,
        sequence=request.sequence,
        acked_below=request.acked_below,
        if_next=request.if_next if request.HasField("if_next") else None,
        epoch=request.epoch,
        secret=request.session_secret,
    )


def packed_values(request: pb.AppendRequest) -> tuple[bytes, bytes]:
    """An append's values packed (docs/data-path.md): `data`/`offsets` as sent, or
    `values` packed. The offsets are checked by the append (runtime/coordinator.py)."""
    data = request.data  # read once: each read of a bytes field copies the batch
    if data or request.offsets:
        if request.values:
            raise RpcError(Reason.INVALID_ARGUMENT, "an append carries values or data, not both")
        return data, request.offsets
    try:
        return pack(request.values)
    except PackedError as exc:
        raise RpcError(Reason.INVALID_ARGUMENT, str(exc)) from None


class Appender(Protocol):
    """What an append needs of the replica: its appends, and where a corrupt record met on
    the way is reported (the replica's is a `ReplicaAppender`)."""

    async def append(
        self, data: bytes, offsets: bytes, forwarded: bool, conditions: Conditions
    ) -> list[int]: ...

    def storage_fault_seen(self, exc: CorruptRecord) -> None: ...


@dataclass(frozen=True)
class ReplicaAppender:
    """The replica's `Appender`: the coordinator's driver appends (runtime/coordinator.py),
    its repair takes a corrupt record (runtime/repair.py)."""

    append: Callable[[bytes, bytes, bool, Conditions], Coroutine[Any, Any, list[int]]]
    storage_fault_seen: Callable[[CorruptRecord], None]


def prepared(request: pb.AppendRequest) -> tuple[bytes, bytes] | RpcError:
    """An append's packed values (`packed_values`), or the error that refuses them: what a
    stream reads once to know the append's size (its budget) and then appends."""
    try:
        return packed_values(request)
    except RpcError as error:
        return error


async def answer(
    node: Appender,
    request: pb.AppendRequest,
    forwarded: bool,
    packed: tuple[bytes, bytes] | RpcError | None = None,
) -> pb.AppendResponse:
    """Append one request (its values as `prepared` gave them, if it did) and answer it as
    a stream or a lane does: its positions, or the error the replica refused it with, or a
    storage fault's error (a full disk: DISK_FULL; a corrupt record: CORRUPT_RECORD, the
    replica repairing it; a failing disk: DISK_FAILING). Other exceptions propagate."""
    try:
        if packed is None:
            packed = packed_values(request)
        if isinstance(packed, RpcError):
            raise packed
        data, offsets = packed
        positions = await node.append(data, offsets, forwarded, conditions_of(request))
    except RpcError as error:
        return refused(request.id, error)
    except StorageError as exc:
        fault = error_of(exc, node)
        assert fault is not None
        return refused(request.id, fault)
    return answered(positions, request.id)
