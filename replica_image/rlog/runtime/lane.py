"""The write lane: the leader's writes to one follower on a plain TCP connection instead of
the gRPC `WriteStream` (docs/data-path.md, "The write lane").

A message on a gRPC stream costs each side a few hundred microseconds of Python and of
gRPC's own machinery; the same bytes on an asyncio connection cost a tenth of that
(bench/README.md, "The write lane"). The lane carries exactly what the stream carries,
the same encoded `WriteRequest`s (with their ids) one way and `WriteResponse`s the other,
each as a frame: a 4-byte little-endian length, then the message.

- The first frame of a connection is the leader's `LaneHello` (the framing's version, the
  log id, the replica id it means to reach); the follower answers a `LaneWelcome`, whose
  `error` says why it refuses (another replica, another log, another version). A lane
  reached at the wrong address is refused before any write travels, so an answer is never
  counted for the wrong replica.
- The leader opens a lane in the background and writes on it only once it is open; until
  then, and whenever it is down (the peer is down, serves no lane, refuses, or a network
  policy drops the port), the writes go on the gRPC stream, and the lane is tried again
  after a back-off. No write ever waits for a lane to open. A connection that breaks fails
  the writes sent on it with `StreamBroken`, as a broken stream does.
- The follower decides each write as it arrives (`Node.start_write`, in order) and answers
  when its batch is durable; a write it cannot take (a full disk, a corrupt record, a frame
  that does not parse) closes the connection, and the leader counts every write pending on
  it as failed, as it does when a stream ends with an error.
- Security as on the gRPC port: a replica with TLS serves its lane only over mutual TLS,
  with its own certificate, and a leader presents its certificate and verifies the
  follower's (`lane_tls`); with a roles file, the caller's certificate must have a role
  that may call `WriteStream` (`admit`, the same rules). A replica with TLS but no client
  CA (peers known by bearer tokens) cannot serve a lane (`ReplicaConfig` refuses it).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
import ssl
import struct
from collections.abc import Callable
from typing import Protocol, cast

from rlog.proto import rlog_pb2 as pb
from rlog.runtime.write_stream import StreamBroken, answer_to, with_id
from rlog.storage.base import CorruptRecord

log = logging.getLogger("rlog.lane")

VERSION = 1
_LENGTH = struct.Struct("<I")
# A hello, a welcome or a WriteResponse is a few dozen bytes; anything much larger is not one.
_MAX_SMALL = 4096


class LaneError(Exception):
    """The peer broke the lane's framing (a frame over the limit, a bad handshake)."""


