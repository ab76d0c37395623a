"""The leader's writes to one follower on one long-lived bidirectional `WriteStream` call.

A unary `Write` per batch costs a whole gRPC call each (a new HTTP/2 stream, headers,
trailers, a call object on both sides). Here the leader opens one `WriteStream` per peer,
lazily, and writes every batch on it; each request carries an id that its response echoes,
so several writes are in flight at once and come back in whatever order the follower's
group commits finish them.

- a write waits for its own response, at most its timeout (as a unary call would); a write
  that times out fails alone and the stream stays open;
- a stream that breaks (the peer died, the connection was cut) fails every write pending on
  it with the stream's error; the next write opens a new one;
- a peer that does not implement `WriteStream` (an older build) answers UNIMPLEMENTED:
  the writes pending on that stream never reached a handler, and are raised as
  `StreamUnimplemented` for the caller to send as unary `Write`s instead.

Requests are serialized once here, by the caller, and handed to gRPC as bytes: the leader
sends the same `WriteRequest` to every peer, and the id (and the learned ranges riding on a
write to one peer, `learned_field`) is appended to the encoding (a protobuf field appended to
a message's encoding is merged into it), so the shared message is never copied nor mutated.
The appended fields travel as a separate `suffix`: the write lane sends the shared encoding
and the suffix as they are, without joining a copy of the batch's bytes per peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable

import grpc

from rlog.proto import rlog_pb2 as pb
from rlog.runtime.protowire import varint

WRITE_STREAM_METHOD = "/rlog.v1.Replica/WriteStream"
_ID_TAG = b"\x38"  # WriteRequest.id: field 7, varint
_LEARNED_TAG = b"\x2a"  # WriteRequest.learned: field 5, length-delimited


class StreamUnimplemented(Exception):
    """The peer does not implement WriteStream: send this write as a unary Write."""


class StreamBroken(Exception):
    """The stream ended without a status error (the peer closed it): the write failed."""


def with_id(encoded: bytes, request_id: int) -> bytes:
    """The encoding of a WriteRequest (`encoded`, without an id) with `id` set."""
    return encoded + _ID_TAG + varint(request_id)


def learned_field(learned: pb.LearnedRequest) -> bytes:
    """`WriteRequest.learned` = `learned`, encoded: appended to the encoding of a
    WriteRequest that lacks it, the whole parses as that field set."""
    body = learned.SerializeToString()
    return _LEARNED_TAG + varint(len(body)) + body


def answer_to(request: pb.WriteRequest, decided: pb.WriteResponse) -> pb.WriteResponse:
    """The response a stream or lane sends for `request`: the decision, with the request's
    id for the leader to match it."""
    return pb.WriteResponse(
        verdict=decided.verdict, proposal=decided.proposal, status=decided.status, id=request.id
    )


def _stream_error(exc: Exception) -> Exception:
    """What the writes pending on an ended stream fail with: the call's own status if it
    has one, else StreamBroken (never an exception the callers do not expect)."""
    if isinstance(exc, grpc.aio.AioRpcError | StreamBroken | StreamUnimplemented):
        return exc
    return StreamBroken(f"the write stream ended: {type(exc).__name__}: {exc}")


def _identity(data: bytes) -> bytes:
    return data


class _Session:
    """One open WriteStream call: a sender task writes queued requests in order (gRPC takes
    one message at a time per call), a reader task hands each response to its write."""

    def __init__(self, call: grpc.aio.StreamStreamCall, on_end: Callable[[_Session], None]):
        self.call = call
        self.pending: dict[int, asyncio.Future[pb.WriteResponse]] = {}
        self.outgoing: asyncio.Queue[tuple[int, bytes]] = asyncio.Queue()
        self.ended = False
        self._on_end = on_end
        loop = asyncio.get_running_loop()
        self._sender = loop.create_task(self._send())
        self._reader = loop.create_task(self._read())

    async def _send(self) -> None:
        try:
            while True:
                request_id, data = await self.outgoing.get()
                if request_id in self.pending:  # not timed out while it waited its turn
                    await self.call.write(data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # The call ended under the sender (gRPC raises InvalidStateError "RPC already
            # finished" when the reader has not yet seen the status): the pending writes
            # fail as a broken stream, an error their callers handle as a failed write.
            self._end(_stream_error(exc))

    async def _read(self) -> None:
        try:
            while True:
                response = await self.call.read()
                if not isinstance(response, pb.WriteResponse):
                    break  # EOF
                future = self.pending.pop(response.id, None)
                if future is not None and not future.done():
                    future.set_result(response)
        except asyncio.CancelledError:
            raise
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                self._end(StreamUnimplemented(exc.details()))
            else:
                self._end(exc)
            return
        except Exception as exc:
            self._end(_stream_error(exc))
            return
        self._end(StreamBroken("the peer ended the write stream"))

    def _end(self, error: BaseException) -> None:
        """Fail every write pending on this stream with `error`; the stream is done."""
        if self.ended:
            return
        self.ended = True
        self._on_end(self)
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)
        self.call.cancel()
        for task in (self._sender, self._reader):
            if task is not asyncio.current_task():
                task.cancel()

    def close(self) -> None:
        self._end(StreamBroken("the write stream was closed"))


def _expire(future: asyncio.Future[pb.WriteResponse], time_limit: float) -> None:
    if not future.done():
        future.set_exception(TimeoutError(f"no answer to the write within {time_limit:g} s"))


class WriteStream:
    """The leader's write stream to one peer (opened on the first write, again after it
    breaks)."""

    def __init__(self, channel: grpc.aio.Channel, on_open: Callable[[], None]) -> None:
        self._open_call = channel.stream_stream(
            WRITE_STREAM_METHOD,
            request_serializer=_identity,
            response_deserializer=pb.WriteResponse.FromString,
        )
        self._on_open = on_open
        self._session: _Session | None = None
        self._ids = itertools.count(1)

    async def write(
        self, encoded: bytes, time_limit: float, suffix: bytes = b""
    ) -> pb.WriteResponse:
        """Send one encoded WriteRequest (no id; `suffix`: more of its fields, encoded) and
        wait for its response. Raises TimeoutError, grpc.aio.AioRpcError or StreamBroken if
        it failed (the stream broke), StreamUnimplemented if the peer has no WriteStream."""
        return await self.start(encoded, time_limit, suffix)

    def start(
        self, encoded: bytes, time_limit: float, suffix: bytes = b""
    ) -> asyncio.Future[pb.WriteResponse]:
        """Queue one encoded WriteRequest (no id; `suffix`: more of its fields, encoded) now;
        its response, or the error `write` would raise, in the future returned (for a caller
        that is not a task of its own)."""
        session = self._session
        if session is None or session.ended:
            session = self._session = _Session(self._open_call(None), self._ended)
            self._on_open()
        request_id = next(self._ids)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[pb.WriteResponse] = loop.create_future()
        session.pending[request_id] = future
        # gRPC takes one bytes object per message: the one join of the batch's bytes here.
        data = b"".join((encoded, suffix, _ID_TAG, varint(request_id)))
        session.outgoing.put_nowait((request_id, data))
        timer = loop.call_later(time_limit, _expire, future, time_limit)

        def settled(_: asyncio.Future[pb.WriteResponse]) -> None:
            timer.cancel()
            session.pending.pop(request_id, None)

        future.add_done_callback(settled)
        return future

    def _ended(self, session: _Session) -> None:
        if self._session is session:
            self._session = None

    def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                self._session.close()
