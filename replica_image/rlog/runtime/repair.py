"""Storage faults (docs/faults.md): a corrupt record is dropped, never served, and recovered
from the peers; a full disk refuses appends until space returns.

- `open_core`: the replica's core over its storage, a corrupt record met at open dropped
  and the replica turned RECOVERING before it serves anything;
- `Repair`: the same for a record met later, by the journal while writing (`repair_batch`,
  its `on_corrupt`) or by a read or a handler (`storage_fault_seen`), the replica asked to
  recover again (`restart_recovery`); and the full disk (`on_disk_full_changed`, the
  journal's `on_full_changed`; `disk_low`, `disk_full_error` for the appends);
- `StorageFaults`: what Status and the metrics say of them.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable, Coroutine
from typing import Any, NamedTuple

from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.errors import RpcError
from rlog.runtime.journal import Journal
from rlog.runtime.metrics import ReplicaMetrics
from rlog.storage import Storage, WriteBatch
from rlog.storage.base import CorruptRecord, DiskFull
from rlog.wire import Reason

log = logging.getLogger("rlog.node")

# Corrupt records repaired at open before the replica gives up (a disk this broken is not
# one to repair record by record).
MAX_REPAIRS_AT_OPEN = 1000

FREE_CHECK_INTERVAL = 0.1  # seconds between looks at the data dir's free space


class StorageFaults:
    """A storage fault, for Status and the log: the last corrupt record found, or why the
    disk cannot be written (`fault`, "" if none); and how many corrupt records were found."""

    def __init__(self, metrics: ReplicaMetrics) -> None:
        self.metrics = metrics
        self.fault = ""
        self.corrupt_records = 0

    def damaged(self, damage: list[str]) -> None:
        self.corrupt_records += len(damage)
        self.metrics.corrupt_records.inc(len(damage))
        self.fault = (
            f"damaged data skipped at open ({'; '.join(damage)[:300]}): recovering every "
            "position from the peers"
        )
        log.error("%s", self.fault)

    def corrupt(self, exc: CorruptRecord) -> None:
        self.corrupt_records += 1
        self.metrics.corrupt_records.inc()
        self.fault = (
            f"corrupt record at position {exc.key} ({exc.why}): dropped, not served; "
            "recovering it from the peers"
        )
        log.error("%s: %s", exc, "dropping it and recovering from the peers")


def open_core(storage: Storage, faults: StorageFaults) -> ReplicaCore:
    """The replica's core over its storage. Opening reads every record not yet learned;
    a corrupt one is dropped and the replica turned RECOVERING before it serves anything,
    then the core is opened again. Damage the engine skipped at open (a segment frame)
    may have held any position: the replica re-learns them all from its peers."""
    damage = storage.damage()
    if damage:
        faults.damaged(damage)
        meta = storage.metadata()
        if meta.status == pb.VOTING:
            meta.status = pb.RECOVERING
        meta.learned_below = meta.begin
        storage.apply(WriteBatch(metadata=meta))
    for _ in range(MAX_REPAIRS_AT_OPEN):
        try:
            return ReplicaCore(storage)
        except CorruptRecord as exc:
            faults.corrupt(exc)
            meta = storage.metadata()
            if meta.status == pb.VOTING:
                meta.status = pb.RECOVERING
            floor = max(exc.key, meta.begin)
            meta.learned_below = min(meta.learned_below, floor)
            storage.apply(WriteBatch(drop_records=[exc.key], metadata=meta))
    raise CorruptRecord(0, f"more than {MAX_REPAIRS_AT_OPEN} corrupt records at open")


class FreeSpace(NamedTuple):
    """The data dir's free space as last looked at."""

    when: float  # time.monotonic()
    free: int  # bytes (-1: could not tell)


class Repair:
    """The node's side of storage faults once the replica runs: it drops a corrupt record,
    reports it and has the replica recover (`restart_recovery`: stop leading and voting,
    run recovery again); it says whether the disk is too full to take appends."""

    def __init__(
        self,
        core: ReplicaCore,
        journal: Journal,
        config: ReplicaConfig,
        faults: StorageFaults,
        restart_recovery: Callable[[], None],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.core = core
        self.journal = journal
        self.config = config
        self.faults = faults
        self.restart_recovery = restart_recovery
        self.spawn = spawn
        self._repairing: set[int] = set()
        self._free_checked = FreeSpace(0.0, -1)

    def repair_batch(self, exc: CorruptRecord) -> WriteBatch:
        """The journal met a corrupt record while writing: the batch that repairs it."""
        self.faults.corrupt(exc)
        asyncio.get_running_loop().call_soon(self.restart_recovery)
        return self.core.forget_corrupt(exc.key)

    def storage_fault_seen(self, exc: CorruptRecord) -> None:
        """A read met a corrupt record: drop it, stop voting and recover (docs/faults.md).
        Reads never serve it: they fail with CORRUPT_RECORD, and once it is dropped this
        replica no longer counts its positions as learned."""
        if exc.key in self._repairing:
            return
        self._repairing.add(exc.key)
        self.faults.corrupt(exc)
        batch = self.core.forget_corrupt(exc.key)
        self.restart_recovery()
        self.spawn(self._persist_repair(batch, exc.key))

    async def _persist_repair(self, batch: WriteBatch, key: int) -> None:
        while True:
            try:
                await self.journal.persist(batch)
                break
            except DiskFull:
                await asyncio.sleep(1.0)  # the batch stays queued; wait for it
                if self.journal.full is None:
                    break
        self._repairing.discard(key)

    def on_disk_full_changed(self) -> None:
        full = self.journal.full
        if full is not None:
            self.faults.fault = f"disk full: {full}"
            log.error("disk full, appends refused until space returns: %s", full)
        else:
            if self.faults.fault.startswith("disk full"):
                self.faults.fault = ""
            log.info("disk space is back: writing again")

    def disk_low(self) -> str:
        """Why appends are refused for want of space ("" if they are not): the disk is full
        (writes fail) or has less free than --min-free-bytes (looked at most every 0.1 s)."""
        if self.journal.full is not None:
            return str(self.journal.full)
        if self.config.storage_engine == "memory" or not self.config.min_free_bytes:
            return ""
        now = time.monotonic()
        if now - self._free_checked.when > FREE_CHECK_INTERVAL:
            try:
                st = os.statvfs(self.config.data_dir)
                self._free_checked = FreeSpace(now, st.f_bavail * st.f_frsize)
            except OSError:
                self._free_checked = FreeSpace(now, -1)
        free = self._free_checked.free
        if 0 <= free < self.config.min_free_bytes:
            return (
                f"data dir {self.config.data_dir}: {free} bytes free, under --min-free-bytes "
                f"{self.config.min_free_bytes} (kept for promises and elections)"
            )
        return ""

    def disk_full_error(self) -> RpcError | None:
        """The error an append answers while the disk is full or nearly so."""
        why = self.disk_low()
        if not why:
            return None
        return RpcError(Reason.DISK_FULL, f"replica {self.config.id}: {why}")