def lane_address(address: str, offset: int) -> tuple[str, int]:
    """(host, port) of the lane of the replica whose gRPC address is `address`."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port) + offset


def frame(message: bytes) -> bytes:
    return _LENGTH.pack(len(message)) + message


class FrameReader:
    """Frames out of a byte stream that arrives in chunks of any size. A frame that lies in
    one chunk is sliced out of it; one spread over several is joined once."""

    def __init__(self, max_frame: int) -> None:
        self.max_frame = max_frame
        self._chunks: list[bytes] = []
        self._start = 0  # offset of the unread bytes in _chunks[0]
        self._buffered = 0  # unread bytes in _chunks
        self._need = -1  # length of the frame being read; -1: its length is next

    def feed(self, data: bytes) -> list[bytes]:
        """The frames `data` completes (raises LaneError for a frame over the limit)."""
        if data:
            self._chunks.append(data)
            self._buffered += len(data)
        frames: list[bytes] = []
        while True:
            if self._need < 0:
                if self._buffered < _LENGTH.size:
                    return frames
                (need,) = _LENGTH.unpack(self._take(_LENGTH.size))
                if need > self.max_frame:
                    raise LaneError(
                        f"a frame of {need} bytes is over the limit of {self.max_frame}"
                    )
                self._need = need
            if self._buffered < self._need:
                return frames
            frames.append(self._take(self._need))
            self._need = -1

    def _take(self, n: int) -> bytes:
        if n == 0:  # an empty message (a welcome) is an empty frame
            return b""
        first, start = self._chunks[0], self._start
        if start + n <= len(first):
            out = first if start == 0 and n == len(first) else first[start : start + n]
            self._start += n
            if self._start == len(first):
                self._chunks.pop(0)
                self._start = 0
        else:
            views: list[memoryview] = [memoryview(first)[start:]]
            got = len(first) - start
            used = 1
            while got < n:
                chunk = self._chunks[used]
                if got + len(chunk) <= n:
                    views.append(memoryview(chunk))
                    got += len(chunk)
                    used += 1
                else:
                    views.append(memoryview(chunk)[: n - got])
                    self._start = n - got
                    got = n
                    break
            else:
                self._start = 0
            del self._chunks[:used]
            out = b"".join(views)
        self._buffered -= n
        return out


def _tune(transport: asyncio.BaseTransport) -> None:
    """No Nagle delay (a write is one frame, sent whole); keepalive probes and a user
    timeout, so a peer that vanished without a reset (a partition, a dead host) breaks the
    connection within about 25-30 s, idle or not, as gRPC's keepalive pings do for the
    stream; the leader then opens a new one (or writes on the stream meanwhile)."""
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


# ---- the follower's side ----------------------------------------------------------------


class _Writes(Protocol):
    """What the lane needs of the replica (Node): its write handler."""

    def start_write(
        self, request: pb.WriteRequest
    ) -> tuple[pb.WriteResponse, asyncio.Future[None] | None]: ...


class LaneServer(asyncio.Protocol):
    """One leader's connection to this replica's lane."""

    def __init__(
        self,
        node: _Writes,
        log_id: str,
        replica_id: int,
        max_frame: int,
        on_write: Callable[[], None],
        admit: Callable[[asyncio.Transport], str] | None = None,
    ) -> None:
        self._node = node
        self._admit = admit
        self._log_id = log_id
        self._replica_id = replica_id
        self._reader = FrameReader(_MAX_SMALL)
        self._max_frame = max_frame
        self._on_write = on_write
        self._welcomed = False
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        _tune(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    def _close(self, why: str) -> None:
        if self._transport is not None:
            log.warning("write lane from %s closed: %s", self._peer(), why)
            self._transport.close()
            self._transport = None

    def _peer(self) -> str:
        peer = self._transport.get_extra_info("peername") if self._transport else None
        return f"{peer[0]}:{peer[1]}" if peer else "a peer"

    def _send(self, message: bytes) -> None:
        if self._transport is not None:
            self._transport.write(frame(message))

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except LaneError as exc:
            self._close(str(exc))
            return
        for raw in frames:
            if self._transport is None:
                return
            if not self._welcomed:
                self._hello(raw)
            else:
                self._write(raw)

    def _hello(self, raw: bytes) -> None:
        try:
            hello = pb.LaneHello.FromString(raw)
        except Exception as exc:
            self._close(f"the first frame is not a LaneHello: {exc}")
            return
        error = ""
        if hello.version != VERSION:
            error = f"lane version {hello.version} is not {VERSION}"
        elif hello.replica_id != self._replica_id:
            error = f"this is replica {self._replica_id}, not {hello.replica_id}"
        elif self._log_id and hello.log_id and hello.log_id != self._log_id:
            error = f"this replica belongs to log {self._log_id!r}, not {hello.log_id!r}"
        elif self._admit is not None and self._transport is not None:
            error = self._admit(self._transport)
        self._send(pb.LaneWelcome(error=error).SerializeToString())
        if error:
            self._close(f"refused: {error}")
            return
        self._welcomed = True
        self._reader.max_frame = self._max_frame

    def _write(self, raw: bytes) -> None:
        try:
            request = pb.WriteRequest.FromString(raw)
        except Exception as exc:
            self._close(f"a frame does not parse as WriteRequest: {exc}")
            return
        self._on_write()
        try:
            decided, durable = self._node.start_write(request)
        except CorruptRecord as exc:  # start_write has reported it (repair follows)
            self._close(f"corrupt record: {exc}")
            return
        except Exception as exc:  # a full disk, a rule that raised: the leader retries
            self._close(f"write at proposal {request.proposal} failed: {exc}")
            return
        response = answer_to(request, decided)
        if durable is None:
            self._send(response.SerializeToString())
            return

        def answer(future: asyncio.Future[None]) -> None:
            if future.cancelled():
                self._close("its write was cancelled")
            elif (error := future.exception()) is not None:
                self._close(f"write at proposal {request.proposal} not stored: {error}")
            else:
                self._send(response.SerializeToString())

        durable.add_done_callback(answer)


async def serve_lane(
    node: _Writes,
    host: str,
    port: int,
    log_id: str,
    replica_id: int,
    max_frame: int,
    on_write: Callable[[], None],
    tls: ssl.SSLContext | None = None,
    admit: Callable[[asyncio.Transport], str] | None = None,
) -> asyncio.Server:
    """Serve the lane on host:port; with `tls`, only over TLS (mutual: the context asks
    every leader for its certificate); `admit` says why a welcomed caller is refused
    (authorization), "" to let it write."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: LaneServer(node, log_id, replica_id, max_frame, on_write, admit),
        host or None,
        port,
        ssl=tls,
    )


