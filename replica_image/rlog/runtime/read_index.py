"""The read index's driver (the rules: protocol/read_index.py): where the leader confirms a
read. A linearizable read waits (`wait`) until a heartbeat round sent after it arrived is
answered by a quorum that still follows this leader (`confirm_leadership`, also the Status
of a leader asked to confirm), and until the leader has learned what it had acknowledged
when the read arrived. The rounds' heartbeats are the election's (runtime/election.py):
their answers count for check-quorum too.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, NamedTuple

from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import Coordinator
from rlog.protocol.peer_version import PROTOCOL, counts_for_read_index
from rlog.protocol.read_index import Confirmed, Gather, ReadIndex, StartRound
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.errors import RpcError
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.peers import Peer, Peers
from rlog.wire import Reason

# A read round first asks only as many peers as a quorum needs; the others too if it is not
# confirmed after a few typical round times (bounds in seconds: a loaded machine's rounds
# are slow, and asking everyone each time would undo the saving).
READ_ROUND_WIDEN_ROUNDS = 4
READ_ROUND_WIDEN_MIN = 0.005
# Reads arriving while a round is in flight: their round leaves this long after that one ends,
# with every read that arrived meanwhile (fewer rounds under concurrent reads).
READ_ROUND_GATHER = 0.001


class RoundSent(NamedTuple):
    """The read round in flight (0: none) and when it left (the event loop's time)."""

    round: int
    at: float


NO_ROUND = RoundSent(0, 0.0)

Heartbeat = Callable[[Peer, pb.LearnedRequest], Awaitable[pb.LearnedResponse | None]]


class ReadIndexDriver:
    """The node's side of the read index: it sends the rounds `ReadIndex` asks for (to the
    peers that answered last first, the others if those are slow), feeds it their answers
    (`heartbeat`: the election's, counting them for check-quorum too) and serves or fails
    the reads it confirms. `last_answers`: when each peer last answered this leader.
    `confirm` False: reads are served unconfirmed (test only, NOT linearizable)."""

    def __init__(
        self,
        config: ReplicaConfig,
        core: ReplicaCore,
        coordinator: Coordinator,
        peers: Peers,
        metrics: ReplicaMetrics,
        heartbeat: Heartbeat,
        last_answers: Callable[[], Mapping[int, float]],
        learned_changed: asyncio.Event,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        confirm: bool = True,
    ) -> None:
        self.config = config
        self.core = core
        self.coordinator = coordinator
        self.peers = peers
        self.metrics = metrics
        self.heartbeat = heartbeat
        self.last_answers = last_answers
        self.learned_changed = learned_changed
        self.spawn = spawn
        self.confirm = confirm
        self.stopped = False
        self.read_index = ReadIndex(config.id, len(config.peers))
        self._waiters: dict[object, asyncio.Future[None]] = {}
        self._round_sent = NO_ROUND
        self._round_time = 0.0  # a moving average of how long rounds take to confirm

    async def _heartbeat(self, peer: Peer, heartbeat: pb.LearnedRequest, round_id: int) -> None:
        """Send one heartbeat of a read round; its answer counts for the read index."""
        answer = await self.heartbeat(peer, heartbeat)
        if answer is None or not counts_for_read_index(answer.protocol):
            return  # no answer; an older build's is none either (protocol/peer_version.py)
        self.read_index.on_answer(round_id, peer.id, answer.promised)
        self._drain()

    async def wait(self) -> None:
        """Wait until a linearizable read may be served here (docs/protocol.md, "Linearizable
        reads"): the read index is what this leader has acknowledged by now; a quorum must
        follow it after now, and it must have learned up to the read index."""
        index = max(self.core.learned, self.coordinator.acknowledged_end)
        await self.confirm_leadership()
        if self.core.learned >= index:
            return
        # A later batch was chosen before an earlier one still in flight: wait for that one.
        deadline = time.monotonic() + self.config.append_timeout
        while self.core.learned < index:
            if not self.coordinator.leading:
                raise RpcError(Reason.NOT_LEADER, "this replica is not the leader any more")
            if time.monotonic() >= deadline:
                raise RpcError(
                    Reason.NOT_LEARNED,
                    f"position {index} (acknowledged) is not learned on the leader yet",
                )
            self.learned_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.learned_changed.wait(), 0.05)

    async def confirm_leadership(self, time_limit: float | None = None) -> None:
        """Return once a quorum has followed this leader after now (a heartbeat round sent
        after this call, answered by a quorum that has not promised a higher proposal);
        raise if leadership is lost or not confirmed within `time_limit` s (default 2T)."""
        if not self.confirm:
            return
        token = object()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._waiters[token] = future
        self.read_index.request(token, self.coordinator.proposal)
        self._drain()
        limit = 2 * self.config.election_timeout if time_limit is None else time_limit
        # One timer per read (cheaper than wait_for's wrapping on this hot path).
        timer = loop.call_later(limit, _unconfirmed, future, limit)
        try:
            await future
        finally:
            timer.cancel()
            self._waiters.pop(token, None)
            if not future.done() or future.cancelled() or future.exception() is not None:
                self.read_index.cancel(token)  # a confirmed read is no longer waiting there

    def _drain(self) -> None:
        for output in self.read_index.take():
            if isinstance(output, StartRound):
                self.metrics.read_rounds.inc()
                heartbeat = pb.LearnedRequest(
                    proposal=output.proposal,
                    leader=self.config.id,
                    leader_address=self.config.address,
                    log_id=self.config.log_id,
                    protocol=PROTOCOL,
                )
                first, rest = self._round_peers()
                for peer in first:
                    self.spawn(self._heartbeat(peer, heartbeat, output.round))
                loop = asyncio.get_running_loop()
                self._round_sent = RoundSent(output.round, loop.time())
                if rest:
                    widen = min(
                        max(READ_ROUND_WIDEN_MIN, READ_ROUND_WIDEN_ROUNDS * self._round_time),
                        self.config.heartbeat_interval / 2,
                    )
                    loop.call_later(widen, self._widen_round, output.round, heartbeat, rest)
                # A round that lost answers is sent again (with every read still waiting).
                loop.call_later(self.config.heartbeat_interval, self._round_timeout, output.round)
            elif isinstance(output, Gather):
                asyncio.get_running_loop().call_later(
                    READ_ROUND_GATHER, self._send_round, output.round
                )
            elif isinstance(output, Confirmed):
                self.metrics.read_confirmations.inc(len(output.tokens))
                self._time_round()
                # The round counts this replica as following itself: only if its own
                # acceptor has not promised a higher proposal either.
                still_leading = (
                    self.coordinator.leading
                    and self.coordinator.proposal == output.proposal
                    and self.core.promised <= output.proposal
                )
                for token in output.tokens:
                    future = self._waiters.get(token)
                    if future is None or future.done():
                        continue
                    if still_leading:
                        future.set_result(None)
                    else:
                        future.set_exception(
                            RpcError(Reason.NOT_LEADER, "this replica is not the leader any more")
                        )

    def _time_round(self) -> None:
        """A round was confirmed: fold how long it took into the typical round time."""
        round_id, sent = self._round_sent
        if round_id:
            took = asyncio.get_running_loop().time() - sent
            self._round_time = 0.8 * self._round_time + 0.2 * took
            self._round_sent = NO_ROUND

    def _send_round(self, round_id: int) -> None:
        if self.stopped:
            return
        self.read_index.send_due(round_id)
        self._drain()

    def _round_peers(self) -> tuple[list[Peer], list[Peer]]:
        """Whom a read round asks first: the quorum - 1 peers that answered this leader
        last (with it they make a quorum; the others then never handle the round), and the
        rest, asked only if those have not confirmed the round in a few typical round times."""
        answered = self.last_answers()
        ranked = sorted(self.peers.values(), key=lambda p: -answered.get(p.id, 0.0))
        need = self.read_index.quorum - 1
        return ranked[:need], ranked[need:]

    def _widen_round(self, round_id: int, heartbeat: pb.LearnedRequest, rest: list[Peer]) -> None:
        if self.stopped or self.read_index.round != round_id:
            return  # confirmed (or given up) already
        for peer in rest:
            self.spawn(self._heartbeat(peer, heartbeat, round_id))

    def _round_timeout(self, round_id: int) -> None:
        if self.stopped:
            return
        self.read_index.on_timeout(round_id)
        self._drain()

    def fail_reads(self, reason: str) -> None:
        """Leadership was lost: every read waiting for a confirmation fails (not served)."""
        for token in self.read_index.cancel_all():
            future = self._waiters.get(token)
            if future is not None and not future.done():
                future.set_exception(RpcError(Reason.NOT_LEADER, reason))


def _unconfirmed(future: asyncio.Future[None], limit: float) -> None:
    if not future.done():
        future.set_exception(
            RpcError(
                Reason.LEADERSHIP_UNCONFIRMED,
                f"could not confirm within {limit:g} s that a quorum still follows this "
                "leader; the read was not served",
            )
        )
