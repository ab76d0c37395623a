"""The election's driver (the rules: protocol/election.py): it ticks `Election` on the
election clock, runs the pre-vote's Status calls it asks for and stands (`Coordinator.elect`)
when it says; a leader that has not heard from a quorum within two election timeouts steps
down (check-quorum); a leader sends heartbeats, and their answers count for check-quorum
(and, for a read round, for the read index: runtime/read_index.py); a leader's heartbeat
tells the election whom this replica follows (`on_heartbeat`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import grpc

from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import Coordinator
from rlog.protocol.election import Election, StandDown
from rlog.protocol.peer_version import PROTOCOL
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.peers import Peer, Peers

log = logging.getLogger("rlog.node")

ELECTION_TICK = 0.02  # seconds between looks at the election timer


class ElectionClock:
    """The election's time (etcd raft counts ticks for the same reason): it advances with the
    election loop's turns, by the real time elapsed but at most two ticks per turn. A process
    starved of CPU (an overloaded machine, a long GC-like pause) then does not find on waking
    that whole timeouts went by while the answers that prove a quorum still follows it sit
    unread in its sockets; it reads them within the next turns. Liveness only: no safety
    property rests on time (reads are confirmed by a quorum, not by a lease)."""

    def __init__(self) -> None:
        self._now = 0.0
        self._real = time.monotonic()

    def now(self) -> float:
        return self._now

    def advance(self) -> None:
        real = time.monotonic()
        self._now += min(max(real - self._real, 0.0), 2 * ELECTION_TICK)
        self._real = real


class ElectionDriver:
    """The node's side of the election: `election_loop` runs it (supervised by the node),
    the events of the rest of the replica reach it through the methods below, each read on
    the election clock. `check_quorum` False: a leader never steps down for want of answers
    (test only, as before check-quorum existed)."""

    def __init__(
        self,
        config: ReplicaConfig,
        core: ReplicaCore,
        coordinator: Coordinator,
        election: Election,
        clock: ElectionClock,
        peers: Peers,
        metrics: ReplicaMetrics,
        dispatch: Callable[[], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        check_quorum: bool = True,
    ) -> None:
        self.config = config
        self.core = core
        self.coordinator = coordinator
        self.election = election
        self.clock = clock
        self.peers = peers
        self.metrics = metrics
        self.dispatch = dispatch
        self.spawn = spawn
        self.check_quorum = check_quorum
        self.stopped = False

    async def election_loop(self) -> None:
        """Tick the election state machine; run the pre-vote it asks for, stand if it says."""
        self.election.restart_timer()  # a (re)started loop first listens a full timeout
        while True:
            await asyncio.sleep(ELECTION_TICK)
            self.clock.advance()
            self._check_quorum()
            if self.election.tick(self.clock.now()) is None:
                continue
            outcome = self.election.on_pre_vote(self.clock.now(), await self.peer_statuses())
            if isinstance(outcome, StandDown):
                log.debug("not standing for election: %s", outcome.reason)
                continue
            log.debug("standing for election: %s", outcome.reason)
            self.metrics.elections.labels("started").inc()
            self.coordinator.elect()
            self.dispatch()

    def _check_quorum(self) -> None:
        """Step down if a quorum has not answered lately (`Election.check_quorum`)."""
        if not self.check_quorum:
            return  # test only: as before check-quorum existed
        now = self.clock.now()
        step = self.election.check_quorum(now)
        if step is None:
            return
        log.warning("stepping down: %s", step.reason)
        self.metrics.elections.labels("check_quorum").inc()
        self.coordinator.step_down(step.reason)
        self.dispatch()
        self.election.stepped_down(now)

    async def peer_statuses(self) -> list[pb.StatusResponse | None]:
        """The pre-vote's question: every peer's Status (None: no answer in time)."""

        async def status_of(peer: Peer) -> pb.StatusResponse | None:
            try:
                # What the peer believes now: no leadership confirmation on this budget.
                return await peer.log.Status(pb.StatusRequest(local=True), timeout=0.5)
            except grpc.aio.AioRpcError:
                return None

        return list(await asyncio.gather(*(status_of(p) for p in self.peers.values())))

    # ---- heartbeats ---------------------------------------------------------------------

    async def send_heartbeats(self) -> None:
        heartbeat = pb.LearnedRequest(
            proposal=self.coordinator.proposal,
            leader=self.config.id,
            leader_address=self.config.address,
            leader_learned=self.core.learned,
            log_id=self.config.log_id,
            protocol=PROTOCOL,
        )
        for peer in self.peers.values():
            self.spawn(self._heartbeat(peer, heartbeat))

    async def _heartbeat(self, peer: Peer, heartbeat: pb.LearnedRequest) -> None:
        await self.heartbeat(peer, heartbeat)

    async def heartbeat(
        self, peer: Peer, heartbeat: pb.LearnedRequest
    ) -> pb.LearnedResponse | None:
        """Send one heartbeat; its answer counts for the check-quorum and is returned (a
        read round's counts for the read index too); None: no answer."""
        answer = await self.peers.heartbeat(peer, heartbeat)
        if answer is None or self.stopped:
            return None
        self.on_peer_answered(peer.id)
        if answer.promised > self.coordinator.proposal and self.coordinator.on_peer_promise(
            peer.id, answer.promised
        ):
            self.dispatch()
        return answer

    def on_heartbeat(self, request: pb.LearnedRequest) -> None:
        """A leader's heartbeat: this replica follows it, and a coordinator of ours elected
        below it gives way."""
        step_down = self.election.on_heartbeat(
            self.clock.now(), request.leader, request.leader_address, request.proposal
        )
        if step_down is not None:
            self.coordinator.step_down(step_down.reason)
            self.dispatch()
        self.coordinator.observe(request.proposal)

    # ---- events and questions -----------------------------------------------------------

    def on_peer_answered(self, peer: int) -> None:
        self.election.on_peer_answered(self.clock.now(), peer)

    def last_answers(self) -> Mapping[int, float]:
        """While leading: when each peer last answered (the election clock's time)."""
        return self.election.peer_answered

    def on_leading(self) -> None:
        self.election.on_leading(self.clock.now())

    def on_demoted(self, retry_after: float) -> None:
        if self.election.on_demoted(self.clock.now(), retry_after):
            self.metrics.elections.labels("demoted").inc()
        else:
            self.metrics.elections.labels("lost").inc()

    def step_down(self) -> None:
        if self.coordinator.leading:
            self.coordinator.step_down("asked to step down")
            self.dispatch()
            # Give another replica the chance: it stands again only after 3T.
            self.election.stepped_down(self.clock.now())

    def leader_gone(self, leader: int) -> None:
        """Every write connection `leader` had open to this replica closed
        (runtime/leader_links.py)."""
        self.election.leader_gone(self.clock.now(), leader)
        if self.election.gone():
            log.info("replica %d's write connections all closed: it may be gone", leader)

    def listen(self) -> None:
        # A replica that just turned VOTING first listens for the leader.
        self.election.listen(self.clock.now())

    @property
    def live_leader(self) -> str:
        """The leader's address if this replica leads or heard it within an election
        timeout; empty otherwise (a stale leader must not look alive to a pre-vote)."""
        return self.election.live_leader(self.clock.now())

    @property
    def leader_id(self) -> int | None:
        """The leader this replica follows (itself while it leads), if any."""
        return self.election.leader_id

    def since_heard(self) -> float:
        """How long since the leader was last heard (the election timer's last reset)."""
        return self.clock.now() - self.election.last_heard
