"""Reads and tails as streams of responses over the client's endpoints
(`Endpoints.resumable`): the request each endpoint is sent (from just after the last entry
yielded, when a broken stream resumes on another), and when the stream is complete."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import Any

from rlog.client.endpoints import Endpoint, Endpoints
from rlog.client.errors import RlogError, Unavailable
from rlog.proto import rlog_pb2 as pb


def read_responses(
    endpoints: Endpoints,
    from_: int | None,
    to: int | None,
    stale: bool,
    max_batch: int,
    endpoint: str | None,
    min_position: int | None,
    timeout: float | None,
) -> AsyncGenerator[pb.ReadResponse, None]:
    """The responses of a read of [from_, to] (see `AsyncClient.read`), each call bounded by
    `timeout`."""

    def open_read(target: Endpoint, next_from: int | None) -> Any:
        request = pb.ReadRequest(stale=stale, max_batch=max_batch)
        if next_from is not None:
            setattr(request, "from", next_from)
        if to is not None:
            request.to = to
        if min_position is not None:
            request.min_position = min_position
        return target.log.Read(request, timeout=timeout)

    def done(next_from: int | None) -> bool:
        # Resumed after the last entry of the range (not: an empty range asked for).
        return to is not None and next_from is not None and next_from > to and (next_from != from_)

    return endpoints.resumable(open_read, from_, done, lambda _: None, endpoint)


def tail_responses(
    endpoints: Endpoints, from_: int, stale: bool
) -> AsyncGenerator[pb.ReadResponse, None]:
    """The responses of a tail from `from_` (see `AsyncClient.tail`): never complete, and a
    stream that ends is an error (`Unavailable`), resumed on the next endpoint."""

    def open_tail(target: Endpoint, next_from: int | None) -> Any:
        request = pb.TailRequest(stale=stale)
        setattr(request, "from", next_from or 0)
        return target.log.Tail(request)

    def ended(address: str) -> RlogError:
        return Unavailable(f"the tail from {address} ended", endpoint=address)

    return endpoints.resumable(open_tail, from_, lambda _: False, ended)


__all__ = ["read_responses", "tail_responses"]
