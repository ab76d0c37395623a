"""Catch-up: bring a RECOVERING replica's [begin, end] up to date, then let it vote.

Two steps, cheapest first:
1. copy: stream learned actions from the VOTING replicas that answered the recover round
   (`Fetch`). A learned action is chosen, so copying it is always safe; a reply whose begin
   is past our position says the prefix was truncated and we skip it in one step. Several
   calls are in flight over the sources, applied in position order, each span written
   durably as one group with a bound on what waits unwritten (`Copier`);
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
import contextlib
import logging
import random
from collections import deque
from collections.abc import Awaitable, Callable

import grpc

from rlog.config import ReplicaConfig, unsafe_split_fill
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.consensus import BatchKey, Elsewhere, FillRound, Outcome, batch_of
from rlog.protocol.recover import Decision
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.fetch import answer_bytes
from rlog.runtime.peers import FetchFailed, Peers
from rlog.storage.base import DiskFull

log = logging.getLogger("rlog.catchup")

FILL_BATCH = 256
REFETCH_ROUNDS = 5
# Copy: the range is cut into spans, each one Fetch call; FETCH_WINDOW calls are in flight at
# once (spread over the sources), each span sized to about SPAN_BYTES from the bytes per
# position seen so far (SPAN_FIRST positions before any are seen). A call whose answers
# reach SPAN_CAP (values larger than the estimate) is cut there: the copy holds at most
# FETCH_WINDOW spans of SPAN_CAP plus one answer each, whatever the values' sizes.
FETCH_WINDOW = 4
SPAN_BYTES = 8 * 1024 * 1024
SPAN_CAP = 2 * SPAN_BYTES
SPAN_FIRST = 1024
SPAN_MIN, SPAN_MAX = 1, 1 << 20
# Spans applied but not yet durable: at most this many durability barriers outstanding (the
# journal writes one group while the next gathers), so a disk slower than the network makes
# the copy wait instead of holding the log in memory.
UNWRITTEN_GROUPS = 2
FETCH_TIMEOUT = 60.0  # seconds for one span


Progress = Callable[[int, int, int], None]  # begin, end, positions done
Durable = Callable[[], Awaitable[None]]  # returns once everything learned so far is on disk


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
        self.durable = durable
        self.highest_seen = decision.promised
        self.copied_positions = 0
        self.copied_bytes = 0

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
        """Copy learned records from the VOTING sources (`Copier`); a source that fails or
        has nothing more learned is dropped for this round, the others go on."""
        sources = [s for s in self.decision.sources if s != self.config.id]
        random.shuffle(sources)
        while sources and self.core.learned_next <= self.decision.end:
            start = self.core.learned_next
            dropped = await Copier(self, sources).run()
            if dropped is None:
                break
            if dropped == AGAIN:
                continue  # a span was cut short by its size: size the spans again
            sources.remove(dropped)
            if self.core.learned_next == start and not sources:
                break

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


AGAIN = -1  # what `Copier.run` returns when a span was cut at SPAN_CAP (replica ids are >= 0)


class Copier:
    """One round of the copy: [learned_next, end] cut into spans, one Fetch call each, up to
    FETCH_WINDOW in flight, spread over the sources in turn, applied strictly in position
    order (each span once those before it are), so the replica learns in order as with one
    call at a time, with the peers' reads, the network and this replica's disk overlapping.
    A span that fails or comes back short (its source has learned nothing further) ends the
    round and names that source; spans fetched after it are dropped, not applied. So does a
    span cut at SPAN_CAP, naming no source (AGAIN): the next round sizes its spans anew."""

    def __init__(self, catch_up: CatchUp, sources: list[int]) -> None:
        self.catch_up = catch_up
        self.core = catch_up.core
        self.peers = catch_up.peers
        self.end = catch_up.decision.end
        self.sources = list(sources)
        self._turn = 0

    async def run(self) -> int | None:
        """Copy until done (None), until a source fails or runs short (that source), or until
        a span was cut at SPAN_CAP (AGAIN)."""
        core = self.core
        spans: deque[tuple[int, int, asyncio.Task[tuple[list[pb.FetchResponse], bool]]]]
        spans = deque()
        barriers: deque[asyncio.Task[None]] = deque()
        following = core.learned_next
        try:
            while True:
                while len(spans) < FETCH_WINDOW and following <= self.end:
                    source = self.sources[self._turn % len(self.sources)]
                    self._turn += 1
                    last = min(self.end, following + self._span_positions() - 1)
                    task = asyncio.create_task(self._fetch(source, following, last))
                    spans.append((source, last, task))
                    following = last + 1
                if not spans:
                    return None
                source, last, task = spans.popleft()
                try:
                    chunks, whole = await task
                except grpc.aio.AioRpcError as exc:
                    log.info("fetch from replica %d failed: %s", source, exc.code().name)
                    return source
                except FetchFailed as exc:
                    log.info("fetch from replica %d failed: %s", source, exc)
                    return source
                before = core.learned_next
                self._apply(chunks)
                await self._bound_unwritten(barriers)
                if core.learned_next <= min(last, self.end):
                    if not whole and core.learned_next > before:
                        log.info(
                            "a span reached %d bytes at %d: sizing spans again", SPAN_CAP, before
                        )
                        return AGAIN
                    return source  # nothing learned there past learned_next: try the others
        finally:
            for *_, task in spans:
                task.cancel()
            await self._settle(barriers)

    def _span_positions(self) -> int:
        catch_up = self.catch_up
        if not catch_up.copied_positions:
            return SPAN_FIRST
        per_position = max(1, catch_up.copied_bytes // catch_up.copied_positions)
        return max(SPAN_MIN, min(SPAN_MAX, SPAN_BYTES // per_position))

    async def _fetch(
        self, source: int, first: int, last: int
    ) -> tuple[list[pb.FetchResponse], bool]:
        """The span's answers, and whether they are all there (False: cut at SPAN_CAP)."""
        return await self.peers.fetch_span(source, first, last, SPAN_CAP, FETCH_TIMEOUT)

    def _apply(self, chunks: list[pb.FetchResponse]) -> None:
        catch_up, core = self.catch_up, self.core
        for chunk in chunks:
            before = core.learned_next
            self.peers.learn_fetched(chunk)
            catch_up.copied_positions += max(0, core.learned_next - before)
            catch_up.copied_bytes += answer_bytes(chunk)
            catch_up._progress()

    async def _bound_unwritten(self, barriers: deque[asyncio.Task[None]]) -> None:
        """A barrier after each span: the journal writes (one write, one sync) what was
        learned so far at once, and the copy waits while more than UNWRITTEN_GROUPS are."""
        durable = self.catch_up.durable
        if durable is None:
            return
        barriers.append(asyncio.create_task(_barrier(durable)))
        while len(barriers) > UNWRITTEN_GROUPS:
            await barriers.popleft()

    @staticmethod
    async def _settle(barriers: deque[asyncio.Task[None]]) -> None:
        """Let the outstanding barriers finish (the turn to VOTING persists after them
        anyway)."""
        for barrier in barriers:
            await barrier


async def _barrier(durable: Durable) -> None:
    # A full disk: the node already learns only what is stored (nothing copied is held in
    # memory meanwhile), so the copy makes no progress and ends; the journal reports it.
    with contextlib.suppress(DiskFull):
        await durable()
