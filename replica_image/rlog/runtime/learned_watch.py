"""Waiting for this replica's learned prefix to reach a position, woken by its advance.

A read with a `min_position` (read-your-writes on a stale read) waits here until the
replica has learned that position. Each waiter is a future in a heap ordered by position;
`advance(learned)` (the node calls it whenever its learned end may have moved) resolves
exactly the waiters it satisfies: no polling, no wake-ups of waiters still short.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class LearnedWatch:
    def __init__(self) -> None:
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self.learned = 0  # the learned end last seen by `advance`

    @property
    def waiting(self) -> int:
        """How many waits are under way."""
        return sum(1 for _, _, future in self._heap if not future.done())

    def advance(self, learned: int) -> None:
        """The replica has learned up to `learned`: release every wait at or below it."""
        self.learned = max(self.learned, learned)
        heap = self._heap
        while heap and heap[0][0] <= self.learned:
            _, _, future = heapq.heappop(heap)
            if not future.done():
                future.set_result(None)

    async def wait(self, position: int, time_limit: float | None) -> bool:
        """Wait until the learned end reaches `position`, at most `time_limit` seconds (None:
        no bound); whether it did."""
        if position <= self.learned:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (position, next(self._order), future))
        try:
            if time_limit is None:
                await future
            else:
                await asyncio.wait_for(future, max(0.0, time_limit))
        except TimeoutError:
            return False
        finally:
            future.cancel()  # a timed-out or cancelled wait leaves a done future in the heap
            self._prune()
        return True

    def _prune(self) -> None:
        """Drop finished waits from the heap (cheap: only when they pile up)."""
        if len(self._heap) > 64 and self.waiting * 2 < len(self._heap):
            self._heap = [item for item in self._heap if not item[2].done()]
            heapq.heapify(self._heap)
