"""Storage faults (docs/faults.md): a corrupt record is dropped, never served, and recovered
from the peers; storage lost or damaged beyond a record is set aside and the replica
rejoins empty; a data dir of another log or replica is refused, visibly; a full disk
refuses appends until space returns.

- `set_aside`: storage found lost at open (`StorageLost`: a segment missing or cut short,
  LMDB's data.mdb truncated or damaged)
  moved into `<data dir>/damaged-<time>/` (never deleted: it is evidence), so a fresh one
  can be opened in its place;
- `lost_earlier`: storage set aside by a start that stopped before it stamped the fresh
  store RECOVERING is lost all the same;
- `disk_fault`: whether the storage could not be opened for a full, failing or read-only
  disk (the server waits for it at start);
- `identity_refusal`: why a data dir stamped for another log or replica must not be used;
- `open_core`: the replica's core over its storage, a corrupt record met at open dropped
  and the replica turned RECOVERING before it serves anything; a fresh store that replaces
  a lost one turned RECOVERING too (never EMPTY: see `open_core`);
- `Repair`: the same for a record met later, by the journal while writing (`repair_batch`,
  its `on_corrupt`) or by a read or a handler (`storage_fault_seen`), the replica asked to
  recover again (`restart_recovery`); and the full disk (`on_disk_full_changed`, the
  journal's `on_full_changed`; `disk_low`, `disk_full_error` for the appends);
- `StorageFaults`: what Status and the metrics say of them (`storage_fault`, the reason;
  `storage_condition`, one of `CONDITIONS`).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, NamedTuple

from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.errors import RpcError
from rlog.runtime.journal import DISK_FAILING_RETRY, Journal
from rlog.runtime.metrics import ReplicaMetrics
from rlog.storage import Storage, WriteBatch
from rlog.storage._common import ENGINE_OF_SUBDIR, fsync_dir
from rlog.storage.base import CorruptRecord, DiskFull, StorageLost
from rlog.storage.memory import MemoryStorage
from rlog.wire import Reason

log = logging.getLogger("rlog.node")

# Corrupt records repaired at open before the replica gives up (a disk this broken is not
# one to repair record by record).
MAX_REPAIRS_AT_OPEN = 1000

FREE_CHECK_INTERVAL = 0.1  # seconds between looks at the data dir's free space

# Recover rounds in a row (0.5-1 s apart) that a replica whose storage was lost waits for a
# quorum of VOTING replicas before it says it refuses to vote (none could vouch for the data).
REFUSE_AFTER_ROUNDS = 10

# Status's `storage_condition` (docs/faults.md; "" is healthy).
CORRUPT_REPAIRED = "corrupt-repaired"
STORAGE_LOST = "storage-lost"
REFUSING = "refusing"
DISK_FAILING = "disk-failing"
DISK_FULL = "disk-full"
CONDITIONS = ("", CORRUPT_REPAIRED, STORAGE_LOST, REFUSING, DISK_FAILING, DISK_FULL)
DAMAGED_PREFIX = "damaged-"


class SetAside(NamedTuple):
    """Storage found lost at open, moved aside: why, where, and the engine it was (the
    fresh store is of the same engine)."""

    reason: str
    where: Path
    engine: str


def set_aside(data_dir: Path, lost: StorageLost) -> SetAside:
    """Move the engine's files of a data dir found lost into `damaged-<UTC time>/` beside
    them (renames on the same file system, made durable); the dir is left fresh but for its
    FORMAT. Nothing is deleted: what was lost, and how, is for a human to read."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = data_dir / f"{DAMAGED_PREFIX}{stamp}"
    n = 1
    while aside.exists():
        n += 1
        aside = data_dir / f"{DAMAGED_PREFIX}{stamp}-{n}"
    aside.mkdir()
    engine = ""
    for sub, name in ENGINE_OF_SUBDIR.items():
        if (data_dir / sub).exists():
            os.rename(data_dir / sub, aside / sub)
            engine = engine or name
    fsync_dir(aside)
    fsync_dir(data_dir)
    reason = (
        f"storage lost: {lost}; its files are set aside in {aside} (kept, never deleted): "
        "rejoined empty, recovering every position from a quorum of the peers"
    )
    log.error("%s", reason)
    return SetAside(reason, aside, engine)


