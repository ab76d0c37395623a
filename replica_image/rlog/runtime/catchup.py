"""Catch-up: bring a RECOVERING replica's [begin, end] up to date, then let it vote.

Two steps, cheapest first:
1. copy: the learned records of the VOTING replicas that answered the recover round, in
   spans, several in flight over the sources, applied in position order, each span written
   durably as one group with a bound on what waits unwritten (`runtime/learned_copy.py`);
2. fill: positions still unlearned (chosen but learned nowhere yet, or in flight at the
   leader) are settled by Paxos (`FillRound`), batched, each round with a timeout and a retry
   above the highest proposal seen after a random back-off in [T, 2T). A round judges a
   client batch on all its positions (promising those beyond the round, if any), so that
   the batch is chosen all or none, as the leader's fill does. Positions the leader
   is still writing are waited for briefly first, so catch-up does not depose a healthy
   leader for entries it is about to learn anyway.
Then the replica adopts the highest promise of the replicas it recovered from and turns
VOTING in one durable batch. A crash anywhere restarts recovery; what was copied is kept.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import NamedTuple

import grpc

from rlog.config import ReplicaConfig, unsafe_split_fill
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.consensus import BatchKey, Elsewhere, FillRound, Outcome, batch_of
from rlog.protocol.peer_version import PROTOCOL
from rlog.protocol.recover import Decision
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.learned_copy import Durable, LearnedCopy
from rlog.runtime.peers import Peers

log = logging.getLogger("rlog.catchup")

FILL_BATCH = 256
REFETCH_ROUNDS = 5


class CatchupProgress(NamedTuple):
    """How far a catch-up is: its range [begin, end] and the positions of it learned."""

    begin: int
    end: int
    done: int

    @property
    def remaining(self) -> int:
        return max(0, self.end - self.begin + 1 - self.done)


NO_CATCHUP = CatchupProgress(0, 0, 0)  # none under way

Progress = Callable[[CatchupProgress], None]


async def catch_up(
    core: ReplicaCore,
    peers: Peers,
    config: ReplicaConfig,
    decision: Decision,
    progress: Progress,
    durable: Durable | None = None,
) -> None:
    """Learn every position of `decision`'s [begin, end] (copy, then fill), reporting the
    positions done as it goes. Leaves the status alone: the caller turns the replica VOTING.
    `durable` bounds what the copy holds in memory (None: no bound, tests of the rules)."""
    await CatchUp(core, peers, config, decision, progress, durable).run()


class CatchUp:
    def __init__(
        self,
        core: ReplicaCore,
        peers: Peers,
        config: ReplicaConfig,
        decision: Decision,
        progress: Progress,
        durable: Durable | None = None,
    ) -> None:
        self.core = core
        self.peers = peers
        self.config = config
        self.decision = decision
        self.report = progress
        self.highest_seen = decision.promised
        self.copy = LearnedCopy(
            core, peers, decision.end, durable, self._progress, rate=config.catchup_rate
        )

    @property
    def remaining(self) -> int:
        core = self.core
        return sum(1 for _ in core.unlearned(self.decision.begin, self.decision.end))

    def _progress(self) -> None:
        core = self.core
        done = max(0, min(core.learned, self.decision.end) - self.decision.begin + 1)
        if core.learned_next <= self.decision.begin:
            done = 0
        self.report(CatchupProgress(self.decision.begin, self.decision.end, done))

    async def run(self) -> None:
        d = self.decision
        log.info("catching up [%d, %d] from replicas %s", d.begin, d.end, list(d.sources))
        for source in d.sources:
            self.peers.fetch_lane(source)  # opened in the background meanwhile
        try:
            for attempt in range(REFETCH_ROUNDS):
                await self._copy()
                self._progress()
                if self.core.learned >= d.end and not any(
                    True for _ in self.core.unlearned(d.begin, d.end)
                ):
                    break
                if attempt < REFETCH_ROUNDS - 1:
                    await asyncio.sleep(self.config.heartbeat_interval * 2)
        finally:
            self.peers.close_fetch_lanes()
        remaining = self.remaining
        if remaining:
            log.info(
                "copied up to %d; %d positions left to fill by Paxos",
                self.core.learned,
                remaining,
            )
        await self._fill()
        self._progress()

    async def _copy(self) -> None:
        """Copy learned records from the VOTING sources; a source that fails or has nothing
        more learned is dropped for this round, the others go on."""
        await self.copy.run([s for s in self.decision.sources if s != self.config.id])

    async def _fill(self) -> None:
        backoff = self.config.retry_backoff
        while True:
            positions = list(self.core.unlearned(self.decision.begin, self.decision.end))
            if not positions:
                return
            batch = positions[:FILL_BATCH]
            outcome = await self._fill_round(batch)
            self._progress()
            if outcome != Outcome.ACCEPTED:
                await asyncio.sleep(random.uniform(backoff, 2 * backoff))

    async def _fill_round(self, positions: list[int]) -> Outcome:
        config = self.config
        replicas = len(config.peers)
        elsewhere = None if unsafe_split_fill() else self._settled_elsewhere
        proposal = self.highest_seen + 1
        fill = FillRound(positions, proposal, replicas, replicas // 2 + 1, elsewhere)
        # The next round goes above this one: its extension may reach positions this one
        # promised, and a replica refuses a second promise at the same proposal.
        self.highest_seen = max(self.highest_seen, proposal)
        request: pb.PromiseRequest | pb.WriteRequest | None
        request = fill.promise_request(config.id, config.log_id)
        while isinstance(request, pb.PromiseRequest):
            fill.add(config.id, None)  # this replica is not VOTING: it cannot accept
            outcome = await self._round(fill, request)
            if outcome != Outcome.ACCEPTED:
                return outcome
            request = fill.decide(config.id, config.log_id)  # an extension, or the write
        write = request
        if write is not None:
            fill.add(config.id, None)
            outcome = await self._round(fill, write)
            if outcome != Outcome.ACCEPTED:
                return outcome
        learned = pb.LearnedRequest(actions=fill.chosen(), log_id=config.log_id, protocol=PROTOCOL)
        self.peers.broadcast_learned(learned)
        return Outcome.ACCEPTED

    def _settled_elsewhere(self, position: int) -> BatchKey | Elsewhere | None:
        """What a fill round knows of a position outside it (the batch rule)."""
        core = self.core
        if position < core.begin:
            return Elsewhere.TRUNCATED
        record = core.get(position)
        if record is not None and record.learned:
            return Elsewhere.TRUNCATED if record.tombstone else batch_of(record)
        return Elsewhere.UNKNOWN

    async def _round(
        self, fill: FillRound, request: pb.PromiseRequest | pb.WriteRequest
    ) -> Outcome:
        peers = self.peers
        timeout = max(2.0, self.config.election_timeout * 2)

        async def ask(replica: int) -> tuple[int, pb.PromiseResponse | pb.WriteResponse | None]:
            stub = peers[replica].replica
            try:
                if isinstance(request, pb.PromiseRequest):
                    return replica, await stub.Promise(request, timeout=timeout)
                return replica, await stub.Write(request, timeout=timeout)
            except grpc.aio.AioRpcError:
                return replica, None

        outcome = fill.tally.outcome
        for next_reply in asyncio.as_completed([ask(r) for r in peers]):
            replica, response = await next_reply
            if response is not None and response.verdict == pb.REJECT:
                self.highest_seen = max(self.highest_seen, response.proposal)
            outcome = fill.add(replica, response)
            if outcome != Outcome.PENDING:
                break
        return outcome
