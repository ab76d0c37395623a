"""The storage interface every engine implements: `Storage`, the atomic `WriteBatch` it
applies, and `StorageError`. Engines import these from here; `rlog.storage` re-exports them
with `open_storage`, which picks an engine by name."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field

from rlog.packed import clip, run_last
from rlog.proto import rlog_pb2 as pb


class StorageError(Exception):
    """The data dir cannot be used (unwritable, corrupt, locked by another process)."""


class DataDirLocked(StorageError):
    """Another live process holds the data dir (its lock): nothing was opened or changed."""


class CorruptRecord(StorageError):
    """A stored record failed its checksum (or does not parse): it must not be served. `key`
    is the position it is stored under (its first position); how far it reached is unknown,
    since its header cannot be trusted."""

    def __init__(self, key: int, why: str) -> None:
        super().__init__(f"stored record at position {key} is corrupt: {why}")
        self.key = key
        self.why = why


class StorageLost(StorageError):
    """The data dir lacks what its own records say it holds (a segment file gone, a segment
    shorter than the end it synced, an index snapshot gone with segments it covered): the
    replica may have forgotten promises or accepts it acknowledged, so it must not vote on
    it. The replica sets the data dir aside and rejoins empty (rlog/runtime/repair.py)."""


class DiskFull(StorageError):
    """A write failed for lack of space (ENOSPC, EDQUOT, an LMDB map that cannot grow):
    nothing of the batch was written; reads still work, writes may succeed once space
    returns."""


@dataclass
class WriteBatch:
    """Changes applied atomically, in this order: the deletion of every record below
    `delete_below` (if given), `runs` (each stored as ONE record; it replaces whatever was
    stored at its positions), `actions` (put by position; an action at a position inside a
    stored run replaces that position only: the engine splits the run), then metadata (if
    given)."""

    metadata: pb.Metadata | None = None
    actions: list[pb.Action] = field(default_factory=list)
    delete_below: int | None = None
    sync: bool = True
    runs: list[pb.Run] = field(default_factory=list)
    # Keys of corrupt records to delete unread (applied before everything else; a record of
    # this batch put at the same key replaces it): a replica repairing itself (docs/faults.md).
    drop_records: list[int] = field(default_factory=list)

    def merge(self, later: WriteBatch) -> None:
        """Fold a later batch into this one (group commit: many batches, one fsync). The
        later batch's records win where they overlap this one's."""
        if later.metadata is not None:
            self.metadata = later.metadata
        if later.runs:
            # Runs are applied before actions: an earlier action under a later run must go.
            covered = [(r.first, run_last(r)) for r in later.runs]
            self.actions = [
                a for a in self.actions if not any(lo <= a.position <= hi for lo, hi in covered)
            ]
            self.runs.extend(later.runs)
        self.actions.extend(later.actions)
        if later.delete_below is not None:
            cut = max(self.delete_below or 0, later.delete_below)
            self.delete_below = cut
            # Records below the new begin must not be re-created by the merged batch.
            self.actions = [a for a in self.actions if a.position >= cut]
            self.runs = [clip(r, cut, run_last(r)) for r in self.runs if run_last(r) >= cut]
        self.sync = self.sync or later.sync
        self.drop_records.extend(later.drop_records)


@dataclass(frozen=True, slots=True)
class RunHead:
    """A stored run without its values: the positions it holds and its head (which write put
    it, its type, epoch and session), all that bookkeeping reads of it (`scan_heads`)."""

    first: int
    last: int
    head: pb.Action


def clip_head(found: pb.Action | RunHead, first: int, last: int) -> pb.Action | RunHead:
    """A run head clipped to [first, last] (itself if it lies inside); an action as it is."""
    if isinstance(found, RunHead) and (found.first < first or found.last > last):
        return RunHead(max(found.first, first), min(found.last, last), found.head)
    return found


def head_of(record: pb.Action | pb.Run) -> pb.Action | RunHead:
    """A record as `scan_heads` yields it: a run as its RunHead, an action as it is."""
    if isinstance(record, pb.Run):
        return RunHead(record.first, run_last(record), record.head)
    return record


class Storage(abc.ABC):
    """A replica's durable state. `apply` runs in the journal's storage thread while reads
    come from the event loop (rlog/runtime/journal.py): each read must see the state between
    two batches, never part of one (an engine with snapshot reads has that for free; the
    segment engine holds a lock). Writes come from that one thread only."""

    @abc.abstractmethod
    def metadata(self) -> pb.Metadata:
        """The persisted metadata (a default, EMPTY one for a fresh data dir)."""

    @abc.abstractmethod
    def get(self, position: int) -> pb.Action | None:
        """The action stored at `position`, if any."""

    @abc.abstractmethod
    def scan(self, first: int, last: int) -> Iterator[pb.Action]:
        """Stored actions with first <= position <= last, in position order."""

    def scan_records(self, first: int, last: int) -> Iterator[pb.Action | pb.Run]:
        """Stored records overlapping [first, last], in position order, clipped to it: a run
        as stored (its bytes are not re-encoded per position; engines that store runs
        override this), any other position as its action."""
        yield from self.scan(first, last)

    def scan_heads(self, first: int, last: int) -> Iterator[pb.Action | RunHead]:
        """`scan_records` without the values of runs: each stored run overlapping [first,
        last] as its RunHead clipped to it (engines that can read a run's head without its
        values override this)."""
        for record in self.scan_records(first, last):
            yield head_of(record)

    @abc.abstractmethod
    def last_position(self) -> int | None:
        """The highest position holding an action, or None if there are none."""

    @abc.abstractmethod
    def first_position(self) -> int | None:
        """The lowest position holding an action, or None if there are none."""

    @abc.abstractmethod
    def apply(self, batch: WriteBatch) -> None:
        """Apply the batch atomically; durable before returning when `batch.sync`, and
        with it every batch applied before it (a synced batch may depend on earlier ones
        that were not synced)."""

    def damage(self) -> list[str]:
        """Damage found and skipped when the storage was opened (what it held there is lost
        here: the replica must recover it from its peers before it votes; docs/faults.md).
        Empty for an intact store."""
        return []

    def forget_damage(self) -> None:
        """The damage `damage` reported is accounted for durably (the replica stored that it
        must recover every position from its peers): neutralize it, so that later opens do
        not report it again. Nothing to do for an intact store."""
        return None

    @abc.abstractmethod
    def close(self) -> None: ...
