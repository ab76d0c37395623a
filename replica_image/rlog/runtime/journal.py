"""Group commit: every batch the replica must persist goes through one writer.

Batches queued while a disk write is under way are merged into the next one, so many
concurrent writes, promises and learned messages cost one fsync. A caller that must not reply
before its batch is durable awaits `persist`; learned state (re-derivable) uses
`persist_nowait`. Storage calls run in one dedicated thread so the event loop never blocks on
the disk; a durable batch is handed to that thread at the end of the loop turn that queued
it (with every batch queued in the same turn), and the thread hands the result back with
one call on the loop that answers the waiters (no journal task wakes in between:
docs/performance.md, "What each change bought").

Storage faults (docs/faults.md):
- a full disk (`DiskFull`): the batches stay queued and are written again every
  `DISK_FULL_RETRY` seconds until space returns; meanwhile every caller of `persist` is
  answered the `DiskFull` at once (its reply is not sent: nothing is acknowledged that is not
  durable), and `full` says why the replica cannot write;
- a corrupt stored record met while planning a batch (`CorruptRecord`): `on_corrupt` returns
  the batch that repairs the replica (the record dropped, the replica RECOVERING), which is
  merged into the group, and the group is written again;
- a failing disk (a write or sync failed with an OS error: EIO, EROFS...): as a full disk,
  the batches stay queued and are written again every `DISK_FAILING_RETRY` seconds (the
  probe) until the disk takes them; every caller is answered the error at once, `failing`
  says why and `on_failing_changed` tells the replica, which leaves the quorum until the
  disk works again (rlog/runtime/repair.py);
- any other failure fails every waiter and every later batch (a bug, not the disk).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from rlog.packed import run_count
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.metrics import ReplicaMetrics
from rlog.storage import Storage, WriteBatch
from rlog.storage.base import CorruptRecord, DiskFull

DISK_FULL_RETRY = 1.0  # seconds between writes tried on a full disk
DISK_FAILING_RETRY = 1.0  # seconds between writes tried on a failing disk


def disk_failure(error: BaseException) -> bool:
    """Whether a write failed for the disk's sake (an OS error, raised as is or as the
    cause of the engine's StorageError), so that it may work again later."""
    return isinstance(error, OSError) or isinstance(error.__cause__, OSError)


