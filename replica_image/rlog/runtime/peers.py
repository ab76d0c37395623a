"""The other replicas as this replica sees them: their channels, sending them the protocol's
messages, and copying learned entries between replicas (`Fetch`).

- sending: a message to a peer goes over gRPC, one to this replica itself straight to its own
  acceptor/learner handlers; replies and failures of a coordinator round go back through
  callbacks, so the coordinator's driver stays the only one that feeds it;
- writes: the leader's writes to a peer travel on one long-lived `WriteStream` per peer
  (`write_stream`), or on its write lane when the log has one and it is open (`lane`:
  plain TCP, opened in the background), several in flight, unary `Write` for a peer
  without a stream; promises,
  learned messages and heartbeats stay unary calls (docs/data-path.md says why);
- learned piggy-backing: the leader's learned ranges for a peer wait briefly for the next
  write to that peer and ride on it (one RPC instead of two);
- Fetch: spans of the learned records a replica lacks, fetched from a peer for a copy
  (`runtime/learned_copy.py`: a recovering replica catching up, a VOTING one pulling what
  it missed) on the peer's fetch lane or as a Fetch call, and the same served to others;
  runs travel as runs (FetchResponse.runs, LearnedRequest.runs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import grpc

from rlog.config import ReplicaConfig
from rlog.lane.fetch import FetchLane
from rlog.lane.framed import ConnectionBroken, lane_address
from rlog.lane.write import WriteLane
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.protocol.coordinator import Send
from rlog.protocol.peer_version import PROTOCOL
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.errors import RpcError
from rlog.runtime.fetch import answer_bytes, fetch_answers
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.write_stream import (
    StreamBroken,
    StreamUnimplemented,
    WriteStream,
    learned_field,
)
from rlog.storage.base import StorageError
from rlog.wire import PEER_CHANNEL_OPTIONS

log = logging.getLogger("rlog.node")

READ_CHUNK_POSITIONS = 1024
READ_CHUNK_BYTES = 4 * 1024 * 1024
LEARNED_LINGER = 0.005  # seconds a learned range waits for a write to ride on
# A peer that answered UNIMPLEMENTED to WriteStream gets unary writes this long (seconds),
# then the stream is tried again (the peer may have been upgraded meanwhile).
UNARY_FALLBACK = 60.0

Message = pb.PromiseRequest | pb.WriteRequest | pb.LearnedRequest
Response = pb.PromiseResponse | pb.WriteResponse


class FetchFailed(Exception):
    """A span's fetch on a lane did not complete (the connection broke, or no answer in
    time): as a failed Fetch call, the copy tries the other sources."""


def _why(error: BaseException) -> str:
    """A transport error in one line (a gRPC error's own text spans several)."""
    if isinstance(error, grpc.aio.AioRpcError):
        return f"{error.code().name}: {error.details()}"
    return str(error) or type(error).__name__


def _piggybackable(message: object) -> bool:
    """Learned ranges of the leader's own batches (not heartbeats, not full actions)."""
    return (
        isinstance(message, pb.LearnedRequest)
        and not message.actions
        and not message.runs
        and not message.leader_address
        and len(message.ranges) > 0
    )


@dataclass
class Peer:
    id: int
    address: str
    replica: pbg.ReplicaStub
    log: pbg.LogStub
    channel: grpc.aio.Channel | None = None  # to wait for it to connect (forwarding)


@dataclass(frozen=True)
class LocalReplica:
    """This replica's own acceptor/learner handlers: a message to ourselves skips gRPC."""

    promise: Callable[[pb.PromiseRequest], Awaitable[pb.PromiseResponse]]
    write: Callable[[pb.WriteRequest], Awaitable[pb.WriteResponse]]
    learned: Callable[[pb.LearnedRequest], None]
    fetched: Callable[[pb.FetchResponse], None]  # a Fetch answer's records, given up


class Peers(Mapping[int, Peer]):
    """The other replicas by id (empty until `connect`), and sending to any replica."""

    def __init__(
        self,
        config: ReplicaConfig,
        core: ReplicaCore,
        local: LocalReplica,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        on_reply: Callable[[Send, Response], None],
        on_failure: Callable[[Send], None],
        promise_timeout: float,
        metrics: ReplicaMetrics | None = None,
    ) -> None:
        self.config = config
        self.core = core
        self._local_replica = local
        self._spawn = spawn
        self._on_reply = on_reply
        self._on_failure = on_failure
        self._promise_timeout = promise_timeout
        self._peers: dict[int, Peer] = {}
        self._channels: dict[int, grpc.aio.Channel] = {}  # peer -> its channel in use
        self._held_learned: dict[int, pb.LearnedRequest] = {}
        # Each held range's linger timer, cancelled when the range rides on a write: a
        # timer left running fired `LEARNED_LINGER` after the range it was set for, and
        # sent whatever was held for the peer by then (the next append's range, held only
        # a moment) on its own. Serial appends a few ms apart sent over half their learned
        # ranges as separate Learned calls that way.
        self._linger: dict[int, asyncio.TimerHandle] = {}
        self._metrics = metrics or ReplicaMetrics(config.id)
        self._streams: dict[int, WriteStream] = {}
        self._unary_until: dict[int, float] = {}  # peer -> when to try its stream again
        self._lanes: dict[int, WriteLane] = {}  # peer -> its write lane (when configured)
        self._fetch_lanes: dict[int, FetchLane] = {}  # peer -> its fetch lane (catch-up)
        self._lane_said: dict[int, str] = {}  # peer -> what was last logged of its lane
        # peer -> why its writes fail, from the first failed write until one is answered
        # again: said once each way, not once a write (a peer down fails every write).
        self._writes_failing: dict[int, str] = {}
        # The last write encoded: a broadcast sends the same message to every peer.
        self._encoded: tuple[pb.WriteRequest | None, bytes] = (None, b"")
        self._stopped = False
        # TLS: what this replica presents to its peers (None: plaintext channels). Read at
        # each (re)connect, so a rotated certificate is presented from `reconnect` on.
        self.credentials: Callable[[], grpc.ChannelCredentials] | None = None
        # TLS: the context of each new write lane connection (None: plaintext lanes).
        self.lane_tls: Callable[[], ssl.SSLContext] | None = None

    # ---- the peers and their channels --------------------------------------------------

    def __getitem__(self, peer_id: int) -> Peer:
        return self._peers[peer_id]

    def __iter__(self) -> Iterator[int]:
        return iter(self._peers)

    def __len__(self) -> int:
        return len(self._peers)

    def connect(self) -> None:
        """Open a channel to every other replica (gRPC connects lazily, on the first call)."""
        self._install(self._open())

    def _open(self) -> dict[int, grpc.aio.Channel]:
        """A new channel to every other replica, with the credentials as they are now."""
        credentials = self.credentials() if self.credentials is not None else None
        channels = {}
        for peer_id, address in enumerate(self.config.peers):
            if peer_id == self.config.id:
                continue
            if credentials is None:
                channel = grpc.aio.insecure_channel(address, options=PEER_CHANNEL_OPTIONS)
            else:
                channel = grpc.aio.secure_channel(address, credentials, PEER_CHANNEL_OPTIONS)
            channels[peer_id] = channel
        return channels

    def _install(self, channels: dict[int, grpc.aio.Channel]) -> None:
        """Send everything to these peers over these channels from now on."""
        for peer_id, channel in channels.items():
            self._channels[peer_id] = channel
            address = self.config.peers[peer_id]
            self._peers[peer_id] = Peer(
                peer_id, address, pbg.ReplicaStub(channel), pbg.LogStub(channel), channel
            )
            opened = self._metrics.write_streams_opened.labels(str(peer_id))
            self._streams[peer_id] = WriteStream(channel, opened.inc)
            if self.config.write_lane_offset and peer_id not in self._lanes:
                host, port = lane_address(address, self.config.write_lane_offset)
                self._lanes[peer_id] = WriteLane(
                    host,
                    port,
                    self.config.log_id,
                    peer_id,
                    self.config.election_timeout,
                    self._metrics.write_lanes_opened.labels(str(peer_id)).inc,
                    tls=self._lane_context,
                )

    async def reconnect(self, grace: float) -> None:
        """New channels to every peer (with the credentials as they are now, after a
        certificate rotation). Each is taken into use once it is connected, or after
        `grace` seconds (a peer that is down connects later, as any channel does); until
        then the old channel carries every call to that peer. The old channels are closed
        `grace` seconds after all are replaced, so calls under way on them can finish (a
        write cut short fails as any lost write does).

        Why wait for the connection: a new channel's first call also waits for the name
        to resolve and the TLS handshake; on a cluster whose DNS search path is slow that
        took 2-3 s, and a leader whose heartbeats all waited there stepped down
        (check-quorum) at every rotation (docs/security.md)."""
        old_channels, old_streams = dict(self._channels), dict(self._streams)
        fresh = self._open()

        async def take_when_ready(peer_id: int, channel: grpc.aio.Channel) -> None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(channel.channel_ready(), grace)
            if self._stopped:
                await channel.close(grace=None)
            else:
                self._install({peer_id: channel})

        await asyncio.gather(*(take_when_ready(p, c) for p, c in fresh.items()))
        await asyncio.sleep(grace)
        for stream in old_streams.values():
            stream.close()
        for channel in old_channels.values():
            await channel.close(grace=None)

    def stop(self) -> None:
        """Send nothing more: learned ranges still held are dropped."""
        self._stopped = True

    async def close(self) -> None:
        for stream in self._streams.values():
            stream.close()
        for lane in self._lanes.values():
            lane.close()
        self.close_fetch_lanes()
        for channel in self._channels.values():
            await channel.close(grace=None)

    # ---- sending -----------------------------------------------------------------------

    def post(self, send: Send) -> None:
        """Send in the background; learned ranges for a peer wait for a write to ride on."""
        message = send.message
        learned = None
        if send.to != self.config.id:
            if _piggybackable(message):
                self._hold_learned(send.to, message)  # type: ignore[arg-type]
                return
            if isinstance(message, pb.WriteRequest):
                learned = self._learned_for(send.to, message)
                if self._stream_write(send, message, learned):
                    return
        self._spawn(self.send(send, learned))

    def _stream_write(
        self, send: Send, message: pb.WriteRequest, learned: pb.LearnedRequest | None
    ) -> bool:
        """Queue a write on the peer's stream now, its answer handled by a callback: no
        task per write, whose first turn would come after the leader's own write (a serial
        append waits for a follower's answer). False: the peer gets unary writes for now."""
        if time.monotonic() < self._unary_until.get(send.to, 0.0):
            return False
        encoded, suffix = self._encode(message, learned)
        lane = self._lane(send.to)
        writer = lane or self._streams[send.to]
        via = "write lane" if lane is not None else "gRPC stream"
        future = writer.start(encoded, self.config.append_timeout, suffix)
        future.add_done_callback(lambda f: self._stream_written(send, learned, f, via))
        return True

    def _lane_context(self) -> ssl.SSLContext | None:
        return self.lane_tls() if self.lane_tls is not None else None

    def _lane(self, peer_id: int) -> WriteLane | None:
        """The peer's write lane if it is open now (else its writes go on the gRPC stream,
        while the lane opens in the background)."""
        lane = self._lanes.get(peer_id)
        if lane is None:
            return None
        usable = lane.usable()
        said = "open" if usable else lane.last_error
        if said and said != self._lane_said.get(peer_id):
            self._lane_said[peer_id] = said
            if usable:
                log.info("write lane to replica %d open (%s:%d)", peer_id, lane.host, lane.port)
            else:
                log.warning("%s: writes to replica %d go on the gRPC stream", said, peer_id)
        return lane if usable else None

    def _stream_written(
        self,
        send: Send,
        learned: pb.LearnedRequest | None,
        future: asyncio.Future[pb.WriteResponse],
        via: str,
    ) -> None:
        if self._stopped or future.cancelled():
            return
        error = future.exception()
        if error is None:
            if self._writes_failing:
                self._write_answered(send.to)
            if send.round:
                self._on_reply(send, future.result())
        elif isinstance(error, StreamUnimplemented):
            # Nothing of the stream reached a handler: this write goes unary instead.
            log.info("replica %d has no WriteStream: unary writes to it", send.to)
            self._unary_until[send.to] = time.monotonic() + UNARY_FALLBACK
            self._spawn(self.send(send, learned))
        elif isinstance(error, TimeoutError | grpc.aio.AioRpcError | StreamBroken):
            self._failed(send, f"on its {via}: {_why(error)}")
        else:
            log.error("sending WriteRequest to replica %d failed", send.to, exc_info=error)
            self._failed(send)

    def broadcast_learned(self, message: pb.LearnedRequest) -> None:
        """Learn `message` here, then tell every peer (one way, in the background)."""
        self._local_replica.learned(message)
        for peer in self.values():
            self._spawn(self.send_one_way(peer, message))

    def _hold_learned(self, peer: int, message: pb.LearnedRequest) -> None:
        """Keep learned ranges for a peer until the next write to it (one RPC instead of
        two), or until `LEARNED_LINGER` passes with no write."""
        held = self._held_learned.get(peer)
        if held is not None and held.proposal != message.proposal:
            self._flush_learned(peer)
            held = None
        if held is None:
            held = pb.LearnedRequest(
                proposal=message.proposal,
                leader=message.leader,
                log_id=message.log_id,
                protocol=PROTOCOL,
            )
            self._held_learned[peer] = held
            self._linger[peer] = asyncio.get_running_loop().call_later(
                LEARNED_LINGER, self._flush_learned, peer
            )
        held.ranges.extend(message.ranges)

    def _learned_for(self, peer: int, write: pb.WriteRequest) -> pb.LearnedRequest | None:
        """The learned ranges held for `peer` that ride on this write (`WriteRequest.learned`,
        set when the write is sent), if any; ranges of another proposal go on their own."""
        held = self._take_held(peer)
        if held is None or held.proposal != write.proposal or write.HasField("learned"):
            if held is not None:
                self._spawn(self.send(Send(peer, held)))
            return None
        return held

    def _flush_learned(self, peer: int) -> None:
        held = self._take_held(peer)
        if held is not None and not self._stopped:
            self._spawn(self.send(Send(peer, held)))

    def _take_held(self, peer: int) -> pb.LearnedRequest | None:
        """The learned ranges held for `peer` (none: None), no longer held; their linger
        timer stopped."""
        timer = self._linger.pop(peer, None)
        if timer is not None:
            timer.cancel()
        return self._held_learned.pop(peer, None)

    async def send_one_way(self, peer: Peer, message: pb.LearnedRequest) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await peer.replica.Learned(message, timeout=max(1.0, self.config.election_timeout))

    async def heartbeat(self, peer: Peer, message: pb.LearnedRequest) -> pb.LearnedResponse | None:
        """Send a leader's heartbeat; the peer's answer (its promise), None if it did not
        answer in time."""
        try:
            return await peer.replica.Learned(
                message, timeout=max(1.0, self.config.election_timeout)
            )
        except (TimeoutError, grpc.aio.AioRpcError):
            return None

    async def send(self, send: Send, learned: pb.LearnedRequest | None = None) -> None:
        """Send one message (a write with `learned` riding on it) and hand the round the
        answer or the failure."""
        message = send.message
        try:
            if send.to == self.config.id:
                response = await self._local(message)
            else:
                response = await self._remote(self._peers[send.to], message, learned)
        except (TimeoutError, grpc.aio.AioRpcError, RpcError, StreamBroken, StorageError) as exc:
            # StorageError: this replica's own disk (full, or a corrupt record the node is
            # repairing) failed the local half of the round.
            self._failed(send, _why(exc))
            return
        except Exception:
            # A bug, not a peer's failure; but the round must still hear that this send
            # failed (or it waits for an answer that never comes), and the log says so.
            log.exception("sending %s to replica %d failed", type(message).__name__, send.to)
            self._failed(send)
            return
        if self._writes_failing and isinstance(message, pb.WriteRequest):
            self._write_answered(send.to)
        if send.round and response is not None:
            self._on_reply(send, response)

    def _failed(self, send: Send, why: str = "") -> None:
        """A message to a peer failed (`why`: in transport; "" when said already)."""
        if isinstance(send.message, pb.WriteRequest) and send.to != self.config.id:
            self._metrics.peer_write_failures.labels(str(send.to)).inc()
            if why and send.to not in self._writes_failing:
                self._writes_failing[send.to] = why
                log.warning(
                    "writes to replica %d fail (%s); counted in rlog_peer_write_failures_total "
                    "until one is answered again",
                    send.to,
                    why,
                )
        if send.round:
            self._on_failure(send)

    def _write_answered(self, peer: int) -> None:
        """A write to `peer` was answered: its failing writes, if any, have ended."""
        if self._writes_failing.pop(peer, None) is not None:
            log.info("writes to replica %d answered again", peer)

    async def _local(self, message: Message) -> Response | None:
        if isinstance(message, pb.PromiseRequest):
            return await self._local_replica.promise(message)
        if isinstance(message, pb.WriteRequest):
            return await self._local_replica.write(message)
        self._local_replica.learned(message)
        return None

    async def _remote(
        self, peer: Peer, message: Message, learned: pb.LearnedRequest | None
    ) -> Response | None:
        if isinstance(message, pb.PromiseRequest):
            return await peer.replica.Promise(message, timeout=self._promise_timeout)
        if isinstance(message, pb.WriteRequest):
            return await self._write(peer, message, learned)
        await peer.replica.Learned(message, timeout=max(1.0, self.config.election_timeout))
        return None

    async def _write(
        self, peer: Peer, message: pb.WriteRequest, learned: pb.LearnedRequest | None
    ) -> pb.WriteResponse:
        """A write to a peer: on its stream, or unary if the peer has no WriteStream.
        `learned` rides on it as `WriteRequest.learned` (unset in the shared message): on the
        stream its encoding is appended to the write's, which every peer shares."""
        timeout = self.config.append_timeout
        if time.monotonic() >= self._unary_until.get(peer.id, 0.0):
            encoded, suffix = self._encode(message, learned)
            lane = self._lane(peer.id)
            if lane is not None:
                return await lane.write(encoded, timeout, suffix)
            try:
                return await self._streams[peer.id].write(encoded, timeout, suffix)
            except StreamUnimplemented:
                # Nothing of the stream reached a handler: this write goes unary instead.
                log.info("replica %d has no WriteStream: unary writes to it", peer.id)
                self._unary_until[peer.id] = time.monotonic() + UNARY_FALLBACK
        if learned is not None:
            copy = pb.WriteRequest()
            copy.CopyFrom(message)
            copy.learned.CopyFrom(learned)
            message = copy
        response: pb.WriteResponse = await peer.replica.Write(message, timeout=timeout)
        return response

    def _encode(
        self, message: pb.WriteRequest, learned: pb.LearnedRequest | None
    ) -> tuple[bytes, bytes]:
        """The write's encoding, made once for every peer it goes to, and the learned ranges
        riding to this peer as the field to append to it (kept apart: joined, each peer's
        write would copy the batch's bytes)."""
        last, encoded = self._encoded
        if message is not last:
            encoded = message.SerializeToString()
            self._encoded = (message, encoded)
        return encoded, b"" if learned is None else learned_field(learned)

    # ---- Fetch -------------------------------------------------------------------------

    def paced(self, purpose: str, seconds: float) -> None:
        """A catch-up's or a pull's copy (`purpose`) waits `seconds` to keep to
        --catchup-rate: counted, so a dashboard shows when the cap is what holds it."""
        self._metrics.copy_paced.labels(purpose).inc(seconds)

    async def fetch_span(
        self,
        source: int,
        first: int,
        last: int,
        max_bytes: int,
        time_limit: float,
        purpose: str = "catchup",
    ) -> tuple[list[pb.FetchResponse], bool]:
        """Fetch [first, last] from peer `source` (a span of a catch-up's or a pull's copy,
        `purpose`, counted in its metric): its answers, and whether they are all there
        (False: cut once they held `max_bytes` of values). On the peer's fetch lane when the
        log has lanes and it is open, else a Fetch call (the lane opens in the background
        meanwhile). Raises grpc.aio.AioRpcError, or FetchFailed for a lane that broke or
        timed out."""
        spans = self._metrics.pull_fetches if purpose == "pull" else self._metrics.catchup_fetches
        lane = self.fetch_lane(source)
        if lane is not None:
            spans.labels("lane").inc()
            try:
                answers = await lane.fetch(first, last, last - first + 1, max_bytes, time_limit)
            except (TimeoutError, ConnectionBroken) as exc:
                raise FetchFailed(f"on its fetch lane: {exc or type(exc).__name__}") from None
            return list(answers.answers), not answers.cut
        spans.labels("grpc").inc()
        request = pb.FetchRequest(
            to=last, max_actions=last - first + 1, log_id=self.config.log_id, protocol=PROTOCOL
        )
        setattr(request, "from", first)  # a Python keyword
        call = self._peers[source].replica.Fetch(request, timeout=time_limit)
        chunks, held = [], 0
        async for chunk in call:
            chunks.append(chunk)
            held += answer_bytes(chunk)
            if held >= max_bytes:
                call.cancel()
                return chunks, False
        return chunks, True

    def fetch_lane(self, peer_id: int) -> FetchLane | None:
        """The peer's fetch lane if it is open now; if not, it starts opening in the
        background (None without lanes)."""
        if not self.config.write_lane_offset:
            return None
        lane = self._fetch_lanes.get(peer_id)
        if lane is None:
            host, port = lane_address(self.config.peers[peer_id], self.config.write_lane_offset)
            lane = self._fetch_lanes[peer_id] = FetchLane(
                host,
                port,
                self.config.log_id,
                peer_id,
                self.config.election_timeout,
                tls=self._lane_context,
            )
        return lane if lane.usable() else None

    def close_fetch_lanes(self) -> None:
        """Close the fetch lanes (a copy is over; each holds a buffer of its last answer's
        size)."""
        lanes, self._fetch_lanes = self._fetch_lanes, {}
        for lane in lanes.values():
            lane.close()

    def learn_fetched(self, chunk: pb.FetchResponse) -> None:
        """Learn what a Fetch answer holds (`ReplicaCore.on_fetched`); the answer is given
        up."""
        self._local_replica.fetched(chunk)

    def fetch(self, request: pb.FetchRequest) -> Iterator[bytes]:
        """Serve a Fetch: serialized FetchResponse answers (`runtime/fetch.py`)."""
        return fetch_answers(self.core, request)
