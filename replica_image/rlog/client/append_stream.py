"""Appends multiplexed on one `AppendStream` call per endpoint (`stream=True`): cheaper per
append for many concurrent writers; every append still gets its own result, and the same
errors as a unary call."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Sequence

import grpc

from rlog.client.endpoints import Endpoint, Endpoints, all_failed
from rlog.client.errors import (
    OutcomeUnknownTimeout,
    OutcomeUnknownUnavailable,
    RlogError,
    Unavailable,
    answer_error,
    code_from_int,
    from_rpc_error,
    is_connect_failure,
)
from rlog.client.packing import Payload, answered_positions, joined
from rlog.proto import rlog_pb2 as pb


class NotSent(Exception):
    """The append stream never connected: nothing on it reached a server."""

    def __init__(self, error: RlogError) -> None:
        super().__init__(str(error))
        self.error = error


_Queued = tuple[int, Payload, bool, pb.AppendRequest | None]


class AppendStream:
    """Appends multiplexed on one `AppendStream` call to one endpoint. Appends queued while
    the stream is busy are coalesced into one request (a producer's batching: many writers'
    single-entry appends cost the leader one message, its values packed once); the answer's
    positions are split back to each append in order. If the stream breaks, every append
    still pending on it has an unknown outcome (unless the stream never connected). A
    coalesced request refused as invalid (nothing appended) is re-sent part by part, so one
    caller's bad value never fails another's append."""

    MAX_COALESCED_VALUES = 4096
    MAX_COALESCED_BYTES = 4 * 1024 * 1024

    def __init__(self, endpoint: Endpoint, on_request: Callable[[], None]) -> None:
        self.address = endpoint.address
        self._on_request = on_request  # counts each request sent
        # (append id, values, alone, fields): `alone` appends are never coalesced (a re-send,
        # or one with conditions or a session: `fields`, copied into its request)
        self._queue: asyncio.Queue[_Queued | None] = asyncio.Queue()
        self._futures: dict[int, asyncio.Future[Sequence[int]]] = {}
        # request id on the wire -> the appends it carries: (append id, values)
        self._requests_sent: dict[int, list[tuple[int, Payload]]] = {}
        self._next_id = 1
        self._connected = False
        self.broken = False
        self._call = endpoint.log.AppendStream(self._requests())
        self._reader = asyncio.get_running_loop().create_task(self._read())

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    async def _requests(self) -> AsyncGenerator[pb.AppendRequest, None]:
        held: _Queued | None = None
        while True:
            item = held if held is not None else await self._queue.get()
            held = None
            if item is None:
                return
            parts = [(item[0], item[1])]
            count, size = item[1].count, item[1].size
            while (
                not item[2]
                and not self._queue.empty()
                and count < self.MAX_COALESCED_VALUES
                and size < self.MAX_COALESCED_BYTES
            ):
                following = self._queue.get_nowait()
                if following is None or following[2]:
                    held = following  # send it (or close) after this request
                    break
                parts.append((following[0], following[1]))
                count += following[1].count
                size += following[1].size
            request_id = self._new_id()
            self._requests_sent[request_id] = parts
            request = pb.AppendRequest()
            if item[3] is not None:
                request.CopyFrom(item[3])
            payload = joined([values for _, values in parts])
            request.data, request.offsets = payload.data, payload.offsets
            request.id = request_id
            self._on_request()
            yield request

    def _settle(self, response: pb.AppendResponse) -> None:
        parts = self._requests_sent.pop(response.id, None)
        if parts is None:
            return
        if response.code == 0:
            positions = answered_positions(response)
            for append_id, values in parts:
                future = self._futures.pop(append_id, None)
                taken, positions = positions[: values.count], positions[values.count :]
                if future is not None and not future.done():
                    future.set_result(taken)
            return
        code = code_from_int(response.code)
        if code == grpc.StatusCode.INVALID_ARGUMENT and len(parts) > 1:
            for append_id, values in parts:  # nothing was appended: send each alone
                self._queue.put_nowait((append_id, values, True, None))
            return
        error, _ = answer_error(response, self.address)
        for append_id, _ in parts:
            future = self._futures.pop(append_id, None)
            if future is not None and not future.done():
                future.set_exception(error)

    async def _read(self) -> None:
        try:
            async for response in self._call:
                self._connected = True
                self._settle(response)
            self._fail(
                OutcomeUnknownUnavailable(
                    f"the append stream to {self.address} closed with appends in flight: "
                    "outcome unknown",
                    endpoint=self.address,
                )
            )
        except grpc.aio.AioRpcError as exc:
            details = exc.details() or ""
            error = from_rpc_error(exc, self.address, mutating=True)
            if (
                not self._connected
                and exc.code() == grpc.StatusCode.UNAVAILABLE
                and is_connect_failure(details)
            ):
                self._fail(NotSent(error))
            elif type(error) is RlogError:
                # gRPC's own verdict on the broken transport (INTERNAL "Internal error from
                # Core" when a connection dies mid-frame), no server's: appends still
                # pending on the stream may or may not have been applied.
                self._fail(
                    OutcomeUnknownUnavailable(
                        f"the append stream to {self.address} broke with appends in flight "
                        f"({error}): outcome unknown",
                        exc.code(),
                        self.address,
                    )
                )
            else:
                self._fail(error)
        except asyncio.CancelledError:
            self._fail(RlogError("the client is closed", endpoint=self.address))
            raise

    def _fail(self, error: BaseException) -> None:
        self.broken = True
        self._requests_sent.clear()
        futures, self._futures = self._futures, {}
        for future in futures.values():
            if not future.done():
                future.set_exception(error)

    async def append(
        self, values: Payload, deadline_s: float | None, fields: pb.AppendRequest | None
    ) -> Sequence[int]:
        """Append `values` with the conditions and session in `fields` (if any)."""
        if self.broken:
            raise NotSent(Unavailable(f"the append stream to {self.address} is closed"))
        request_id = self._new_id()
        future: asyncio.Future[Sequence[int]] = asyncio.get_running_loop().create_future()
        # Retrieve the outcome even if the caller stopped waiting (no "never retrieved").
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._futures[request_id] = future
        self._queue.put_nowait((request_id, values, fields is not None, fields))
        try:
            return await asyncio.wait_for(asyncio.shield(future), deadline_s)
        except TimeoutError:
            self._futures.pop(request_id, None)
            raise OutcomeUnknownTimeout(
                f"the append was not acknowledged within {deadline_s:g} s ({self.address}): "
                "outcome unknown",
                grpc.StatusCode.DEADLINE_EXCEEDED,
                self.address,
            ) from None

    async def close(self) -> None:
        self._queue.put_nowait(None)
        self._call.cancel()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reader


class AppendStreams:
    """The client's append streams, one per endpoint, opened on first use and again once
    broken. An append goes on the stream of the first endpoint, in the client's order, whose
    stream connects: nothing was sent on those that did not."""

    def __init__(self, endpoints: Endpoints, on_request: Callable[[], None]) -> None:
        self._endpoints = endpoints
        self._on_request = on_request  # counts each request sent
        self._streams: dict[int, AppendStream] = {}

    async def append(
        self, values: Payload, fields: pb.AppendRequest | None, deadline_s: float | None
    ) -> Sequence[int]:
        order = self._endpoints.order()
        give_up_at: float | None = None
        while True:
            errors: list[RlogError] = []
            for index in order:
                stream = self._streams.get(index)
                if stream is None or stream.broken:
                    stream = AppendStream(self._endpoints.endpoint(index), self._on_request)
                    self._streams[index] = stream
                try:
                    positions = await stream.append(values, deadline_s, fields)
                except NotSent as not_sent:
                    errors.append(not_sent.error)
                    continue
                self._endpoints.current = index
                return positions
            # Every stream failed to connect (nothing was sent): as in `Endpoints.call`.
            give_up_at = await self._endpoints.wait_for_a_connection(order, True, give_up_at)
            if give_up_at is None:
                raise all_failed(errors)

    async def close(self) -> None:
        streams, self._streams = self._streams, {}
        for stream in streams.values():
            await stream.close()


__all__ = ["AppendStream", "AppendStreams", "NotSent"]