class Journal:
    def __init__(
        self,
        storage: Storage,
        core: ReplicaCore,
        metrics: ReplicaMetrics,
        lazy_delay: float = 0.05,
    ) -> None:
        self.lazy_delay = lazy_delay
        self._lazy_timer: asyncio.TimerHandle | None = None
        self.storage = storage
        self.core = core
        self.metrics = metrics
        self._pending: list[tuple[WriteBatch, asyncio.Future[None] | None]] = []
        # Whether the pending batches are to be written as soon as the disk is free (a
        # durable waiter, the lazy timer or a retry asked); else they wait for one of those.
        self._due = False
        self._writing = False  # a group is in the storage thread
        self._kick_soon = False  # a _kick is scheduled for the end of this loop turn
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="rlog-storage")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._failure: BaseException | None = None
        self.full: DiskFull | None = None  # set while the disk has no space for our batches
        self.failing: BaseException | None = None  # set while writes fail (EIO, EROFS...)
        self._retry_timer: asyncio.TimerHandle | None = None
        # A corrupt record met while planning: the batch that repairs it (rlog.runtime.repair).
        self.on_corrupt: Callable[[CorruptRecord], WriteBatch] | None = None
        self.on_full_changed: Callable[[], None] | None = None
        self.on_failing_changed: Callable[[], None] | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._kick()

    async def persist(self, batch: WriteBatch) -> None:
        """Return once `batch` is durable."""
        await self.submit(batch)

    async def durable(self) -> None:
        """Return once every batch queued so far is durable (an empty batch written after
        them: a copy's bound on what waits unwritten)."""
        await self.submit(WriteBatch())

    def submit(self, batch: WriteBatch) -> asyncio.Future[None]:
        """Queue `batch` to be written now; the future is done once it is durable. Raises
        at once if the disk is full or broken (a full disk keeps the batch for later)."""
        if self._failure is not None:
            raise self._failure
        if self.full is not None or self.failing is not None:
            # Kept and written once the disk takes writes; the caller is told now (nothing
            # acknowledged).
            self._pending.append((batch, None))
            raise self.full if self.full is not None else self.failing  # type: ignore[misc]
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending.append((batch, future))
        self._due = True
        if not self._kick_soon:
            # At the end of this loop turn, not now: batches queued in the same turn (writes
            # that arrived together) share the write and its sync.
            self._kick_soon = True
            loop.call_soon(self._kick)
        return future

    def persist_nowait(self, batch: WriteBatch) -> None:
        self._pending.append((batch, None))
        if self._lazy_timer is None:
            self._lazy_timer = asyncio.get_running_loop().call_later(
                self.lazy_delay, self._lazy_flush
            )

    def _lazy_flush(self) -> None:
        self._lazy_timer = None
        if self._pending and self.full is None and self.failing is None:  # retried on a timer
            self._due = True
            self._kick()

    def _kick(self) -> None:
        """Hand the pending batches, merged, to the storage thread if it is free and they
        are due. Called on the event loop by whoever made them due (a durable batch: at the
        end of its loop turn), with no task woken in between: each hop through the loop is
        a share of a serial append's time."""
        self._kick_soon = False
        if self._writing or not self._due or self._loop is None or self._closed:
            return
        self._due = False
        if not self._pending:
            return
        group, self._pending = self._pending, []
        merged = WriteBatch(sync=False)
        for batch, _ in group:
            merged.merge(batch)
        self._writing = True
        self._submit(group, merged, time.perf_counter(), set())

    def _submit(
        self,
        group: list[tuple[WriteBatch, asyncio.Future[None] | None]],
        merged: WriteBatch,
        started: float,
        dropped: set[int],
    ) -> None:
        loop = self._loop
        assert loop is not None
        apply = self.storage.apply  # looked up per write (tests slow the disk down by it)

        def write() -> None:
            try:
                apply(merged)
            except BaseException as exc:
                loop.call_soon_threadsafe(self._written, group, merged, started, dropped, exc)
            else:
                loop.call_soon_threadsafe(self._written, group, merged, started, dropped, None)

        self._executor.submit(write)

    def _written(
        self,
        group: list[tuple[WriteBatch, asyncio.Future[None] | None]],
        merged: WriteBatch,
        started: float,
        dropped: set[int],
        error: BaseException | None,
    ) -> None:
        """Back on the loop from the storage thread: answer the group's waiters, then write
        whatever became due meanwhile."""
        if isinstance(error, CorruptRecord) and self._repair(error, merged, dropped):
            # The group again, with the repair of the corrupt record in its way (at most once
            # per record: a record still corrupt after its drop is a broken disk).
            self._submit(group, merged, started, dropped)
            return
        self._writing = False
        if isinstance(error, DiskFull):
            self._on_full(error, group)
        elif error is not None and disk_failure(error):
            self._on_failing(error, group)
        elif error is not None:  # a failing disk: fail every waiter, keep failing
            self._failure = error
            for _, future in group:
                if future is not None and not future.done():
                    future.set_exception(error)
        else:
            if self.full is not None:
                self.full = None
                if self.on_full_changed is not None:
                    self.on_full_changed()
            if self.failing is not None:
                self.failing = None
                if self.on_failing_changed is not None:
                    self.on_failing_changed()
            self.metrics.observe_flush(time.perf_counter() - started, _positions(merged))
            for batch, future in group:
                self.core.persisted(batch)
                if future is not None and not future.done():
                    future.set_result(None)
        self._kick()

    def _repair(self, exc: CorruptRecord, merged: WriteBatch, dropped: set[int]) -> bool:
        """Merge the batch that repairs a corrupt record into the group; False if it
        cannot be repaired (no repairer, or this record was dropped once already)."""
        if self.on_corrupt is None or exc.key in dropped:
            return False
        dropped.add(exc.key)
        repair = self.on_corrupt(exc)
        merged.merge(repair)
        if repair.metadata is not None:
            self._restamp(repair.metadata)
        return True

    def _restamp(self, repaired: pb.Metadata) -> None:
        """Batches queued behind the repair were made before it: their metadata copies must
        not write the replica back to VOTING, nor its learned mark back up."""
        for batch, _ in self._pending:
            if batch.metadata is not None:
                batch.metadata.status = repaired.status
                batch.metadata.learned_below = min(
                    batch.metadata.learned_below, repaired.learned_below
                )

    def _on_full(
        self, exc: DiskFull, group: list[tuple[WriteBatch, asyncio.Future[None] | None]]
    ) -> None:
        """Keep the group for later (first, in order) and answer its waiters now."""
        was_full = self.full is not None
        self.full = exc
        for _, future in group:
            if future is not None and not future.done():
                future.set_exception(exc)
        self._pending = [(batch, None) for batch, _ in group] + self._pending
        if not was_full and self.on_full_changed is not None:
            self.on_full_changed()
        if self._retry_timer is None:
            self._retry_timer = asyncio.get_running_loop().call_later(DISK_FULL_RETRY, self._retry)

    def _on_failing(
        self, exc: BaseException, group: list[tuple[WriteBatch, asyncio.Future[None] | None]]
    ) -> None:
        """As `_on_full`: keep the group for later (first, in order), answer its waiters now;
        write it again every DISK_FAILING_RETRY seconds."""
        was_failing = self.failing is not None
        self.failing = exc
        for _, future in group:
            if future is not None and not future.done():
                future.set_exception(exc)
        self._pending = [(batch, None) for batch, _ in group] + self._pending
        if not was_failing and self.on_failing_changed is not None:
            self.on_failing_changed()
        if self._retry_timer is None:
            self._retry_timer = asyncio.get_running_loop().call_later(
                DISK_FAILING_RETRY, self._retry
            )

    def _retry(self) -> None:
        self._retry_timer = None
        self._due = True
        self._kick()

    async def close(self) -> None:
        # Drain before closing (bounded by the disk); a full or broken disk keeps what it
        # could not write: unacknowledged or re-derivable, never needed.
        while (
            (self._pending or self._writing)
            and self.full is None
            and self.failing is None
            and self._failure is None
        ):
            if self._pending and not self._writing:
                self._due = True
                self._kick()
            await asyncio.sleep(0.01)
        self._closed = True
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        if self._lazy_timer is not None:
            self._lazy_timer.cancel()
        self._executor.shutdown(wait=True)


def _positions(batch: WriteBatch) -> int:
    """How many positions a batch writes (for the group-commit metric)."""
    return len(batch.actions) + sum(run_count(r) for r in batch.runs)
