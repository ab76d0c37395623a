"""Forwarding: a replica that does not lead passes appends, truncations and consistent reads
to the leader it hears from, marked `FORWARDED` so the leader never forwards them again.

The caller's retry rule must stay exact across the extra hop: a forwarded call that broke
after it may have reached the leader has an unknown outcome (reason OUTCOME_UNKNOWN, see
`RpcError.from_leader`), never a plain UNAVAILABLE that a client would retry into a
duplicate append.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc

from rlog.client.errors import is_connect_failure
from rlog.client.packing import answered_positions
from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import NO_CONDITIONS, Conditions
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.errors import RpcError
from rlog.runtime.peers import Peer
from rlog.wire import FORWARDED, ErrorDetails, Reason

T = TypeVar("T")

# Seconds a forwarded call waits at a time for the channel of a leader still heard from to
# connect (`Forwarding._after_connect_failure`).
LEADER_CONNECT_WAIT = 1.0


@dataclass(frozen=True)
class KnownLeader:
    """What this replica knows of the leader right now (the election keeps it current)."""

    leading: bool  # this replica leads
    leader_id: int | None  # the leader last heard from, if any
    heard_ago: float  # seconds of election time since it was last heard from
    reason: str  # why this replica cannot serve, if it says


class Forwarding:
    def __init__(
        self,
        config: ReplicaConfig,
        core: ReplicaCore,
        peers: Mapping[int, Peer],
        known_leader: Callable[[], KnownLeader],
    ) -> None:
        self.config = config
        self.core = core
        self.peers = peers
        self.known_leader = known_leader
        # Forwarded calls made again because the leader's channel could not connect.
        self.leader_connect_waits = 0
        # Forwarded calls sent on to a new leader after the old one answered NOT_LEADER.
        self.not_leader_redirects = 0

    @property
    def answer_limit(self) -> float:
        """Seconds a forwarded call waits for the leader's answer: the leader's own limit
        (the append timeout: it answers TIMEOUT by then) and 5 s for that answer to come
        back. The deadline of a forwarded unary call, and of a forwarded read's start."""
        return self.config.append_timeout + 5

    @property
    def read_start_limit(self) -> float:
        """Seconds a forwarded read waits for the leader's first answer: the leader's own
        limits to start a read, past which it fails it with a clear error (2 election
        timeouts to confirm its leadership, the append timeout to learn what it had
        acknowledged: runtime/read_index.py), and the 5 s of `answer_limit` for that
        answer to come back."""
        return 2 * self.config.election_timeout + self.answer_limit

    async def await_leader(self, forwarded: bool) -> Peer | None:
        """None if this replica leads; else the leader's peer. Waits for an election."""
        deadline = time.monotonic() + 3 * self.config.election_timeout + 1
        while True:
            known = self.known_leader()
            if known.leading:
                return None
            if self.core.status != pb.VOTING and not forwarded and known.leader_id is None:
                raise RpcError(
                    Reason.NO_LEADER,
                    f"no leader: this replica is {pb.Status.Name(self.core.status)}"
                    + (f" ({known.reason})" if known.reason else ""),
                )
            if (
                not forwarded
                and known.leader_id is not None
                and known.leader_id != self.config.id
                and known.heard_ago < 2 * self.config.election_timeout
            ):
                return self.peers[known.leader_id]
            if time.monotonic() > deadline:
                raise RpcError(
                    Reason.NOT_LEADER if forwarded else Reason.NO_LEADER,
                    "this replica is not the leader"
                    if forwarded
                    else "no leader elected: a quorum of VOTING replicas may be unreachable",
                )
            await asyncio.sleep(0.02)

    async def append(
        self,
        leader: Peer,
        data: bytes,
        offsets: bytes,
        conditions: Conditions = NO_CONDITIONS,
    ) -> list[int]:
        """Forward an append (packed values) to the leader, with its conditions and
        session; its positions."""
        request = pb.AppendRequest(
            data=data,
            offsets=offsets,
            session=conditions.session,
            sequence=conditions.sequence,
            acked_below=conditions.acked_below,
            epoch=conditions.epoch,
            session_secret=conditions.secret,
        )
        if conditions.if_next is not None:
            request.if_next = conditions.if_next
        result = await self._forwarded_call(
            leader,
            lambda peer: peer.log.Append(
                request,
                metadata=((FORWARDED, "1"),),
                timeout=self.answer_limit,
            ),
        )
        return list(answered_positions(result))

    async def truncate(self, leader: Peer, to: int) -> int:
        """Forward a truncation to the leader; the position of its TRUNCATE entry."""
        response = await self._forwarded_call(
            leader,
            lambda peer: peer.log.Truncate(
                pb.TruncateRequest(to=to),
                metadata=((FORWARDED, "1"),),
                timeout=self.answer_limit,
            ),
        )
        return int(response.position)

    async def take_epoch(self, leader: Peer) -> pb.TakeEpochResponse:
        response: pb.TakeEpochResponse = await self._forwarded_call(
            leader,
            lambda peer: peer.log.TakeEpoch(
                pb.TakeEpochRequest(),
                metadata=((FORWARDED, "1"),),
                timeout=self.answer_limit,
            ),
        )
        return response

    async def open_session(self, leader: Peer) -> pb.OpenSessionResponse:
        response: pb.OpenSessionResponse = await self._forwarded_call(
            leader,
            lambda peer: peer.log.OpenSession(
                pb.OpenSessionRequest(),
                metadata=((FORWARDED, "1"),),
                timeout=self.answer_limit,
            ),
        )
        return response

    async def _forwarded_call(self, leader: Peer, call: Callable[[Peer], Awaitable[T]]) -> T:
        """Make `call` on the leader; a call that could not even connect sent nothing, so it
        is made again on the leader's channel once it connects, or on the next leader's
        (`_after_connect_failure`), and one the replica refused as not the leader did
        nothing, so it goes to the leader heard from since (`_next_leader`)."""
        give_up_at = time.monotonic() + self.config.append_timeout
        while True:
            peer = self.peers[leader.id]  # a certificate rotation replaces the channels
            try:
                return await call(peer)
            except grpc.aio.AioRpcError as exc:
                again = await self._after_connect_failure(peer, exc, give_up_at)
                if again is not None:
                    leader = again
                    continue
                following = await self._next_leader(peer, exc, give_up_at)
                if following is None:
                    raise RpcError.from_leader(exc, mutating=True) from None
                leader = following

    async def _next_leader(
        self, peer: Peer, exc: grpc.aio.AioRpcError, give_up_at: float
    ) -> Peer | None:
        """After `peer` refused a forwarded call as not the leader (it did nothing): the
        leader heard from once another is (polled until `give_up_at`); None if the refusal
        was something else, or no other leader is heard in time, or this replica leads now
        (the caller's next try finds it here).

        Why: this replica forwarded to the leader it last heard from, but leadership moved
        meanwhile (the refusing replica waited for itself to lead again first). The request
        is as new as it was; failing it would refuse a log that has a leader."""
        verdict = ErrorDetails.from_metadata(exc.trailing_metadata())
        if verdict is None or verdict.reason != Reason.NOT_LEADER:
            return None
        while time.monotonic() < give_up_at:
            known = self.known_leader()
            if known.leading:
                return None
            if (other := self._other_leader(known, peer)) is not None:
                return other
            await asyncio.sleep(0.02)
        return None

    def _other_leader(self, known: KnownLeader, peer: Peer) -> Peer | None:
        """The leader heard within two election timeouts, if it is not `peer` (counted as a
        redirect)."""
        if (
            known.leader_id is None
            or known.leader_id == peer.id
            or known.heard_ago >= 2 * self.config.election_timeout
        ):
            return None
        self.not_leader_redirects += 1
        return self.peers[known.leader_id]

    async def _after_connect_failure(
        self, peer: Peer, exc: grpc.aio.AioRpcError, give_up_at: float
    ) -> Peer | None:
        """After a forwarded call to `peer` failed without connecting (it sent nothing):
        where to make it again, as soon as that is known (None: pass the failure on, as
        for any other):

        - a leader heard from since, other than `peer`: there (the election moved on);
        - `peer` while it is still heard from (within an election timeout): it again once
          its channel connects, waiting up to LEADER_CONNECT_WAIT at a time. Why: a leader whose pod
          was recreated has a new address, and until cluster DNS answers with it (CoreDNS
          caches answers up to 30 s on kubeadm clusters) this replica's channel dials the
          old one; the leader is alive meanwhile (its heartbeats arrive), so failing the
          client's request at once would refuse a healthy log;
        - a `peer` not heard from for a whole election timeout is gone (a killed process):
          wait for the election to name the next leader, for as long as a follower waits for
          one (`await_leader`), and go there;
        - this replica leads now, or there is no time left: None.

        Rejected: waiting on the dead leader's channel until it had been silent for two
        election timeouts (until December 2026), which held a client's append for 2 s after
        the leader was killed although the next leader was elected in about 1.3 s."""
        if exc.code() != grpc.StatusCode.UNAVAILABLE or not is_connect_failure(exc.details() or ""):
            return None
        silent_until = time.monotonic() + 3 * self.config.election_timeout + 1
        while (now := time.monotonic()) < give_up_at:
            known = self.known_leader()
            if known.leading:
                return None  # the client's next try finds the leader here
            if (other := self._other_leader(known, peer)) is not None:
                return other
            if known.leader_id == peer.id and known.heard_ago < self.config.election_timeout:
                if peer.channel is None:
                    return None
                self.leader_connect_waits += 1
                await self._channel_ready_or_moved(peer, min(give_up_at - now, LEADER_CONNECT_WAIT))
                return peer
            if now >= silent_until:
                return None
            await asyncio.sleep(0.02)  # the leader is gone: an election is under way
        return None

    async def _channel_ready_or_moved(self, peer: Peer, limit: float) -> None:
        """Wait up to `limit` seconds for `peer`'s channel to connect, or until the leader
        heard from is no longer `peer` or has been silent for an election timeout."""
        assert peer.channel is not None
        ready = asyncio.ensure_future(peer.channel.channel_ready())
        give_up_at = time.monotonic() + limit
        try:
            while not ready.done() and time.monotonic() < give_up_at:
                known = self.known_leader()
                if known.leader_id != peer.id or known.heard_ago >= self.config.election_timeout:
                    return
                await asyncio.wait([ready], timeout=min(0.05, give_up_at - time.monotonic()))
        finally:
            ready.cancel()

    async def read(
        self, leader: Peer, request: pb.ReadRequest, time_limit: float | None = None
    ) -> AsyncIterator[pb.ReadResponse]:
        """Stream a consistent read from the leader, within `time_limit` seconds if given (a
        read changes nothing: any error is passed on as it is; one that could not connect is
        tried again, and one refused as not the leader goes to the new leader, as
        `_forwarded_call` does, before anything was passed on). The leader must start
        answering within `read_start_limit` (`_first_answer`)."""
        start = time.monotonic()
        give_up_at = start + self.config.append_timeout
        if time_limit is not None:
            give_up_at = min(give_up_at, start + time_limit)
        answered = False
        while True:
            peer = self.peers[leader.id]
            left = None if time_limit is None else max(give_up_at - time.monotonic(), 0.001)
            call = peer.log.Read(request, metadata=((FORWARDED, "1"),), timeout=left)
            try:
                response = await self._first_answer(peer, call)
                while isinstance(response, pb.ReadResponse):  # else EOF: the read is complete
                    answered = True
                    yield response
                    response = await call.read()
                return
            except grpc.aio.AioRpcError as exc:
                if answered:
                    raise RpcError.from_leader(exc, mutating=False) from None
                again = await self._after_connect_failure(peer, exc, give_up_at)
                if again is not None:
                    leader = again
                    continue
                following = await self._next_leader(peer, exc, give_up_at)
                if following is None:
                    raise RpcError.from_leader(exc, mutating=False) from None
                leader = following
            finally:
                call.cancel()  # a no-op once the call ended; else the leader stops sending

    async def _first_answer(
        self, peer: Peer, call: grpc.aio.UnaryStreamCall[pb.ReadRequest, pb.ReadResponse]
    ) -> object:
        """The leader's first answer to a forwarded read (a response, or grpc.aio.EOF if the
        read is empty), or LEADER_UNAVAILABLE (a read changed nothing: the client may try
        another replica) if none came within `read_start_limit`.

        Why a bound: a leader that stopped answering (SIGSTOP, a partition) keeps its
        connection open, and the read waited until gRPC's keepalive gave up (about a
        minute), and with it the client of a non-stale Tail, whose start is such a read.
        Why only the start: once the leader answers, it is there; the rest of the stream
        may rightly take long (a large read sent at the pace its reader takes it), and a
        caller's own `time_limit` still bounds the whole call."""
        limit = self.read_start_limit
        try:
            return await asyncio.wait_for(call.read(), limit)  # a timeout cancels the call
        except TimeoutError:
            raise RpcError(
                Reason.LEADER_UNAVAILABLE,
                f"the leader (replica {peer.id}, {peer.address}) did not start the forwarded "
                f"read within {limit:g} s (2 election timeouts + append timeout + 5 s)",
            ) from None
