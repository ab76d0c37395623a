"""Storage faults at the RPC boundary: a request that meets a corrupt stored record or a full
disk ends with a clear error instead of a crashed handler (docs/faults.md).

`guarded` wraps every RPC method of a servicer: `CorruptRecord` -> the replica drops the
record and recovers (`Node.storage_fault_seen`), the call ends with DATA_LOSS
(CORRUPT_RECORD); `DiskFull` -> RESOURCE_EXHAUSTED (DISK_FULL). Anything already sent on a
stream was checked record by record before it left.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, TypeVar

import grpc

from rlog.client.wire import Reason
from rlog.runtime.errors import RpcError
from rlog.storage.base import CorruptRecord, DiskFull


class _FaultSink(Protocol):
    def storage_fault_seen(self, exc: CorruptRecord) -> None: ...


def error_of(exc: BaseException, node: _FaultSink) -> RpcError | None:
    """The error to answer a storage fault with (None: not a storage fault)."""
    if isinstance(exc, CorruptRecord):
        node.storage_fault_seen(exc)
        return RpcError(
            Reason.CORRUPT_RECORD,
            f"{exc}: not served; this replica is repairing it from its peers, "
            "read from another replica",
        )
    if isinstance(exc, DiskFull):
        return RpcError(Reason.DISK_FULL, str(exc))
    return None


async def _abort(context: grpc.aio.ServicerContext, error: RpcError) -> None:
    await context.abort(error.code, error.message, trailing_metadata=error.details.trailers())


def _wrap(method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except (CorruptRecord, DiskFull) as exc:
                error = error_of(exc, self.node)
                assert error is not None
                await _abort(context, error)

        return stream

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        try:
            return await method(self, request, context)
        except (CorruptRecord, DiskFull) as exc:
            error = error_of(exc, self.node)
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