def lost_earlier(data_dir: Path, storage: Storage) -> SetAside | None:
    """Storage set aside by an earlier start that stopped before it stamped the fresh store
    RECOVERING (a full disk at open, a crash, a power cut): a fresh, EMPTY store beside a
    `damaged-*` dir. It is lost all the same: never EMPTY (see `open_core`). None if not."""
    if isinstance(storage, MemoryStorage):
        return None
    meta = storage.metadata()
    if meta.status != pb.EMPTY or meta.stamped or storage.first_position() is not None:
        return None
    asides = sorted(p for p in data_dir.glob(f"{DAMAGED_PREFIX}*") if p.is_dir())
    if not asides:
        return None
    reason = (
        f"storage lost: found set aside in {asides[-1]} by an earlier start (kept, never "
        "deleted), the store in its place fresh: rejoined empty, recovering every position "
        "from a quorum of the peers"
    )
    log.error("%s", reason)
    return SetAside(reason, asides[-1], "")


# What a disk says when it is full, failing or remounted read-only: each may pass (space
# freed, the disk remounted or replaced) with nothing done to the replica's files.
DISK_FAULT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)


def disk_fault(exc: BaseException) -> bool:
    """Whether opening the storage failed because the disk cannot be written now (full,
    failing, read-only: `DISK_FAULT_ERRNOS`, or `DiskFull`), not because of what the data
    dir holds or how the replica is configured. Engines raise a one-line StorageError from
    the OSError they met (its `__context__`), which this follows."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, DiskFull):
            return True
        if isinstance(seen, OSError) and seen.errno in DISK_FAULT_ERRNOS:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def identity_refusal(meta: pb.Metadata, config: ReplicaConfig) -> str:
    """Why this data dir must not be used by this replica ("" if it may): one stamped for
    another log or another replica (a log deleted and recreated, a volume attached to the
    wrong pod) must never be reused, nor changed."""
    if not meta.stamped:
        return ""
    if meta.log_id != config.log_id:
        return (
            f"data dir {config.data_dir} belongs to log {meta.log_id or '(no id)'!r}, "
            f"not {config.log_id or '(no id)'!r}: refusing to start on another log's data"
        )
    if meta.replica_id != config.id:
        return (
            f"data dir {config.data_dir} belongs to replica {meta.replica_id}, "
            f"not {config.id}: refusing to start on another replica's data"
        )
    return ""


class StorageFaults:
    """A storage fault, for Status and the log: the last corrupt record found, or why the
    disk cannot be written (`fault`, "" if none); how many corrupt records were found; and
    the storage's condition (`condition`, one of CONDITIONS but DISK_FULL, which
    `Repair.condition` adds)."""

    def __init__(self, metrics: ReplicaMetrics) -> None:
        self.metrics = metrics
        self.fault = ""
        self.corrupt_records = 0
        self.condition = ""
        self.lost_reason = ""  # why the storage was set aside at open ("" if it was not)
        self._undecided = 0  # recover rounds in a row undecided since

    def set_condition(self, condition: str) -> None:
        self.condition = condition
        self.metrics.set_storage_condition(condition)

    def lost(self, reason: str) -> None:
        """The storage was found lost at open and set aside (`set_aside` logged it)."""
        self.fault = self.lost_reason = reason
        self.set_condition(STORAGE_LOST)

    def recover_undecided(self) -> None:
        """A recover round ended undecided. A replica whose storage was lost that has waited
        REFUSE_AFTER_ROUNDS rounds in a row says it refuses to vote: no quorum of VOTING
        replicas could vouch for the data (it goes on asking)."""
        if not self.lost_reason or self.condition not in (STORAGE_LOST, REFUSING):
            return
        self._undecided += 1
        if self._undecided == REFUSE_AFTER_ROUNDS:
            self.refuse(
                f"{self.lost_reason}; no quorum of VOTING replicas answered in "
                f"{REFUSE_AFTER_ROUNDS} recover rounds to vouch for the data: refusing to vote"
            )

    def recover_decided(self) -> None:
        """A recover round decided (a quorum answered): back to storage-lost, recovering."""
        self._undecided = 0
        if self.lost_reason and self.condition == REFUSING:
            self.fault = self.lost_reason
            self.set_condition(STORAGE_LOST)
            log.info("a quorum of VOTING replicas answered: recovering the lost storage")

    def refuse(self, reason: str) -> None:
        """The replica refuses to vote on its storage."""
        self.fault = reason
        self.set_condition(REFUSING)
        log.error("%s (answering Status only, never voting)", reason)

    def damaged(self, damage: list[str]) -> None:
        self.corrupt_records += len(damage)
        self.metrics.corrupt_records.inc(len(damage))
        self.fault = (
            f"damaged data skipped at open ({'; '.join(damage)[:300]}): recovering every "
            "position from the peers"
        )
        self._repaired()
        log.error("%s", self.fault)

    def _repaired(self) -> None:
        if not self.condition:
            self.set_condition(CORRUPT_REPAIRED)

    def corrupt(self, exc: CorruptRecord) -> None:
        self.corrupt_records += 1
        self.metrics.corrupt_records.inc()
        self.fault = (
            f"corrupt record at position {exc.key} ({exc.why}): dropped, not served; "
            "recovering it from the peers"
        )
        self._repaired()
        log.error("%s: %s", exc, "dropping it and recovering from the peers")


def open_core(storage: Storage, faults: StorageFaults, lost: SetAside | None = None) -> ReplicaCore:
    """The replica's core over its storage. Opening reads every record not yet learned;
    a corrupt one is dropped and the replica turned RECOVERING before it serves anything,
    then the core is opened again. Damage the engine skipped at open (a segment frame)
    may have held any position: the replica re-learns them all from its peers.

    `lost`: the storage was found lost and set aside, this is a fresh store in its place.
    It is turned RECOVERING, not left EMPTY: a RECOVERING replica neither votes (promises
    and writes are IGNORED) nor takes part in auto-initialization; it rejoins only through
    a quorum of VOTING replicas, catching up on their log and adopting their highest
    promise (docs/recovery.md). If no such quorum answers, it waits, refusing to vote."""
    if lost is not None:
        faults.lost(lost.reason)
        meta = storage.metadata()
        meta.status = pb.RECOVERING
        storage.apply(WriteBatch(metadata=meta))
    damage = storage.damage()
    if damage:
        faults.damaged(damage)
        meta = storage.metadata()
        if meta.status == pb.VOTING:
            meta.status = pb.RECOVERING
        meta.learned_below = meta.begin
        storage.apply(WriteBatch(metadata=meta))
        # Now that the loss is on record (RECOVERING, nothing learned: synced), the damage
        # may go: left in place, every later open would report it again and send the
        # replica back to RECOVERING after it recovered (docs/faults.md).
        storage.forget_damage()
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
        self._condition_before_failing = ""
        self._disk_works = asyncio.Event()  # clear while the disk's writes fail
        self._disk_works.set()
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

    def on_disk_failing_changed(self) -> None:
        """The journal's writes began or stopped failing (EIO, EROFS...). Failing: the
        replica leaves the quorum at once: RECOVERING in memory (promises and writes are
        IGNORED from now on; the change is queued with the rest and written once the disk
        takes writes), stepped down if it led (its waiting appends fail, retryable), and it
        recovers again: its recovery waits for the disk (`disk_failing`), then rejoins
        through a quorum, catching up on what it missed. Working again: say so."""
        failing = self.journal.failing
        if failing is not None:
            self._condition_before_failing = self.faults.condition
            self._disk_works.clear()
            self.faults.fault = f"disk failing: {failing}"
            self.faults.set_condition(DISK_FAILING)
            log.error(
                "disk failing, leaving the quorum until it works again (probed every %.0fs): %s",
                DISK_FAILING_RETRY,
                failing,
            )
            if self.core.status == pb.VOTING:
                self.journal.persist_nowait(self.core.set_status(pb.RECOVERING))
            self.restart_recovery()
        else:
            self._disk_works.set()
            if self.faults.condition == DISK_FAILING:
                self.faults.fault = ""
                self.faults.set_condition(self._condition_before_failing)
            log.info("the disk takes writes again: rejoining through recovery")

    def disk_failing(self) -> bool:
        """Whether the disk's writes fail (recovery waits for it to work again)."""
        return self.journal.failing is not None

    async def disk_working(self) -> None:
        """Return once the disk takes writes (at once if it does)."""
        await self._disk_works.wait()

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

    def condition(self) -> str:
        """Status's `storage_condition` (CONDITIONS)."""
        if self.faults.condition in (REFUSING, DISK_FAILING, STORAGE_LOST):
            return self.faults.condition
        if self.disk_low():
            return DISK_FULL
        return self.faults.condition

    def disk_full_error(self) -> RpcError | None:
        """The error an append answers while the disk is full or nearly so."""
        why = self.disk_low()
        if not why:
            return None
        return RpcError(Reason.DISK_FULL, f"replica {self.config.id}: {why}")
