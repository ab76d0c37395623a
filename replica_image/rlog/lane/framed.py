"""Length-prefixed protobuf frames on a plain (or TLS) asyncio connection: the transport
of rlog's lanes (docs/data-path.md, "The write lane" and "The client's append lane").

A message on a gRPC call costs each side a few hundred microseconds of Python and of
gRPC's machinery; the same bytes on an asyncio connection cost a tenth of that. A lane
carries encoded protobuf messages, each as a frame (a 4-byte little-endian length, then
the message), requests one way and responses the other, each response naming its
request's id, so many requests are in flight at once.

- `FrameBuffer` has the bytes arrive in a buffer of its own and hands out each frame in
  place, for the `asyncio.BufferedProtocol`s of both sides (a leader's batches arrive at a
  follower, a fetch lane's answers at a catching-up replica);
- `FramedCaller` is the calling side of one lane: it opens the connection in the
  background (a hello, then a welcome that may refuse), so no request ever waits for a
  connection (the caller uses its gRPC path until `usable()`), sends requests, matches
  responses to them, and fails every request pending on a connection that breaks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import ssl
import struct
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar, cast

from google.protobuf.message import Message

from rlog.proto import rlog_pb2 as pb

LENGTH = struct.Struct("<I")
VERSION = 1  # a leader's hello: the version every replica with a lane serves
KINDS_VERSION = 2  # a hello whose `kind` is read (a client's)
# A hello, a welcome or a response is a few dozen bytes; anything much larger is not one.
MAX_SMALL = 4096


class FrameError(Exception):
    """The peer broke the framing (a frame over the limit, a bad handshake)."""


class ConnectionBroken(Exception):
    """The lane's connection ended with the request pending: it may or may not have been
    acted on."""


def lane_address(address: str, offset: int) -> tuple[str, int]:
    """(host, port) of the lane of the replica whose gRPC address is `address`."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) + offset


def frame(message: bytes) -> bytes:
    return LENGTH.pack(len(message)) + message


