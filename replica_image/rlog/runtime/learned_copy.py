"""Copying learned records from peers: [learned_next, end] in spans, several in flight, applied
in position order, with a bound on what waits unwritten.

Two callers: catch-up (a RECOVERING replica copies what the VOTING replicas learned before it
fills the rest by Paxos, `runtime/catchup.py`) and the pull (a VOTING replica that missed
learned positions, a follower back from a restart or a partition, or a leader whose own
write of a chosen batch failed, copies them from a peer that has them: `pull`, started by
`runtime/pulls.py`). A learned action is chosen, so copying one is always safe; an answer
whose begin is past our position says the prefix was truncated, and the core skips it in one
step (`ReplicaCore.on_fetched`).
Spans travel on the peers' fetch lanes when the log has lanes, else as Fetch calls
(`Peers.fetch_span`). `rlog replica --catchup-rate` caps the bytes a copy takes per second
(`Pace`), so a replica coming back does not take the peers' disks and network from clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence

import grpc

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.fetch import answer_bytes
from rlog.runtime.peers import FetchFailed, Peers
from rlog.storage.base import DiskFull

log = logging.getLogger("rlog.copy")

# The range is cut into spans, each one fetch; FETCH_WINDOW spans are in flight at once (spread
# over the sources), each sized to about SPAN_BYTES from the bytes per position seen so far
# (SPAN_FIRST positions before any are seen). A span whose answers reach SPAN_CAP (values
# larger than the estimate) is cut there: the copy holds at most FETCH_WINDOW spans of
# SPAN_CAP plus one answer each, whatever the values' sizes.
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

Durable = Callable[[], Awaitable[None]]  # returns once everything learned so far is on disk
AGAIN = -1  # what `Copier.run` returns when a span was cut at SPAN_CAP (replica ids are >= 0)


async def pull(
    core: ReplicaCore,
    peers: Peers,
    sources: Sequence[int],
    target: int,
    durable: Durable,
    rate: int = 0,
) -> None:
    """Copy what this VOTING replica lacks of the learned positions up to `target` from
    `sources` (replica ids), opening their fetch lanes for it and closing them after; at
    most `rate` bytes per second (0: no limit)."""
    sources = [s for s in sources if s in peers]
    for source in sources:
        peers.fetch_lane(source)  # opened in the background; the first spans may go on gRPC
    try:
        copy = LearnedCopy(core, peers, target, durable, purpose="pull", rate=rate)
        await copy.run(sources)
    finally:
        peers.close_fetch_lanes()


class Pace:
    """At most `rate` bytes per second, on average since the first bytes (0: no limit): how
    long to wait after taking `size` more bytes. Spans already in flight arrive meanwhile, so
    the copy can run ahead of the rate by at most its window (FETCH_WINDOW spans)."""

    def __init__(self, rate: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate < 0:
            raise ValueError(f"a copy rate must be 0 (no limit) or positive, not {rate}")
        self.rate = rate
        self.clock = clock
        self.began: float | None = None
        self.taken = 0

    def delay(self, size: int) -> float:
        if not self.rate:
            return 0.0
        now = self.clock()
        if self.began is None:
            self.began = now
        self.taken += size
        return max(0.0, self.began + self.taken / self.rate - now)


class LearnedCopy:
    """The copy of [core.learned_next, end] from `sources` (`run`, once or again), keeping
    the bytes per position seen so far to size its spans, at most `rate` bytes per second
    (0: no limit)."""

    def __init__(
        self,
        core: ReplicaCore,
        peers: Peers,
        end: int,
        durable: Durable | None,
        on_applied: Callable[[], None] = lambda: None,
        purpose: str = "catchup",
        rate: int = 0,
    ) -> None:
        self.core = core
        self.peers = peers
        self.end = end
        self.durable = durable  # None: no bound on what waits unwritten (tests of the rules)
        self.on_applied = on_applied  # after each answer applied (progress reports)
        self.purpose = purpose  # which metric counts the spans: "catchup" or "pull"
        self.copied_positions = 0
        self.copied_bytes = 0
        self.pace = Pace(rate)

    async def run(self, sources: Sequence[int]) -> None:
        """Copy from the sources in rounds of `Copier`; a source that fails or has nothing
        more learned is dropped, the others go on."""
        left = list(sources)
        random.shuffle(left)
        while left and self.core.learned_next <= self.end:
            start = self.core.learned_next
            dropped = await Copier(self, left).run()
            if dropped is None:
                break
            if dropped == AGAIN:
                continue  # a span was cut short by its size: size the spans again
            left.remove(dropped)
            if self.core.learned_next == start and not left:
                break

    def span_positions(self) -> int:
        if not self.copied_positions:
            return SPAN_FIRST
        per_position = max(1, self.copied_bytes // self.copied_positions)
        return max(SPAN_MIN, min(SPAN_MAX, SPAN_BYTES // per_position))

    def apply(self, chunks: list[pb.FetchResponse]) -> int:
        """Learn the answers; their bytes."""
        core = self.core
        applied = 0
        for chunk in chunks:
            before = core.learned_next
            size = answer_bytes(chunk)  # before the answer is given up
            self.peers.learn_fetched(chunk)
            self.copied_positions += max(0, core.learned_next - before)
            self.copied_bytes += size
            applied += size
            self.on_applied()
        return applied


class Copier:
    """One round of the copy: [learned_next, end] cut into spans, one fetch each, up to
    FETCH_WINDOW in flight, spread over the sources in turn, applied strictly in position
    order (each span once those before it are), so the replica learns in order as with one
    call at a time, with the peers' reads, the network and this replica's disk overlapping.
    A span that fails or comes back short (its source has learned nothing further) ends the
    round and names that source; spans fetched after it are dropped, not applied. So does a
    span cut at SPAN_CAP, naming no source (AGAIN): the next round sizes its spans anew."""

    def __init__(self, copy: LearnedCopy, sources: list[int]) -> None:
        self.copy = copy
        self.core = copy.core
        self.end = copy.end
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
                    last = min(self.end, following + self.copy.span_positions() - 1)
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
                size = self.copy.apply(chunks)
                await self._bound_unwritten(barriers)
                if wait := self.copy.pace.delay(size):
                    self.copy.peers.paced(self.copy.purpose, wait)
                    await asyncio.sleep(wait)
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

    async def _fetch(
        self, source: int, first: int, last: int
    ) -> tuple[list[pb.FetchResponse], bool]:
        """The span's answers, and whether they are all there (False: cut at SPAN_CAP)."""
        return await self.copy.peers.fetch_span(
            source, first, last, SPAN_CAP, FETCH_TIMEOUT, self.copy.purpose
        )

    async def _bound_unwritten(self, barriers: deque[asyncio.Task[None]]) -> None:
        """A barrier after each span: the journal writes (one write, one sync) what was
        learned so far at once, and the copy waits while more than UNWRITTEN_GROUPS are."""
        durable = self.copy.durable
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
