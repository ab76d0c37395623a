"""The acceptor and learner with a disk: each request runs through the `ReplicaCore`
(protocol/replica.py), its batch through the `Journal` (group commit), and the reply leaves
only after the batch is durable. `ReplicaDriver` serves the peers' calls (runtime/server.py),
the write lane's writes (runtime/lane.py) and this replica's own messages to itself
(`local`, see runtime/peers.py).

A promise is also an election event (protocol/election.py): a VOTING replica that heard a
live leader refuses other candidates' implicit promises, and one it accepts holds back its
own candidacy. A corrupt record met on the way is reported (`fault_seen`, runtime/repair.py)
and re-raised; with the disk full, nothing is decided that could not be made durable.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TypeVar

from rlog.config import SLOW_SELF_ENV, ReplicaConfig, slow_self
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import Coordinator
from rlog.protocol.election import Election
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.fetch import lane_answers
from rlog.runtime.journal import Journal
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.peers import LocalReplica
from rlog.storage import WriteBatch
from rlog.storage.base import CorruptRecord

log = logging.getLogger("rlog.node")
_M = TypeVar("_M", pb.LearnedRequest, pb.FetchResponse)  # what a learner rule takes


class ReplicaDriver:
    """The acceptor/learner handlers over the core and the journal. `heard_leader` takes a
    leader's heartbeat (a learned message that names it), `learned` is told after each
    batch learned, `changed` after a promise, `fault_seen` of a corrupt record."""

    def __init__(
        self,
        config: ReplicaConfig,
        core: ReplicaCore,
        journal: Journal,
        metrics: ReplicaMetrics,
        coordinator: Coordinator,
        election: Election,
        now: Callable[[], float],
        heard_leader: Callable[[pb.LearnedRequest], None],
        learned: Callable[[], None],
        changed: Callable[[], None],
        fault_seen: Callable[[CorruptRecord], None],
    ) -> None:
        self.config = config
        self.core = core
        self.journal = journal
        self.metrics = metrics
        self.coordinator = coordinator
        self.election = election
        self.now = now  # the election clock's
        self.heard_leader = heard_leader
        self.learned = learned
        self.changed = changed
        self.fault_seen = fault_seen
        self._self_delay = slow_self()
        if self._self_delay:
            log.warning(
                "%s=%g: this replica's messages to itself are delayed (test only)",
                SLOW_SELF_ENV,
                self._self_delay,
            )
            self.local = LocalReplica(
                self.handle_promise, self._slow_write, self._slow_learned, self._slow_fetched
            )
        else:
            self.local = LocalReplica(
                self.handle_promise, self.handle_write, self.handle_learned, self.handle_fetched
            )

    async def handle_promise(self, request: pb.PromiseRequest) -> pb.PromiseResponse:
        if self.journal.full is not None:
            raise self.journal.full  # before the core: decide nothing that cannot be durable
        if not request.positions and self.election.refuses(request.candidate, self.now()):
            self.metrics.rejects.labels("promise").inc()
            return pb.PromiseResponse(
                verdict=pb.REJECT,
                proposal=self.core.promised,
                begin=self.core.begin,
                status=self.core.status,
            )
        try:
            reply = self.core.on_promise(request)
        except CorruptRecord as exc:
            self.fault_seen(exc)
            raise
        assert isinstance(reply.response, pb.PromiseResponse)
        if reply.response.verdict == pb.ACCEPT:
            # Before the persist: our own candidacy must not start while another is under way.
            self.election.on_promise_accepted(self.now(), request.candidate)
        if reply.persist is not None:
            await self.journal.persist(reply.persist)
        if reply.response.verdict == pb.REJECT:
            self.metrics.rejects.labels("promise").inc()
        self.coordinator.observe(request.proposal)
        self.changed()
        return reply.response

    async def handle_write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        response, durable = self.start_write(request)
        if durable is not None:
            await durable
        return response

    # RLOG_TEST_SLOW_SELF (tests only): a write and a learned message to ourselves each
    # handled `_self_delay` after they were sent, so in the order they were sent.
    async def _slow_write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        await asyncio.sleep(self._self_delay)
        return await self.handle_write(request)

    def _slow_learned(self, request: pb.LearnedRequest) -> None:
        asyncio.get_running_loop().call_later(self._self_delay, self.handle_learned, request)

    def _slow_fetched(self, answer: pb.FetchResponse) -> None:
        asyncio.get_running_loop().call_later(self._self_delay, self.handle_fetched, answer)

    def lane_fetch(self, request: pb.FetchRequest) -> list[bytes]:
        """A fetch lane's answer to `request`: the serialized FetchAnswers, in parts
        (runtime/fetch.py); raises CorruptRecord as a Fetch call would."""
        return lane_answers(self.core, request)

    def start_write(
        self, request: pb.WriteRequest
    ) -> tuple[pb.WriteResponse, asyncio.Future[None] | None]:
        """A write's decision, taken now, and the future of its batch's durability (None:
        nothing to store); the response may leave only once that future is done. Raises
        what `handle_write` raises."""
        if request.HasField("learned"):
            self.handle_learned(request.learned)
        if self.journal.full is not None:
            raise self.journal.full
        try:
            reply = self.core.on_write(request)
        except CorruptRecord as exc:
            self.fault_seen(exc)
            raise
        assert isinstance(reply.response, pb.WriteResponse)
        if reply.response.verdict == pb.REJECT:
            self.metrics.rejects.labels("write").inc()
        durable = self.journal.submit(reply.persist) if reply.persist is not None else None
        return reply.response, durable

    def handle_learned(self, request: pb.LearnedRequest) -> None:
        if request.leader_address and request.leader != self.config.id:
            self.heard_leader(request)
        if self.journal.full is not None and (request.runs or request.actions):
            # No room to store values: learn only what is stored already (ranges); the rest
            # is pulled from the leader once space returns, not held in memory meanwhile.
            trimmed = pb.LearnedRequest()
            trimmed.CopyFrom(request)
            del trimmed.runs[:]
            del trimmed.actions[:]
            request = trimmed
        self._learn(self.core.on_learned, request)

    def handle_fetched(self, answer: pb.FetchResponse) -> None:
        """Learn a Fetch answer's records (a catch-up's span, a pull's chunk); the answer is
        given up to the core, which keeps its runs without a copy."""
        if self.journal.full is not None:
            return  # no room to store values: fetched again once space returns
        self._learn(self.core.on_fetched, answer)

    def _learn(self, rule: Callable[[_M], WriteBatch | None], message: _M) -> None:
        """Apply a learner rule of the core to `message` and store what it learned (a
        corrupt record met on the way is reported as a storage fault and re-raised)."""
        try:
            batch = rule(message)
        except CorruptRecord as exc:
            self.fault_seen(exc)
            raise
        if batch is not None:
            self.journal.persist_nowait(batch)
            self.learned()
