"""The storage interface every engine implements: `Storage`, the atomic `WriteBatch` it
applies, and `StorageError`. Engines import these from here; `rlog.storage` re-exports them
with `open_storage`, which picks an engine by name."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field

from rlog.packed import clip, expand, run_last
from rlog.proto import rlog_pb2 as pb


class StorageError(Exception):
    """The data dir cannot be used (unwritable, corrupt, locked by another process)."""


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


def expand_runs(batch: WriteBatch) -> WriteBatch:
    """The same changes with every run put as its per-position actions: for an engine that
    does not store runs as records (`Storage.stores_runs` False). A bridge until every engine
    stores runs natively; the result reads back the same through `get` and `scan`."""
    if not batch.runs:
        return batch
    actions = [action for run in batch.runs for action in expand(run)]
    actions.extend(batch.actions)  # put after the runs: they replace those positions
    return WriteBatch(
        metadata=batch.metadata, actions=actions, delete_below=batch.delete_below, sync=batch.sync
    )


class Storage(abc.ABC):
    """A replica's durable state. Implementations need not be thread-safe: the server calls
    them from one thread at a time."""

    # Whether `apply` stores `WriteBatch.runs` as records; the journal hands an engine that
    # does not the batch through `expand_runs`.
    stores_runs: bool = False

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

    @abc.abstractmethod
    def last_position(self) -> int | None:
        """The highest position holding an action, or None if there are none."""

    @abc.abstractmethod
    def first_position(self) -> int | None:
        """The lowest position holding an action, or None if there are none."""

    @abc.abstractmethod
    def apply(self, batch: WriteBatch) -> None:
        """Apply the batch atomically; durable before returning when `batch.sync`."""

    @abc.abstractmethod
    def close(self) -> None: ...
