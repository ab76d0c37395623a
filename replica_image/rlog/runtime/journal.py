"""Group commit: every batch the replica must persist goes through one writer.

Batches queued while a disk write is under way are merged into the next one, so many
concurrent writes, promises and learned messages cost one fsync. A caller that must not reply
before its batch is durable awaits `persist`; learned state (re-derivable) uses
`persist_nowait`. Storage calls run in one dedicated thread so the event loop never blocks on
the disk.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from rlog.packed import run_count
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.metrics import ReplicaMetrics
from rlog.storage import Storage, WriteBatch


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

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="journal")

    async def persist(self, batch: WriteBatch) -> None:
        """Return once `batch` is durable."""
        if self._failure is not None:
            raise self._failure
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
        if self._pending:
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
                await loop.run_in_executor(self._executor, self.storage.apply, merged)
            except Exception as exc:  # a failing disk: fail every waiter, keep failing
                self._failure = exc
                for _, future in group:
                    if future is not None and not future.done():
                        future.set_exception(exc)
                continue
            self.metrics.observe_flush(time.perf_counter() - started, _positions(merged))
            for batch, future in group:
                self.core.persisted(batch)
                if future is not None and not future.done():
                    future.set_result(None)

    async def close(self) -> None:
        while self._pending:  # noqa: ASYNC110 (drain before closing; bounded by the disk)
            await asyncio.sleep(0.01)
        if self._task is not None:
            self._task.cancel()
        self._executor.shutdown(wait=True)


def _positions(batch: WriteBatch) -> int:
    """How many positions a batch writes (for the group-commit metric)."""
    return len(batch.actions) + sum(run_count(r) for r in batch.runs)
