"""Budgets: how many bytes of clients' appends a replica holds at once (docs/security.md,
"Budgets").

Without them one client could run a leader out of memory: it sends appends faster than the
followers take them, and every append it sends is read, parsed and queued. The contract:

- An append's bytes (its packed values, data and offsets, or on the lane its frame; plus
  `ANSWER_COST` for its answer and its task) are *in flight* from when the replica reads
  its request until its answer is handed to the connection: the request's part is
  released when the append has its answer (its values are not held after that), the
  answer's part when the answer is handed to the connection (a gRPC stream's `yield`
  returns, a lane's transport takes it).
- Per stream (`--max-stream-inflight-bytes`): an `AppendStream` or append-lane connection
  whose next append would take its bytes in flight over its budget is not read until
  that append fits (backpressure: the client's sends wait in HTTP/2's or TCP's flow
  control; nothing is refused). An append larger than the budget goes alone.
- An append-lane frame's bytes are taken from the budgets as soon as its length is read,
  before the connection's buffer grows to hold it (its bytes are *announced*); announced
  bytes may hold at most half of the replica's budget (so callers that announce appends
  and never send them cannot take it all), and must arrive within --lane-frame-timeout.
- Per replica (`--max-inflight-bytes`): every append of every stream, lane and unary call
  takes its bytes from the replica's budget before the replica works on it (proposes or
  forwards it), first come first served. A stream whose next append does not fit is not
  read meanwhile (backpressure again). A unary `Append` has been read already, so there
  is nothing to hold back: it waits its turn, at most until shortly before its deadline
  (or `--append-timeout`), then is refused RESOURCE_EXHAUSTED (reason LIMIT_EXCEEDED):
  nothing was appended, and a retry later is safe. An append larger than the whole
  budget goes alone.

So a replica holds at most its budget of admitted appends, plus, per connection, what
one read brings (on gRPC the one request it read and holds back, at most
`--max-message-size`), and the connections are capped too (`--max-lane-connections`,
`--max-concurrent-streams`, `--max-concurrent-rpcs`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable

from rlog.runtime.errors import RpcError
from rlog.runtime.metrics import ReplicaMetrics
from rlog.wire import Reason

# What an append costs besides its request's bytes: its task, its answer, the objects
# around them (measured: a few hundred bytes). Charged so that a flood of tiny appends
# whose answers are never read is bounded too.
ANSWER_COST = 512


class ByteBudget:
    """A number of bytes handed out first come first served: `take` waits while what is
    asked would go over `limit` (or while earlier callers wait); `release` gives back."""

    def __init__(self, limit: int, on_change: Callable[[int], None] | None = None) -> None:
        self.limit = limit
        self.in_flight = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()
        # Called with `in_flight` on every change (None: nobody is told; the replica's gauge
        # reads `in_flight` at scrape time instead, nothing per append).
        self._on_change = on_change

    @property
    def waiting(self) -> int:
        """How many wait for room."""
        return len(self._waiters)

    def _fits(self, n: int) -> bool:
        # an append larger than the whole budget goes alone
        return self.in_flight + n <= self.limit or self.in_flight == 0

    def try_take(self, n: int) -> bool:
        """Take `n` bytes now if they fit and nobody waits before; whether taken."""
        # (`_fits` inlined: this runs for every append)
        if self._waiters or (self.in_flight + n > self.limit and self.in_flight):
            return False
        self.in_flight += n
        if self._on_change is not None:
            self._on_change(self.in_flight)
        return True

    async def take(self, n: int) -> None:
        """Take `n` bytes, waiting for them (in arrival order). Cancelled, it takes none."""
        if self.try_take(n):
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, future)
        self._waiters.append(entry)
        try:
            await future
        except BaseException:
            if future.done() and not future.cancelled():
                self.release(n)  # granted as it was cancelled: give it back
            else:
                with contextlib.suppress(ValueError):  # `_wake` may have dropped it
                    self._waiters.remove(entry)
                self._wake()
            raise

    def release(self, n: int) -> None:
        self.in_flight -= n
        if self._on_change is not None:
            self._on_change(self.in_flight)
        if self._waiters:
            self._wake()

    def _wake(self) -> None:
        while self._waiters:
            n, future = self._waiters[0]
            if future.done():  # cancelled: its `take` removes it
                self._waiters.popleft()
                continue
            if not self._fits(n):
                return
            self._waiters.popleft()
            self.in_flight += n
            if self._on_change is not None:
                self._on_change(self.in_flight)
            future.set_result(None)


class Ticket:
    """One append's bytes held in its stream's budget and the replica's (and, until its
    bytes arrived, in the replica's budget of announced bytes)."""

    def __init__(
        self, budgets: tuple[ByteBudget, ...], size: int, announced: ByteBudget | None = None
    ) -> None:
        self._budgets = budgets
        self._request = size
        self._answer = ANSWER_COST
        self._announced = announced
        self._announced_bytes = size + ANSWER_COST

    @property
    def size(self) -> int:
        return self._request + self._answer

    def arrived(self) -> None:
        """The append's bytes, announced by its length, are all here."""
        if self._announced is not None:
            self._announced.release(self._announced_bytes)
            self._announced = None

    def answered(self) -> None:
        """The append has its answer: its request's bytes are no longer held."""
        if self._announced is not None:
            self.arrived()
        self._give(self._request)
        self._request = 0

    def sent(self) -> None:
        """The answer was handed to the connection (or dropped): nothing is held any more."""
        if self._announced is not None:
            self.arrived()
        self._give(self._request + self._answer)
        self._request = self._answer = 0

    def _give(self, n: int) -> None:
        if n:
            for budget in self._budgets:
                budget.release(n)


