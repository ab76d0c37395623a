"""Group commit: every batch the replica must persist goes through one writer.

Batches queued while a disk write is under way are merged into the next one, so many
concurrent writes, promises and learned messages cost one fsync. A caller that must not reply
before its batch is durable awaits `persist`; learned state (re-derivable) uses
`persist_nowait`. Storage calls run in one dedicated thread so the event loop never blocks on
the disk.

Storage faults (docs/faults.md):
- a full disk (`DiskFull`): the batches stay queued and are written again every
  `DISK_FULL_RETRY` seconds until space returns; meanwhile every caller of `persist` is
  answered the `DiskFull` at once (its reply is not sent: nothing is acknowledged that is not
  durable), and `full` says why the replica cannot write;
- a corrupt stored record met while planning a batch (`CorruptRecord`): `on_corrupt` returns
  the batch that repairs the replica (the record dropped, the replica RECOVERING), which is
  merged into the group, and the group is written again;
- any other failure fails every waiter and every later batch (a broken disk).
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
        self._wakeup = asyncio.Event()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="rlog-storage")
        self._task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self.full: DiskFull | None = None  # set while the disk has no space for our batches
        self._retry_timer: asyncio.TimerHandle | None = None
        # A corrupt record met while planning: the batch that repairs it (rlog.runtime.node).
        self.on_corrupt: Callable[[CorruptRecord], WriteBatch] | None = None
        self.on_full_changed: Callable[[], None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="journal")

    async def persist(self, batch: WriteBatch) -> None:
        """Return once `batch` is durable."""
        if self._failure is not None:
            raise self._failure
        if self.full is not None:
            # Kept and written once space returns; the caller is told now (nothing acked).
            self._pending.append((batch, None))
            raise self.full
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._pending.append((batch, future))
        self._wakeup.set()
        await future

    def persist_nowait(self, batch: WriteBatch) -> None:
        self._pending.append((batch, None))
        if self._lazy_timer is None:
            self._lazy_timer = asyncio.get_running_loop().call_later(
                self.lazy_delay, self._lazy_flush
            )

    def _lazy_flush(self) -> None:
        self._lazy_timer = None
        if self._pending and self.full is None:  # a full disk is retried on its own timer
            self._wakeup.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._pending:
                continue
            group, self._pending = self._pending, []
            merged = WriteBatch(sync=False)
            for batch, _ in group:
                merged.merge(batch)
            started = time.perf_counter()
            try:
                await self._apply(loop, merged)
            except DiskFull as exc:
                self._on_full(exc, group)
                continue
            except Exception as exc:  # a failing disk: fail every waiter, keep failing
                self._failure = exc
                for _, future in group:
                    if future is not None and not future.done():
                        future.set_exception(exc)
                continue
            if self.full is not None:
                self.full = None
                if self.on_full_changed is not None:
                    self.on_full_changed()
            self.metrics.observe_flush(time.perf_counter() - started, _positions(merged))
            for batch, future in group:
                self.core.persisted(batch)
                if future is not None and not future.done():
                    future.set_result(None)

    async def _apply(self, loop: asyncio.AbstractEventLoop, merged: WriteBatch) -> None:
        """Write the merged batch; a corrupt record in its way is repaired in the same write
        (at most once per record: a record still corrupt after its drop is a broken disk)."""
        dropped: set[int] = set()
        while True:
            try:
                await loop.run_in_executor(self._executor, self.storage.apply, merged)
                return
            except CorruptRecord as exc:
                if self.on_corrupt is None or exc.key in dropped:
                    raise
                dropped.add(exc.key)
                repair = self.on_corrupt(exc)
                merged.merge(repair)
                if repair.metadata is not None:
                    self._restamp(repair.metadata)

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

    def _retry(self) -> None:
        self._retry_timer = None
        self._wakeup.set()

    async def close(self) -> None:
        # Drain before closing (bounded by the disk); a full or broken disk keeps what it
        # could not write: unacknowledged or re-derivable, never needed.
        while self._pending and self.full is None and self._failure is None:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=True)


def _positions(batch: WriteBatch) -> int:
    """How many positions a batch writes (for the group-commit metric)."""
    return len(batch.actions) + sum(run_count(r) for r in batch.runs)
