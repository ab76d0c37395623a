"""Reads: a client's `Read` and `Tail` as this replica serves them, from its learned APPEND
entries (runtime/read_runs.py cuts them into responses; runtime/shared_chunks.py keeps what
Tail readers read for the readers behind them). A consistent read is served by the leader
once its read index allows (runtime/read_index.py); a follower forwards it there
(runtime/forwarding.py). A stale read is served by any VOTING replica; a `min_position`
makes it wait until this replica has learned that far (runtime/learned_watch.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable

from rlog.client.packing import last_position, runs_of
from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import Coordinator
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.errors import RpcError
from rlog.runtime.forwarding import Forwarding
from rlog.runtime.learned_watch import LearnedWatch
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.read_runs import (
    READ_RESPONSE_BYTES,
    READ_RESPONSE_POSITIONS,
    READ_RESPONSE_RECORDS,
    end_of,
    read_runs,
    response_of,
)
from rlog.runtime.shared_chunks import SharedChunks, chunk_of
from rlog.wire import Reason


class Reads:
    """The replica's reads. `read_index_wait` returns once a linearizable read may be
    served here (the read index); `learned_watch` and `learned_changed` say when the
    replica learned more."""

    def __init__(
        self,
        config: ReplicaConfig,
        core: ReplicaCore,
        coordinator: Coordinator,
        forwarding: Forwarding,
        metrics: ReplicaMetrics,
        read_index_wait: Callable[[], Awaitable[None]],
        learned_watch: LearnedWatch,
        learned_changed: asyncio.Event,
    ) -> None:
        self.config = config
        self.core = core
        self.coordinator = coordinator
        self.forwarding = forwarding
        self.metrics = metrics
        self.read_index_wait = read_index_wait
        self.learned_watch = learned_watch
        self.learned_changed = learned_changed
        # What Tail readers read, kept for the readers behind them (rlog.runtime.shared_chunks).
        self.tail_chunks = SharedChunks()

    async def read(
        self, request: pb.ReadRequest, forwarded: bool, deadline: float | None = None
    ) -> AsyncIterator[pb.ReadResponse]:
        """A Read: a consistent one at the leader (forwarded there by a follower), a stale one
        at any VOTING replica. A `min_position` makes the serving replica wait until it has
        learned it, until `deadline` (time.monotonic(); None: none)."""
        first = getattr(request, "from") if request.HasField("from") else None
        last = request.to if request.HasField("to") else None
        if not request.stale and not self.coordinator.leading and not forwarded:
            leader = await self.forwarding.await_leader(forwarded=False)
            if leader is not None:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                async for response in self.forwarding.read(leader, request, timeout):
                    yield response
                return
            # This replica became the leader meanwhile.
            await self.read_index_wait()
            await self._await_min_position(request, deadline)
            async for runs in self.read_range(first, last, False, max_positions=request.max_batch):
                yield response_of(runs)
            return
        if not request.stale and not self.coordinator.leading:
            raise RpcError(Reason.NOT_LEADER, "this replica is not the leader")
        if not request.stale:
            await self.read_index_wait()
        if request.stale and self.core.status != pb.VOTING:
            raise RpcError(
                Reason.NOT_VOTING,
                f"replica is {pb.Status.Name(self.core.status)}, not VOTING: it cannot serve reads",
            )
        await self._await_min_position(request, deadline)
        async for runs in self.read_range(
            first, last, request.stale, max_positions=request.max_batch
        ):
            yield response_of(runs)

    async def _await_min_position(self, request: pb.ReadRequest, deadline: float | None) -> None:
        """Read-your-writes: wait until this replica has learned the request's min_position
        (woken when its learned end advances), or fail once `deadline` passes."""
        if not request.HasField("min_position"):
            return
        position = request.min_position
        self.learned_watch.advance(self.core.learned)
        if position <= self.core.learned:
            return
        timeout = None if deadline is None else deadline - time.monotonic()
        self.metrics.reads_waiting.inc()
        try:
            reached = await self.learned_watch.wait(position, timeout)
        finally:
            self.metrics.reads_waiting.dec()
        if not reached:
            raise RpcError(
                Reason.NOT_LEARNED,
                f"replica {self.config.id} has learned up to position {self.core.learned}, "
                f"not min_position {position}, by the read's deadline",
                end=self.core.learned,
            )

    async def tail(self, request: pb.TailRequest) -> AsyncIterator[list[pb.Run]]:
        """Every APPEND entry from `from` on, as this replica learns them, for ever. A
        non-stale tail starts linearizably: its first entries cover every append acknowledged
        before it arrived (the leader's read index; a follower has the leader serve them with
        a consistent read, then follows its own learned entries from there)."""
        position = getattr(request, "from")
        if not request.stale:
            leader = None if self.coordinator.leading else await self.forwarding.await_leader(False)
            if leader is None:
                await self.read_index_wait()
            else:
                start = pb.ReadRequest(**{"from": position})
                try:
                    async for response in self.forwarding.read(leader, start):
                        last = last_position(response)
                        if last is not None:
                            yield runs_of(response)
                            position = last + 1
                except RpcError as error:
                    # Past the leader's end: nothing acknowledged there yet; follow from here.
                    if error.reason != Reason.PAST_END:
                        raise
        if position < self.core.begin:
            raise RpcError(
                Reason.TRUNCATED,
                f"position {position} is truncated: the log begins at {self.core.begin}",
                begin=self.core.begin,
            )
        while True:
            learned = self.core.learned
            if position <= learned:
                chunk = self.config.tail_response_bytes
                async for runs in self.read_range(position, learned, True, chunk, self.tail_chunks):
                    yield runs
                position = learned + 1
            await self.wait_learned_past(position)

    async def read_range(
        self,
        first: int | None,
        last: int | None,
        stale: bool,
        chunk_bytes: int = READ_RESPONSE_BYTES,
        shared: SharedChunks | None = None,
        max_positions: int = 0,
    ) -> AsyncIterator[list[pb.Run]]:
        """Validated learned APPEND entries in [first, last] held here, in chunks of runs
        of about `chunk_bytes` (rlog.runtime.read_runs; one larger entry goes whole), taken
        from and kept in `shared` when given (Tail readers share what they read). A chunk
        spans at most `max_positions` positions when that is above 0 (a Read's `max_batch`:
        a stored run is cut for it); a shared chunk is never cut so."""
        positions = READ_RESPONSE_POSITIONS
        if max_positions > 0 and shared is None:
            positions = min(positions, max_positions)
        begin = self.core.begin
        first = begin if first is None else first
        learned_end = self.core.learned
        if last is not None and last > learned_end and not stale:
            learned_end = await self._await_learned(last)
        end = learned_end if last is None else last
        if first < begin:
            raise RpcError(
                Reason.TRUNCATED,
                f"position {first} is truncated: the log begins at {begin}",
                begin=begin,
            )
        if last is not None and last > learned_end:
            raise RpcError(
                Reason.PAST_END,
                f"position {last} is past the end of the log (end {learned_end})",
                end=learned_end,
            )
        if first > end:
            if last is not None:
                raise RpcError(Reason.INVALID_ARGUMENT, f"from {first} is after to {last}")
            if first > learned_end + 1:
                raise RpcError(
                    Reason.PAST_END,
                    f"position {first} is past the end of the log (end {learned_end})",
                    end=learned_end,
                )
            return
        position = first
        while position <= end:
            chunk = shared.get(position, end, chunk_bytes) if shared is not None else None
            if shared is not None:
                self.metrics.tail_chunks.labels("read" if chunk is None else "shared").inc()
            if chunk is None:
                records = self.core.learned_records(
                    position,
                    end,
                    positions,
                    chunk_bytes,
                    READ_RESPONSE_RECORDS,
                )
                if records:
                    chunk = chunk_of(read_runs(records, position, end), end_of(records), end)
                    if shared is not None and position >= self.core.begin:
                        shared.put(position, chunk_bytes, chunk)
            if position < self.core.begin:
                raise RpcError(
                    Reason.TRUNCATED,
                    f"position {position} was truncated during the read "
                    f"(the log begins at {self.core.begin})",
                    begin=self.core.begin,
                )
            if chunk is None:
                raise RpcError(
                    Reason.NOT_LEARNED,
                    f"position {position} is not learned on this replica yet",
                )
            if chunk.runs:
                yield chunk.runs
            position = chunk.last + 1

    async def _await_learned(self, position: int) -> int:
        """Wait briefly for in-flight positions up to `position` to be learned."""
        deadline = time.monotonic() + 1.0
        while self.core.learned < position and time.monotonic() < deadline:
            if not self.coordinator.leading or position >= self.coordinator.next_position:
                break
            self.learned_changed.clear()
            try:
                await asyncio.wait_for(self.learned_changed.wait(), 0.05)
            except TimeoutError:
                pass
        return self.core.learned

    async def wait_learned_past(self, position: int) -> None:
        while self.core.learned < position:
            self.learned_changed.clear()
            try:
                await asyncio.wait_for(self.learned_changed.wait(), 0.5)
            except TimeoutError:
                pass