# ---- the leader's side ------------------------------------------------------------------


class _LaneClient(asyncio.Protocol):
    def __init__(self, lane: WriteLane) -> None:
        self._lane = lane
        self._reader = FrameReader(_MAX_SMALL)
        self.welcome: asyncio.Future[pb.LaneWelcome] = asyncio.get_running_loop().create_future()
        # retrieved here: a welcome that fails after `_open` stopped waiting is no news
        self.welcome.add_done_callback(lambda f: f.cancelled() or f.exception())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        _tune(transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
            for raw in frames:
                if not self.welcome.done():
                    self.welcome.set_result(pb.LaneWelcome.FromString(raw))
                else:
                    self._lane._answered(pb.WriteResponse.FromString(raw))
        except Exception as exc:
            self._lane._broken(self, LaneError(f"the lane's answer does not parse: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.welcome.done():
            self.welcome.set_exception(ConnectionError(f"closed before the welcome: {exc}"))
        self._lane._broken(self, StreamBroken(f"the write lane closed: {exc or 'by the peer'}"))


def _expire(future: asyncio.Future[pb.WriteResponse], time_limit: float) -> None:
    if not future.done():
        future.set_exception(TimeoutError(f"no answer to the write within {time_limit:g} s"))


class WriteLane:
    """The leader's write lane to one peer, with the `start`/`write`/`close` of a
    `WriteStream`. Writes go on it only while it is open (`usable()`); opening happens in
    the background, so no write ever waits for a connection: until the lane is open (and
    while it is down) the caller uses the gRPC stream. A failed opening is tried again
    after a back-off that doubles from `RETRY_FIRST` to `RETRY_MAX` seconds."""

    RETRY_FIRST = 0.5
    RETRY_MAX = 30.0
    # Bytes handed to the connection but not yet taken by the kernel, at most: a peer that
    # stops reading (paused, or too slow) would otherwise make the leader buffer every
    # write to it for as long as the connection lasts. Past it the lane is dropped (its
    # writes fail, as they would time out) and opened again later; a healthy peer has at
    # most a few write batches (8 MiB each) unsent.
    MAX_UNSENT = 64 * 1024 * 1024

    def __init__(
        self,
        host: str,
        port: int,
        log_id: str,
        replica_id: int,
        connect_timeout: float,
        on_open: Callable[[], None],
        max_unsent: int = MAX_UNSENT,
        tls: Callable[[], ssl.SSLContext | None] = lambda: None,
    ) -> None:
        self.host, self.port = host, port
        self.max_unsent = max_unsent
        self._tls = tls  # the TLS context of each new connection (None: plaintext)
        self._hello = frame(
            pb.LaneHello(version=VERSION, log_id=log_id, replica_id=replica_id).SerializeToString()
        )
        self._connect_timeout = connect_timeout
        self._on_open = on_open
        self._transport: asyncio.Transport | None = None
        self._protocol: _LaneClient | None = None
        self._opening: asyncio.Task[None] | None = None
        self._retry = self.RETRY_FIRST
        self._next_try = 0.0  # loop time of the next opening allowed
        self._closed = False
        self._pending: dict[int, asyncio.Future[pb.WriteResponse]] = {}
        self._ids = itertools.count(1)
        self.last_error = ""  # why the last opening failed (for the caller's log)

    def usable(self) -> bool:
        """Open now; if not, start opening it in the background (when its back-off allows)."""
        if self._transport is not None and not self._transport.is_closing():
            return True
        if not self._closed and self._opening is None:
            loop = asyncio.get_running_loop()
            if loop.time() >= self._next_try:
                self._opening = loop.create_task(self._open())
        return False

    async def write(self, encoded: bytes, time_limit: float) -> pb.WriteResponse:
        """Send one encoded WriteRequest (no id) and wait for its response. Raises
        TimeoutError or StreamBroken. Only while `usable()`."""
        return await self.start(encoded, time_limit)

    def start(self, encoded: bytes, time_limit: float) -> asyncio.Future[pb.WriteResponse]:
        """Send one encoded WriteRequest (no id) now; its response, or the error `write`
        would raise, in the future returned. Only while `usable()`."""
        loop = asyncio.get_running_loop()
        request_id = next(self._ids)
        future: asyncio.Future[pb.WriteResponse] = loop.create_future()
        transport = self._transport
        if transport is None or transport.is_closing():
            future.set_exception(StreamBroken("the write lane is not open"))
            return future
        self._pending[request_id] = future
        tail = with_id(b"", request_id)
        transport.writelines([_LENGTH.pack(len(encoded) + len(tail)), encoded, tail])
        timer = loop.call_later(time_limit, _expire, future, time_limit)

        def settled(_: asyncio.Future[pb.WriteResponse]) -> None:
            timer.cancel()
            self._pending.pop(request_id, None)

        future.add_done_callback(settled)
        unsent = transport.get_write_buffer_size()
        if unsent > self.max_unsent and self._protocol is not None:
            self._broken(
                self._protocol,
                StreamBroken(f"the peer is not reading its write lane ({unsent} bytes unsent)"),
                abort=True,
            )
        return future

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        transport: asyncio.Transport | None = None
        try:
            context = self._tls()
            made, protocol = await asyncio.wait_for(
                loop.create_connection(
                    lambda: _LaneClient(self),
                    self.host,
                    self.port,
                    ssl=context,
                    server_hostname=self.host if context is not None else None,
                ),
                self._connect_timeout,
            )
            transport = cast(asyncio.Transport, made)
            transport.write(self._hello)
            welcome = await asyncio.wait_for(protocol.welcome, self._connect_timeout)
            if welcome.error:
                raise ConnectionRefusedError(f"refused: {welcome.error}")
            if transport.is_closing():
                raise ConnectionResetError("closed after the welcome")
        except (OSError, TimeoutError, ConnectionError) as exc:
            if transport is not None:
                transport.close()
            self.last_error = f"write lane {self.host}:{self.port}: {exc or type(exc).__name__}"
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
        self._on_open()

    def _answered(self, response: pb.WriteResponse) -> None:
        future = self._pending.pop(response.id, None)
        if future is not None and not future.done():
            future.set_result(response)

    def _broken(self, protocol: _LaneClient, error: Exception, abort: bool = False) -> None:
        """The connection of `protocol` ended (or is given up, its unsent bytes dropped
        with `abort`): fail every write sent on it."""
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

    def close(self) -> None:
        self._closed = True
        if self._opening is not None:
            self._opening.cancel()
            self._opening = None
        if self._protocol is not None:
            self._broken(self._protocol, StreamBroken("the write lane was closed"))