class FrameBuffer:
    """Frames received into a buffer this connection owns, for an `asyncio.BufferedProtocol`:
    the event loop reads from the socket straight into `buffer()`, and `received(n)` hands
    out each frame that is complete as a view of that buffer, in place. With a plain
    `Protocol` every received chunk is first a new bytes object (a copy) and a frame spread
    over several chunks is joined (another copy): for a leader's batch of half a megabyte,
    two copies on every follower before protobuf reads it.

    A frame handed out is valid only until the next `buffer()`: parse it at once (protobuf
    copies what it keeps). The buffer grows to hold the longest frame being read (at most
    `max_frame`) and keeps up to `keep` bytes (`KEEP` unless told) for the next ones; a
    frame begins at its start whenever everything before it has been read, so a frame is
    moved (the bytes of it already received) only when it began late in the buffer and
    does not fit after them."""

    ROOM = 64 * 1024  # free bytes offered to each read, at least
    KEEP = 4 * 1024 * 1024  # a buffer grown past this is let go once it is drained

    def __init__(self, max_frame: int, keep: int = KEEP) -> None:
        self.max_frame = max_frame
        self.keep = keep  # a connection whose frames are larger keeps more (fetch lanes)
        self._buffer = bytearray(self.ROOM)
        self._start = 0  # the first byte not handed out yet
        self._end = 0  # the end of the bytes received

    def buffer(self) -> memoryview:
        """Where the next bytes received go."""
        start, end = self._start, self._end
        if start == end:  # all read: the next frame begins at the start
            start = end = self._start = self._end = 0
            if len(self._buffer) > self.keep:
                self._buffer = bytearray(self.ROOM)
        unread = end - start
        need = LENGTH.size
        if unread >= LENGTH.size:  # the frame being read is this long (checked by received)
            (length,) = LENGTH.unpack_from(self._buffer, start)
            need += min(length, self.max_frame)
        size = max(need, unread + self.ROOM)
        if start + size > len(self._buffer):
            self._make_room(size)
        return memoryview(self._buffer)[self._end :]

    def _make_room(self, size: int) -> None:
        """Move the unread bytes to the start of a buffer of at least `size` bytes."""
        start, end = self._start, self._end
        if size <= len(self._buffer):
            view = memoryview(self._buffer)
            view[: end - start] = view[start:end]
        else:
            # doubled (but not past KEEP, or the next drain would let it go again)
            grown = bytearray(max(size, min(2 * len(self._buffer), self.keep)))
            memoryview(grown)[: end - start] = memoryview(self._buffer)[start:end]
            self._buffer = grown
        self._start, self._end = 0, end - start

    def pending_length(self) -> int | None:
        """The length of the frame being received once its length is in (None before): read
        after `received`'s frames, before `buffer()` grows the buffer to hold it."""
        if self._end - self._start < LENGTH.size:
            return None
        (length,) = LENGTH.unpack_from(self._buffer, self._start)
        return int(length)

    def received(self, n: int) -> Iterator[memoryview]:
        """The frames complete once `n` more bytes are in `buffer()`, one at a time (so a
        change of `max_frame` after a frame counts for the next); raises FrameError for a
        frame over the limit."""
        self._end += n
        buffer = self._buffer
        while self._end - self._start >= LENGTH.size:
            start = self._start
            (length,) = LENGTH.unpack_from(buffer, start)
            if length > self.max_frame:
                raise FrameError(f"a frame of {length} bytes is over the limit of {self.max_frame}")
            end = start + LENGTH.size + length
            if end > self._end:
                return
            self._start = end
            yield memoryview(buffer)[start + LENGTH.size : end]
        # Every frame handed out was parsed: a buffer grown past `keep` goes now, not at the
        # next read. A connection held back (its appends over the budget) is not read again
        # for a while, and 50 of them kept a drained 4 MiB buffer each, outside any budget.
        if self._start == self._end and len(self._buffer) > self.keep:
            self._start = self._end = 0
            self._buffer = bytearray(self.ROOM)

    @property
    def held(self) -> int:
        """The bytes this buffer holds (received or not)."""
        return len(self._buffer)


M = TypeVar("M", bound=Message)


def parse(message_type: type[M], raw: bytes | memoryview) -> M:
    """`raw` parsed as a `message_type` (protobuf's parser reads any buffer, in place, and
    copies what the message keeps; its type stubs ask for bytes)."""
    return message_type.FromString(cast(bytes, raw))


def tune(transport: asyncio.BaseTransport) -> None:
    """No Nagle delay (a request is one frame, sent whole); keepalive probes and a user
    timeout, so a peer that vanished without a reset (a partition, a dead host) breaks the
    connection within about 25-30 s, idle or not, as gRPC's keepalive pings do."""
    sock = transport.get_extra_info("socket")
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for option, value in (
        ("TCP_KEEPIDLE", 10),
        ("TCP_KEEPINTVL", 5),
        ("TCP_KEEPCNT", 3),
        ("TCP_USER_TIMEOUT", 30_000),  # ms that sent data may stay unacknowledged
    ):
        if hasattr(socket, option):  # Linux; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, option), value)


class Answer(Protocol):
    @property
    def id(self) -> int: ...


R = TypeVar("R", bound=Answer)


@dataclass(frozen=True)
class Destination:
    """Where a lane connects and how it introduces itself."""

    host: str
    port: int
    hello: pb.LaneHello
    tls: ssl.SSLContext | None = None  # None: plaintext
    server_hostname: str | None = None  # the name the server's certificate must carry


