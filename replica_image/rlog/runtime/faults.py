"""Malformed requests and storage faults at the RPC boundary: a request that meets a
corrupt stored record or a full disk ends with a clear error instead of a crashed handler
(docs/faults.md).

`guarded` wraps every RPC method of a servicer: `CorruptRecord` -> the replica drops the
record and recovers (`Repair.storage_fault_seen`, runtime/repair.py), the call ends with DATA_LOSS
(CORRUPT_RECORD); `DiskFull` -> RESOURCE_EXHAUSTED (DISK_FULL); any other storage error (a
failing disk: EIO, EROFS; the journal has the replica leave the quorum) -> UNAVAILABLE
(DISK_FAILING), where gRPC would end the call with UNKNOWN "Unexpected [StorageError]": a
follower's `WriteStream` ends so under the leader. Anything already sent on a stream was
checked record by record before it left. A request that does not parse (the
server's deserializers are `tolerant`) -> INVALID_ARGUMENT naming the type and the error;
a request a deserializer refused (`Refused`: a peer message of another log,
runtime/foreign.py) -> the refusal's error, before the handler sees it.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

import grpc

from rlog.runtime.errors import RpcError
from rlog.storage.base import CorruptRecord, DiskFull, StorageError
from rlog.wire import Reason


class Malformed:
    """What the server's request deserializers hand a handler for bytes that do not parse
    (gRPC itself would answer UNKNOWN): the handler answers INVALID_ARGUMENT."""

    def __init__(self, type_name: str, error: Exception) -> None:
        self.message = f"the request does not parse as {type_name}: {error}"


class Refused:
    """What a request deserializer hands a handler for a request refused before any handler
    may see it (runtime/foreign.py): the call ends with `error` and the request changes
    nothing."""

    def __init__(self, error: RpcError) -> None:
        self.error = error


def tolerant(parse: Callable[[bytes], Any], type_name: str) -> Callable[[bytes], Any]:
    """A request deserializer that returns `Malformed` instead of raising."""

    def deserialize(raw: bytes) -> Any:
        try:
            return parse(raw)
        except Exception as exc:
            return Malformed(type_name, exc)

    return deserialize


class _CheckedStream:
    """A stream of requests that ends at the first one that does not parse or is refused
    (as if the client had closed it there) and keeps its error, for the call to end with it
    once the requests before it are answered."""

    def __init__(self, requests: AsyncIterator[Any]) -> None:
        self._requests = requests
        self.error: RpcError | None = None

    async def __aiter__(self) -> AsyncIterator[Any]:
        async for request in self._requests:
            self.error = _refusal_of(request)
            if self.error is not None:
                return
            yield request


def _refusal_of(request: Any) -> RpcError | None:
    """The error a request that does not parse or was refused is answered with (None: the
    handler takes it)."""
    if isinstance(request, Malformed):
        return RpcError(Reason.INVALID_ARGUMENT, request.message)
    if isinstance(request, Refused):
        return request.error
    return None


class _FaultSink(Protocol):
    def storage_fault_seen(self, exc: CorruptRecord) -> None: ...


def error_of(exc: BaseException, sink: _FaultSink) -> RpcError | None:
    """The error to answer a storage fault with (None: not a storage fault)."""
    if isinstance(exc, CorruptRecord):
        sink.storage_fault_seen(exc)
        return RpcError(
            Reason.CORRUPT_RECORD,
            f"{exc}: not served; this replica is repairing it from its peers, "
            "read from another replica",
        )
    if isinstance(exc, DiskFull):
        return RpcError(Reason.DISK_FULL, str(exc))
    if isinstance(exc, StorageError):
        if isinstance(exc.__cause__, OSError):  # the disk: the replica leaves the quorum
            return RpcError(
                Reason.DISK_FAILING,
                f"disk failing: {exc}: not stored; this replica leaves the quorum until its "
                "disk takes writes again",
            )
        return RpcError(Reason.DISK_FAILING, f"storage failed: {exc}: not stored")
    return None


async def _abort(context: grpc.aio.ServicerContext, error: RpcError) -> None:
    await context.abort(error.code, error.message, trailing_metadata=error.details.trailers())


def _wrap(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            if (refused := _refusal_of(request)) is not None:
                await _abort(context, refused)
            checked = _CheckedStream(request) if hasattr(request, "__aiter__") else None
            try:
                async for item in method(self, checked or request, context):
                    yield item
            except StorageError as exc:
                error = error_of(exc, self.node.repair)
                assert error is not None
                await _abort(context, error)
            if checked is not None and checked.error is not None:
                await _abort(context, checked.error)

        return stream

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        if (refused := _refusal_of(request)) is not None:
            await _abort(context, refused)
        try:
            return await method(self, request, context)
        except StorageError as exc:
            error = error_of(exc, self.node.repair)
            assert error is not None
            await _abort(context, error)

    return unary


T = TypeVar("T")


def guarded(cls: type[T]) -> type[T]:
    """Wrap the servicer's RPC methods (those named in CamelCase) as the module says."""
    for name, method in list(vars(cls).items()):
        rpc = inspect.iscoroutinefunction(method) or inspect.isasyncgenfunction(method)
        if name[:1].isupper() and rpc:
            setattr(cls, name, _wrap(method))
    return cls
