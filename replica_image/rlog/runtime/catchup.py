"""Catch-up: bring a RECOVERING replica's [begin, end] up to date, then let it vote.

Two steps, cheapest first:
1. copy: stream learned actions from the VOTING replicas that answered the recover round
   (`Fetch`). A learned action is chosen, so copying it is always safe; a reply whose begin
   is past our position says the prefix was truncated and we skip it in one step;
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

import grpc

from rlog.config import ReplicaConfig, unsafe_split_fill
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.consensus import BatchKey, Elsewhere, FillRound, Outcome, batch_of
from rlog.protocol.recover import Decision
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.peers import Peers

log = logging.getLogger("rlog.catchup")

FETCH_CHUNK = 4096
FILL_BATCH = 256
REFETCH_ROUNDS = 5


Progress = Callable[[int, int, int], None]  # begin, end, positions done


async def catch_up(
    core: ReplicaCore,
    peers: Peers,
    config: ReplicaConfig,
    decision: Decision,
    progress: Progress,
) -> None:
    """Learn every position of `decision`'s [begin, end] (copy, then fill), reporting the
    positions done as it goes. Leaves the status alone: the caller turns the replica VOTING."""
    await CatchUp(core, peers, config, decision, progress).run()


class CatchUp:
    def __init__(
        self,
        core: ReplicaCore,
        peers: Peers,
        config: ReplicaConfig,
        decision: Decision,
        progress: Progress,
    ) -> None:
        self.core = core
        self.peers = peers
        self.config = config
        self.decision = decision
        self.report = progress
        self.highest_seen = decision.promised

    @property
    def remaining(self) -> int:
        core = self.core
        return sum(1 for _ in core.unlearned(self.decision.begin, self.decision.end))

    def _progress(self) -> None:
        core = self.core
        done = max(0, min(core.learned, self.decision.end) - self.decision.begin + 1)
        if core.learned_next <= self.decision.begin:
            done = 0
        self.report(self.decision.begin, self.decision.end, done)

    async def run(self) -> None:
        d = self.decision
        log.info("catching up [%d, %d] from replicas %s", d.begin, d.end, list(d.sources))
        for attempt in range(REFETCH_ROUNDS):
            await self._copy()
            self._progress()
            if self.core.learned >= d.end and not any(
                True for _ in self.core.unlearned(d.begin, d.end)
            ):
                break
            if attempt < REFETCH_ROUNDS - 1:
                await asyncio.sleep(self.config.heartbeat_interval * 2)
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
        """Stream learned actions from the VOTING sources, round-robin on failure."""
        core = self.core
        sources = [s for s in self.decision.sources if s != self.config.id]
        random.shuffle(sources)
        for source in sources:
            peer = self.peers[source]
            while core.learned_next <= self.decision.end:
                start = core.learned_next
                try:
                    progressed = await self.peers.copy_learned(
                        peer, self.decision.end, FETCH_CHUNK, self._progress
                    )
                except grpc.aio.AioRpcError as exc:
                    log.info("fetch from replica %d failed: %s", source, exc.code().name)
                    break
                if not progressed or core.learned_next == start:
                    break  # this source has nothing more learned: try the next one

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
        learned = pb.LearnedRequest(actions=fill.chosen(), log_id=config.log_id)
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
