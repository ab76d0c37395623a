"""The storage interface every engine implements: `Storage`, the atomic `WriteBatch` it
applies, and `StorageError`. Engines import these from here; `rlog.storage` re-exports them
with `open_storage`, which picks an engine by name."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field

from rlog.proto import rlog_pb2 as pb


class StorageError(Exception):
    """The data dir cannot be used (unwritable, corrupt, locked by another process)."""


@dataclass
class WriteBatch:
    """Changes applied atomically: metadata (if given), actions (put by position), and the
    deletion of every action below `delete_below` (if given)."""

    metadata: pb.Metadata | None = None
    actions: list[pb.Action] = field(default_factory=list)
    delete_below: int | None = None
    sync: bool = True

    def merge(self, later: WriteBatch) -> None:
        """Fold a later batch into this one (group commit: many batches, one fsync)."""
        if later.metadata is not None:
            self.metadata = later.metadata
        self.actions.extend(later.actions)
        if later.delete_below is not None:
            self.delete_below = max(self.delete_below or 0, later.delete_below)
            # Actions below the new begin must not be re-created by the merged batch.
            self.actions = [a for a in self.actions if a.position >= self.delete_below]
        self.sync = self.sync or later.sync


class Storage(abc.ABC):
    """A replica's durable state. Implementations need not be thread-safe: the server calls
    them from one thread at a time."""

    @abc.abstractmethod
    def metadata(self) -> pb.Metadata:
        """The persisted metadata (a default, EMPTY one for a fresh data dir)."""

    @abc.abstractmethod
    def get(self, position: int) -> pb.Action | None:
        """The action stored at `position`, if any."""

    @abc.abstractmethod
    def scan(self, first: int, last: int) -> Iterator[pb.Action]:
        """Stored actions with first <= position <= last, in position order."""

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
