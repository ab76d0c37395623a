"""Catch-up: bring a RECOVERING replica's [begin, end] up to date, then let it vote.

Two steps, cheapest first:
1. copy: stream learned actions from the VOTING replicas that answered the recover round
   (`Fetch`). A learned action is chosen, so copying it is always safe; a reply whose begin
   is past our position says the prefix was truncated and we skip it in one step;
2. fill: positions still unlearned (chosen but learned nowhere yet, or in flight at the
   leader) are settled by Paxos (`FillRound`), batched, each round with a timeout and a retry
   above the highest proposal seen after a random back-off in [T, 2T). Positions the leader
   is still writing are waited for briefly first, so catch-up does not depose a healthy
   leader for entries it is about to learn anyway.
Then the replica adopts the highest promise of the replicas it recovered from and turns
VOTING in one durable batch. A crash anywhere restarts recovery; what was copied is kept.
"""

from __future__ import annotations

import asyncio
import logging
import random
from typing import TYPE_CHECKING

import grpc

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.consensus import FillRound, Outcome
from rlog.protocol.recover import Decision

if TYPE_CHECKING:
    from rlog.runtime.node import Node

log = logging.getLogger("rlog.catchup")

FETCH_CHUNK = 4096
FILL_BATCH = 256
REFETCH_ROUNDS = 5


class CatchUpFailed(Exception):
    pass


class CatchUp:
    def __init__(self, node: Node, decision: Decision) -> None:
        self.node = node
        self.decision = decision
        self.highest_seen = decision.promised
        self.total = 0

    @property
    def remaining(self) -> int:
        core = self.node.core
        return sum(1 for _ in core.unlearned(self.decision.begin, self.decision.end))

    def _progress(self) -> None:
        core = self.node.core
        done = max(0, min(core.learned, self.decision.end) - self.decision.begin + 1)
        if core.learned_next <= self.decision.begin:
            done = 0
        self.node.catchup = (self.decision.begin, self.decision.end, done)
        self.node.metrics.catchup_remaining.set(max(0, self.total - done))

    async def run(self) -> None:
        d = self.decision
        self.total = d.end - d.begin + 1
        log.info("catching up [%d, %d] from replicas %s", d.begin, d.end, list(d.sources))
        for attempt in range(REFETCH_ROUNDS):
            await self._copy()
            self._progress()
            if self.node.core.learned >= d.end and not any(
                True for _ in self.node.core.unlearned(d.begin, d.end)
            ):
                break
            if attempt < REFETCH_ROUNDS - 1:
                await asyncio.sleep(self.node.config.heartbeat_interval * 2)
        remaining = self.remaining
        if remaining:
            log.info(
                "copied up to %d; %d positions left to fill by Paxos",
                self.node.core.learned,
                remaining,
            )
        await self._fill()
        self._progress()

    async def _copy(self) -> None:
        """Stream learned actions from the VOTING sources, round-robin on failure."""
        node = self.node
        sources = [s for s in self.decision.sources if s != node.config.id]
        random.shuffle(sources)
        for source in sources:
            peer = node.peers[source]
            while node.core.learned_next <= self.decision.end:
                start = node.core.learned_next
                try:
                    progressed = await node.peers.copy_learned(
                        peer, self.decision.end, FETCH_CHUNK, self._progress
                    )
                except grpc.aio.AioRpcError as exc:
                    log.info("fetch from replica %d failed: %s", source, exc.code().name)
                    break
                if not progressed or node.core.learned_next == start:
                    break  # this source has nothing more learned: try the next one

    async def _fill(self) -> None:
        node = self.node
        backoff = node.config.retry_backoff
        while True:
            positions = list(node.core.unlearned(self.decision.begin, self.decision.end))
            if not positions:
                return
            batch = positions[:FILL_BATCH]
            outcome = await self._fill_round(batch)
            self._progress()
            if outcome != Outcome.ACCEPTED:
                await asyncio.sleep(random.uniform(backoff, 2 * backoff))

    async def _fill_round(self, positions: list[int]) -> Outcome:
        node = self.node
        replicas = len(node.config.peers)
        fill = FillRound(positions, self.highest_seen + 1, replicas, replicas // 2 + 1)
        fill.add(node.config.id, None)  # this replica is not VOTING: it cannot accept
        request = fill.promise_request(node.config.id, node.config.log_id)
        outcome = await self._round(fill, request)
        if outcome != Outcome.ACCEPTED:
            return outcome
        write = fill.decide(node.config.id, node.config.log_id)
        if write is not None:
            fill.add(node.config.id, None)
            outcome = await self._round(fill, write)
            if outcome != Outcome.ACCEPTED:
                return outcome
        learned = pb.LearnedRequest(actions=fill.chosen(), log_id=node.config.log_id)
        node.handle_learned(learned)
        for peer in node.peers.values():
            node.spawn(node.peers.send_one_way(peer, learned))
        return Outcome.ACCEPTED

    async def _round(
        self, fill: FillRound, request: pb.PromiseRequest | pb.WriteRequest
    ) -> Outcome:
        node = self.node
        timeout = max(2.0, node.config.election_timeout * 2)

        async def ask(replica: int) -> tuple[int, pb.PromiseResponse | pb.WriteResponse | None]:
            stub = node.peers[replica].replica
            try:
                if isinstance(request, pb.PromiseRequest):
                    return replica, await stub.Promise(request, timeout=timeout)
                return replica, await stub.Write(request, timeout=timeout)
            except grpc.aio.AioRpcError:
                return replica, None

        outcome = fill.tally.outcome
        for next_reply in asyncio.as_completed([ask(r) for r in node.peers]):
            replica, response = await next_reply
            if response is not None and response.verdict == pb.REJECT:
                self.highest_seen = max(self.highest_seen, response.proposal)
            outcome = fill.add(replica, response)
            if outcome != Outcome.PENDING:
                break
        return outcome