class StreamBudget:
    """The budget of one stream (an AppendStream, an append-lane connection), drawing on the
    replica's too. `admit` waits until the append fits both (the caller reads nothing more
    meanwhile); `try_admit` admits now or not at all. An append admitted on its length alone
    (`announced`: its bytes still to come) also draws on the replica's budget of announced
    bytes, half of its budget: callers that announce appends and never send them hold at
    most that half (until --lane-frame-timeout closes them), the other half stays for
    appends that are here."""

    def __init__(self, replica: ReplicaBudget, limit: int) -> None:
        self.replica = replica
        self.own = ByteBudget(limit)

    def _order(self, announced: bool) -> list[tuple[str, ByteBudget]]:
        order = [("stream", self.own), ("replica", self.replica.budget)]
        return [("announced", self.replica.announced), *order] if announced else order

    def _ticket(self, size: int, announced: bool) -> Ticket:
        return Ticket(
            (self.own, self.replica.budget),
            size,
            self.replica.announced if announced else None,
        )

    def try_admit(self, size: int, announced: bool = False) -> Ticket | None:
        total = size + ANSWER_COST
        taken: list[ByteBudget] = []
        for _, budget in self._order(announced):
            if not budget.try_take(total):
                for held in taken:
                    held.release(total)
                return None
            taken.append(budget)
        return self._ticket(size, announced)

    async def admit(self, size: int, announced: bool = False) -> Ticket:
        total = size + ANSWER_COST
        if not announced:  # the usual case, without lists: both budgets have room now
            if self.own.try_take(total):
                if self.replica.budget.try_take(total):
                    return Ticket((self.own, self.replica.budget), size)
                self.own.release(total)
        taken: list[ByteBudget] = []
        try:
            for name, budget in self._order(announced):
                if not budget.try_take(total):
                    self.replica.waited(name)
                    await budget.take(total)
                taken.append(budget)
        except BaseException:
            for held in taken:
                held.release(total)
            raise
        return self._ticket(size, announced)


class ReplicaBudget:
    """The replica's budget of bytes in flight, and its streams' (`stream`)."""

    def __init__(
        self,
        replica_id: int,
        limit: int,
        stream_limit: int,
        on_wait: Callable[[str], None] = lambda _: None,
        on_refusal: Callable[[], None] = lambda: None,
    ) -> None:
        self.replica_id = replica_id
        self.budget = ByteBudget(limit)  # its gauge reads `in_flight` at scrape time
        self.announced = ByteBudget(limit // 2)  # appends admitted before their bytes came
        self.stream_limit = stream_limit
        self.waited = on_wait
        self._on_refusal = on_refusal

    def stream(self) -> StreamBudget:
        return StreamBudget(self, self.stream_limit)

    async def admit_unary(self, size: int, wait_until: float) -> Ticket:
        """Admit a unary call's append, waiting at most until `wait_until` (time.monotonic());
        past it, RESOURCE_EXHAUSTED (LIMIT_EXCEEDED): nothing was appended."""
        total = size + ANSWER_COST
        if not self.budget.try_take(total):
            self.waited("replica")
            try:
                await asyncio.wait_for(
                    self.budget.take(total), max(0.0, wait_until - time.monotonic())
                )
            except TimeoutError:
                self._on_refusal()
                raise RpcError(
                    Reason.LIMIT_EXCEEDED,
                    f"replica {self.replica_id} holds {self.budget.in_flight} bytes of appends "
                    f"in flight, its budget is {self.budget.limit} (--max-inflight-bytes): "
                    "nothing was appended, retry later",
                ) from None
        return Ticket((self.budget,), size)


def metered_budget(
    replica_id: int, limit: int, stream_limit: int, metrics: ReplicaMetrics
) -> ReplicaBudget:
    """The replica's budget with its metrics wired: the waits and refusals counted, the
    bytes in flight read by their gauge when scraped (not set on every append)."""
    budget = ReplicaBudget(
        replica_id,
        limit,
        stream_limit,
        lambda name: metrics.append_budget_waits.labels(name).inc(),
        metrics.append_budget_refusals.inc,
    )
    in_flight = budget.budget
    metrics.append_inflight_bytes.set_function(lambda: float(in_flight.in_flight))
    return budget
