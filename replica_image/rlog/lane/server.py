"""The lane's serving side: a replica's second port, where leaders write to it and clients
append without gRPC (docs/data-path.md, "The write lane" and "The client's append lane";
the framing and the caller's side are `framed`, the leader's write lane `write`).

A message on a gRPC stream costs each side a few hundred microseconds of Python and of
gRPC's own machinery; the same bytes on an asyncio connection cost a tenth of that
(docs/performance.md, "The write lane"). A write lane carries exactly what the WriteStream
carries, the same encoded `WriteRequest`s (with their ids) one way and `WriteResponse`s
the other; a client's append lane carries `AppendRequest`s and `AppendResponse`s
(`append`). The hello says which (`LaneHello.kind`).

- The first frame of a connection is the leader's `LaneHello` (the framing's version, the
  log id, the replica id it means to reach); the follower answers a `LaneWelcome`, whose
  `error` says why it refuses (another replica, another log, another version). A lane
  reached at the wrong address is refused before any write travels, so an answer is never
  counted for the wrong replica. A peer's log id must equal this replica's, the empty id
  included (protocol/log_identity.py), in the hello and in every write and fetch frame.
- The leader opens a lane in the background and writes on it only once it is open
  (`write`).
- The follower decides each write as it arrives (`ReplicaDriver.start_write`, in order) and answers
  when its batch is durable; a write it cannot take (a full disk, a corrupt record, a frame
  that does not parse) closes the connection, and the leader counts every write pending on
  it as failed, as it does when a stream ends with an error.
- Security as on the gRPC port: a replica with TLS serves its lane only over mutual TLS,
  with its own certificate, and a leader presents its certificate and verifies the
  follower's (`tls`); with a roles file, the caller's certificate must have a role
  that may call `WriteStream` (`admit`, the same rules). A replica with TLS but no client
  CA (peers known by bearer tokens) cannot serve a lane (`ReplicaConfig` refuses it).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, cast

from rlog.lane.append import APPEND_METHOD, AppendLaneHandler
from rlog.lane.framed import (
    KINDS_VERSION,
    LENGTH,
    MAX_SMALL,
    VERSION,
    FrameBuffer,
    FrameError,
    frame,
    parse,
    tune,
)
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.log_identity import refusal
from rlog.runtime.appends import Appender
from rlog.runtime.budgets import ReplicaBudget
from rlog.runtime.fetch import FETCH_METHOD
from rlog.runtime.write_stream import WRITE_STREAM_METHOD, answer_to
from rlog.storage.base import CorruptRecord

log = logging.getLogger("rlog.lane")

FETCH_UNSENT = 48 * 1024 * 1024  # a fetch lane's answers waiting unsent, at most (about)


class LeaderLinks(Protocol):
    """Told of each leader's write lane: when its first write arrives, and when it closes
    (runtime/leader_links.py)."""

    def opened(self, leader: int) -> None: ...

    def closed(self, leader: int) -> None: ...


@dataclass(frozen=True)
class LaneReplica:
    """What the lane needs of the replica: its write handler and its learned records (Fetch)
    (runtime/replica.py), its appends (`Appender`), and whom to tell of leaders' write
    lanes opening and closing (None: nobody)."""

    start_write: Callable[[pb.WriteRequest], tuple[pb.WriteResponse, asyncio.Future[None] | None]]
    lane_fetch: Callable[[pb.FetchRequest], list[bytes]]
    appender: Appender
    links: LeaderLinks | None = None


# Why a welcomed caller is refused, given its connection and the RPC the lane stands in
# for ("" to let it in): the roles of the gRPC port.
Admission = Callable[[asyncio.Transport, str], str]
# Told of each peer message of another log the lane refuses: (what: "lane hello", "lane
# write", "lane fetch"; the log id it carried; why), runtime/foreign.py.
ForeignSeen = Callable[[str, str, str], None]
# Why a peer frame stating this protocol version is refused ("": served), counted by the
# caller: (what: "lane write", "lane fetch"; the version), runtime/foreign.py.
OldRefusal = Callable[[str, int], str]


@dataclass
class LaneLimits:
    """What the lane port lets any caller hold (docs/security.md, "Budgets"): connections
    open at once (one more is closed as soon as it is accepted, its reason logged), the
    seconds a connection has to send its hello (and to finish its TLS handshake) and a
    client to send an append whole once its length is read, and the budgets a client's
    appends draw on (runtime/budgets.py)."""

    max_connections: int
    frame_timeout: float
    budget: ReplicaBudget
    on_refused: Callable[[str], None] = lambda _: None  # "cap" or "hello"
    open: int = 0
    # Refusals over the cap are logged at most once a second (a storm of connections is
    # not a storm of log lines): when the last line was, and how many went unsaid since.
    cap_logged: float = float("-inf")
    cap_unlogged: int = 0

    def over_cap(self, peer: str) -> None:
        """Say why a connection over the cap is closed (at most once a second)."""
        self.on_refused("cap")
        now = time.monotonic()
        if now - self.cap_logged < 1.0:
            self.cap_unlogged += 1
            return
        more = f" ({self.cap_unlogged} more since the last line)" if self.cap_unlogged else ""
        log.warning(
            "lane connection from %s closed at once: %d lane connections are open, the cap "
            "is %d (--max-lane-connections)%s",
            peer,
            self.open - 1,
            self.max_connections,
            more,
        )
        self.cap_logged, self.cap_unlogged = now, 0


class LaneServer(asyncio.BufferedProtocol):
    """One connection to this replica's lane: a leader's writes or a client's appends. The
    bytes arrive in the connection's own buffer (`FrameBuffer`) and each frame is parsed
    where it lies."""

    def __init__(
        self,
        replica: LaneReplica,
        log_id: str,
        replica_id: int,
        max_frame: int,
        on_write: Callable[[], None],
        on_append: Callable[[], None],
        limits: LaneLimits,
        admit: Admission | None = None,
        foreign_seen: ForeignSeen | None = None,
        old_refusal: OldRefusal | None = None,
    ) -> None:
        self._replica = replica
        self._limits = limits
        self._counted = False
        self._hello_timer: asyncio.TimerHandle | None = None
        self._admit = admit
        self._foreign_seen = foreign_seen
        self._old_refusal = old_refusal
        self._log_id = log_id
        self._replica_id = replica_id
        self._frames = FrameBuffer(MAX_SMALL)
        self._max_frame = max_frame
        self._on_write = on_write
        self._on_append = on_append
        self._welcomed = False
        self._appends: AppendLaneHandler | None = None  # a client's connection
        self._fetches = False  # a replica's fetch lane (catch-up)
        self._leader: int | None = None  # a leader's write lane: whose (from its first write)
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        limits = self._limits
        limits.open += 1
        self._counted = True
        if limits.open > limits.max_connections:
            limits.over_cap(self._peer())
            self._transport.close()
            self._transport = None
            return
        tune(transport)
        self._hello_timer = asyncio.get_running_loop().call_later(
            limits.frame_timeout, self._no_hello
        )

    def _no_hello(self) -> None:
        if not self._welcomed and self._transport is not None:
            self._limits.on_refused("hello")
            self._close(f"no hello within {self._limits.frame_timeout:g} s (--lane-frame-timeout)")

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        if self._counted:
            self._counted = False
            self._limits.open -= 1
        if self._hello_timer is not None:
            self._hello_timer.cancel()
        if self._appends is not None:
            self._appends.lost()
        if self._leader is not None and self._replica.links is not None:
            self._replica.links.closed(self._leader)
        self._leader = None

    def _close(self, why: str) -> None:
        if self._transport is not None:
            what = "append lane" if self._appends is not None else "write lane"
            what = "fetch lane" if self._fetches else what
            what = what if self._welcomed else "lane connection"
            log.warning("%s from %s closed: %s", what, self._peer(), why)
            self._transport.close()
            self._transport = None

    def _peer(self) -> str:
        peer = self._transport.get_extra_info("peername") if self._transport else None
        return f"{peer[0]}:{peer[1]}" if peer else "a peer"

    def _send(self, message: bytes) -> None:
        if self._transport is not None:
            self._transport.write(frame(message))

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._frames.buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            for raw in self._frames.received(nbytes):
                if self._transport is None:
                    return
                if not self._welcomed:
                    if self._hello_timer is not None:
                        self._hello_timer.cancel()
                    self._hello(raw)
                elif self._appends is not None:
                    if why := self._appends.frame(raw):
                        self._close(why)
                elif self._fetches:
                    self._fetch(raw)
                else:
                    self._write(raw)
            if self._appends is not None and self._transport is not None:
                length = self._frames.pending_length()
                if length is not None:
                    self._appends.expect(length)  # before the buffer grows to hold it
        except FrameError as exc:
            self._close(str(exc))

    def _hello(self, raw: memoryview) -> None:
        try:
            hello = parse(pb.LaneHello, raw)
        except Exception as exc:
            self._close(f"the first frame is not a LaneHello: {exc}")
            return
        kind = hello.kind if hello.version == KINDS_VERSION else pb.LANE_WRITES
        method = {pb.LANE_APPENDS: APPEND_METHOD, pb.LANE_FETCH: FETCH_METHOD}.get(
            kind, WRITE_STREAM_METHOD
        )
        error = ""
        if hello.version not in (VERSION, KINDS_VERSION):
            error = f"lane version {hello.version} is not {VERSION} or {KINDS_VERSION}"
        elif kind not in (pb.LANE_WRITES, pb.LANE_APPENDS, pb.LANE_FETCH):
            error = f"lane kind {kind} is not served here"
        elif kind != pb.LANE_APPENDS and hello.replica_id != self._replica_id:
            # (a client's appends are the same at every replica: any replica of the log
            # takes them, e.g. one reached through a Service)
            error = f"this is replica {self._replica_id}, not {hello.replica_id}"
        elif kind == pb.LANE_APPENDS and hello.log_id and hello.log_id != self._log_id:
            # A client's hello: one that names a log must name this one; one that names none
            # is taken, as a gRPC Append is (a client need not know the log's id).
            error = f"this replica belongs to log {self._log_id!r}, not {hello.log_id!r}"
        elif kind != pb.LANE_APPENDS and (why := self._foreign("lane hello", hello.log_id)):
            error = why  # a peer's lane: its log id must be this log's (protocol/log_identity.py)
        elif self._admit is not None and self._transport is not None:
            error = self._admit(self._transport, method)
        self._send(pb.LaneWelcome(error=error).SerializeToString())
        if error:
            self._close(f"refused: {error}")
            return
        self._welcomed = True
        self._frames.max_frame = self._max_frame
        if kind == pb.LANE_FETCH and self._transport is not None:
            self._fetches = True
            # Answers are frames of megabytes: one may wait unsent while the next is built;
            # past that the connection is not read (`pause_writing`) until the peer took it.
            self._transport.set_write_buffer_limits(high=FETCH_UNSENT)
        if kind == pb.LANE_APPENDS and self._transport is not None:
            self._appends = AppendLaneHandler(
                self._replica.appender,
                self._transport,
                self._send,
                self._on_append,
                self._limits.budget.stream(),
                self._limits.frame_timeout,
                self._close,
            )

    def _foreign(self, what: str, sent: str) -> str:
        """Why a peer message of log id `sent` is refused ("": it is this log's), reported."""
        why = refusal(self._log_id, sent)
        if why and self._foreign_seen is not None:
            self._foreign_seen(what, sent, why)
        return why

    def pause_writing(self) -> None:
        if self._appends is not None:
            self._appends.hold("answers")  # a client that does not read its answers
        elif self._fetches and self._transport is not None:
            self._transport.pause_reading()  # no more requests until the answers are taken

    def resume_writing(self) -> None:
        if self._appends is not None:
            self._appends.unhold("answers")
        elif self._fetches and self._transport is not None:
            self._transport.resume_reading()

    def _fetch(self, raw: memoryview) -> None:
        """One FetchRequest, answered at once with one FetchAnswers frame (the connection
        is not read meanwhile: the answer is built from storage on the event loop, as a
        Fetch call's answers are)."""
        try:
            request = parse(pb.FetchRequest, raw)
        except Exception as exc:
            self._close(f"a frame does not parse as FetchRequest: {exc}")
            return
        if why := self._foreign("lane fetch", request.log_id):
            self._close(f"refused (LOG_ID_MISMATCH): {why}")
            return
        if self._old_refusal and (why := self._old_refusal("lane fetch", request.protocol)):
            self._close(f"refused (PROTOCOL_TOO_OLD): {why}")
            return
        try:
            parts = self._replica.lane_fetch(request)
        except CorruptRecord as exc:
            self._replica.appender.storage_fault_seen(
                exc
            )  # dropped and recovered, as for a Fetch call
            self._close(f"corrupt record: {exc}")
            return
        except Exception as exc:  # a storage error: the caller fetches elsewhere
            self._close(f"fetch from {getattr(request, 'from')} failed: {exc}")
            return
        if self._transport is not None:
            self._transport.writelines([LENGTH.pack(sum(len(p) for p in parts)), *parts])

    def _write(self, raw: memoryview) -> None:
        try:
            request = parse(pb.WriteRequest, raw)
        except Exception as exc:
            self._close(f"a frame does not parse as WriteRequest: {exc}")
            return
        if why := self._foreign("lane write", request.log_id):
            self._close(f"refused (LOG_ID_MISMATCH): {why}")
            return
        if self._old_refusal and (why := self._old_refusal("lane write", request.protocol)):
            self._close(f"refused (PROTOCOL_TOO_OLD): {why}")
            return
        self._on_write()
        if self._leader is None and self._replica.links is not None:
            self._leader = request.leader
            self._replica.links.opened(request.leader)
        try:
            decided, durable = self._replica.start_write(request)
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
    replica: LaneReplica,
    host: str,
    port: int,
    log_id: str,
    replica_id: int,
    max_frame: int,
    on_write: Callable[[], None],
    on_append: Callable[[], None],
    limits: LaneLimits,
    tls: ssl.SSLContext | None = None,
    admit: Admission | None = None,
    foreign_seen: ForeignSeen | None = None,
    old_refusal: OldRefusal | None = None,
) -> asyncio.Server:
    """Serve the lane on host:port within `limits`; with `tls`, only over TLS (mutual: the
    context asks every caller for its certificate); `admit` says why a welcomed caller is
    refused (authorization), "" to let it in; `foreign_seen` is told of each peer message
    of another log refused; `old_refusal` says why a peer frame of an older build is."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(
        lambda: LaneServer(
            replica,
            log_id,
            replica_id,
            max_frame,
            on_write,
            on_append,
            limits,
            admit,
            foreign_seen,
            old_refusal,
        ),
        host or None,
        port,
        ssl=tls,
        ssl_handshake_timeout=limits.frame_timeout if tls is not None else None,
    )