class _CallerProtocol(asyncio.BufferedProtocol, Generic[R]):
    def __init__(self, caller: FramedCaller[R]) -> None:
        self._caller = caller
        self._frames = FrameBuffer(MAX_SMALL, caller.answer_keep)
        self.welcome: asyncio.Future[pb.LaneWelcome] = asyncio.get_running_loop().create_future()
        # retrieved here: a welcome that fails after `_open` stopped waiting is no news
        self.welcome.add_done_callback(lambda f: f.cancelled() or f.exception())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tune(transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._frames.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            for raw in self._frames.received(nbytes):
                if not self.welcome.done():
                    self.welcome.set_result(parse(pb.LaneWelcome, raw))
                    self._frames.max_frame = self._caller.max_answer
                else:
                    self._caller._answered(self._caller.parse(raw))
        except Exception as exc:
            self._caller._broken(
                self, self._caller.broken(f"the lane's answer does not parse: {exc}")
            )

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.welcome.done():
            self.welcome.set_exception(ConnectionError(f"closed before the welcome: {exc}"))
        self._caller._broken(self, self._caller.broken(f"the lane closed: {exc or 'by the peer'}"))


def _expire(future: asyncio.Future[R], time_limit: float) -> None:
    if not future.done():
        future.set_exception(TimeoutError(f"no answer within {time_limit:g} s"))


class FramedCaller(Generic[R]):
    """The calling side of one lane. Requests go on it only while it is open (`usable()`);
    opening happens in the background, so no request waits for a connection. A failed
    opening is tried again after a back-off that doubles from `RETRY_FIRST` to `RETRY_MAX`
    seconds. `locate` says where to connect, each time (it may ask the server first, and
    raise OSError when there is no lane to open)."""

    RETRY_FIRST = 0.5
    RETRY_MAX = 30.0
    # Bytes handed to the connection but not yet taken by the kernel, at most: a peer that
    # stops reading would otherwise make the caller buffer every request to it for as long
    # as the connection lasts. Past it the connection is dropped (its requests fail, as they
    # would time out) and opened again later.
    MAX_UNSENT = 64 * 1024 * 1024

    def __init__(
        self,
        locate: Callable[[], Awaitable[Destination]],
        parse: Callable[[memoryview], R],
        connect_timeout: float,
        on_open: Callable[[Destination], None] = lambda _: None,
        max_unsent: int = MAX_UNSENT,
        broken: Callable[[str], Exception] = ConnectionBroken,
        max_answer: int = MAX_SMALL,
        answer_keep: int = FrameBuffer.KEEP,
    ) -> None:
        self.parse = parse  # called on a view of the connection's buffer: copies what it keeps
        self.answer_keep = answer_keep
        self.broken = broken
        self.max_answer = max_answer
        self.max_unsent = max_unsent
        self._locate = locate
        self._connect_timeout = connect_timeout
        self._on_open = on_open
        self._transport: asyncio.Transport | None = None
        self._protocol: _CallerProtocol[R] | None = None
        self._opening: asyncio.Task[None] | None = None
        self._retry = self.RETRY_FIRST
        self._next_try = 0.0  # loop time of the next opening allowed
        self._closed = False
        self._pending: dict[int, asyncio.Future[R]] = {}
        self._ids = itertools.count(1)
        self.last_error = ""  # why the last opening failed (for the caller's log)

    @property
    def is_open(self) -> bool:
        """Open now (nothing else is done: safe to ask from any thread)."""
        return self._transport is not None and not self._transport.is_closing()

    def usable(self) -> bool:
        """Open now; if not, start opening it in the background (when its back-off allows)."""
        if self.is_open:
            return True
        if not self._closed and self._opening is None:
            loop = asyncio.get_running_loop()
            if loop.time() >= self._next_try:
                self._opening = loop.create_task(self._open())
        return False

    def next_id(self) -> int:
        return next(self._ids)

    def send(
        self, request_id: int, parts: Sequence[bytes], time_limit: float | None
    ) -> asyncio.Future[R]:
        """Send one request (its encoding in `parts`, carrying `request_id`) now; its
        response, or the error (TimeoutError, `broken`), in the future returned. Only
        while `usable()`."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[R] = loop.create_future()
        transport = self._transport
        if transport is None or transport.is_closing():
            future.set_exception(self.broken("the lane is not open"))
            return future
        self._pending[request_id] = future
        transport.writelines([LENGTH.pack(sum(len(p) for p in parts)), *parts])
        timer = None
        if time_limit is not None:
            timer = loop.call_later(time_limit, _expire, future, time_limit)

        def settled(_: asyncio.Future[R]) -> None:
            if timer is not None:
                timer.cancel()
            self._pending.pop(request_id, None)

        future.add_done_callback(settled)
        unsent = transport.get_write_buffer_size()
        if unsent > self.max_unsent and self._protocol is not None:
            self._broken(
                self._protocol,
                self.broken(f"the peer is not reading its lane ({unsent} bytes unsent)"),
                abort=True,
            )
        return future

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        transport: asyncio.Transport | None = None
        where = "lane"
        try:
            destination = await asyncio.wait_for(self._locate(), self._connect_timeout)
            where = f"lane {destination.host}:{destination.port}"
            made, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _CallerProtocol(self),
                    destination.host,
                    destination.port,
                    ssl=destination.tls,
                    server_hostname=(
                        (destination.server_hostname or destination.host)
                        if destination.tls is not None
                        else None
                    ),
                ),
                self._connect_timeout,
            )
            transport = cast(asyncio.Transport, made)  # uvloop's is not a subclass
            transport.write(frame(destination.hello.SerializeToString()))
            welcome = await asyncio.wait_for(protocol.welcome, self._connect_timeout)
            if welcome.error:
                raise ConnectionRefusedError(f"refused: {welcome.error}")
            if transport.is_closing():
                raise ConnectionResetError("closed after the welcome")
        except Exception as exc:  # any failure to open: said, and tried again later
            if transport is not None:
                transport.close()
            self.last_error = f"{where}: {exc or type(exc).__name__}"
            self._next_try = loop.time() + self._retry
            self._retry = min(self._retry * 2, self.RETRY_MAX)
            self._opening = None
            return
        self._opening = None
        if self._closed:
            transport.close()
            return
        self._retry = self.RETRY_FIRST
        self.last_error = ""
        self._transport, self._protocol = transport, protocol
        self._on_open(destination)

    def _answered(self, response: R) -> None:
        future = self._pending.pop(response.id, None)
        if future is not None and not future.done():
            future.set_result(response)

    def _broken(self, protocol: _CallerProtocol[R], error: Exception, abort: bool = False) -> None:
        """The connection of `protocol` ended (or is given up, its unsent bytes dropped
        with `abort`): fail every request sent on it."""
        if protocol is not self._protocol:
            return
        transport, self._transport, self._protocol = self._transport, None, None
        if transport is not None:
            if abort:
                transport.abort()
            else:
                transport.close()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(error)

    def close(self) -> asyncio.Task[None] | None:
        """Close it; returns the opening it cancelled, if one was under way (`aclose` waits
        for it)."""
        self._closed = True
        opening, self._opening = self._opening, None
        if opening is not None:
            opening.cancel()
        if self._protocol is not None:
            self._broken(self._protocol, self.broken("the lane was closed"))
        return opening

    async def aclose(self) -> None:
        """Close it and wait until an opening under way has ended: a loop closed right
        after must not be left with a pending task ("Task was destroyed but it is
        pending!" on a CLI's stderr)."""
        opening = self.close()
        if opening is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await opening


class CallingLane(Generic[R]):
    """A replica's calling side of one lane kind (a write lane, a fetch lane), built on a
    `FramedCaller`: whether it is open, why not, and closing it are the caller's."""

    _caller: FramedCaller[R]

    @property
    def last_error(self) -> str:
        """Why the last opening failed (for the caller's log)."""
        return self._caller.last_error

    def usable(self) -> bool:
        """Open now; if not, start opening it in the background (when its back-off allows)."""
        return self._caller.usable()

    def close(self) -> None:
        self._caller.close()

    async def aclose(self) -> None:
        """Close it and wait for an opening under way to end."""
        await self._caller.aclose()
