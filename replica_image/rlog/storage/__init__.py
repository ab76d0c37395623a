"""Storage: one narrow interface between the protocol and a disk engine.

A replica persists two things: its `Metadata` (status, implicit promise, identity, begin,
learned watermark) and one `Action` per log position. Every change arrives as a `WriteBatch`
applied atomically; with `sync=True` it is durable (fsync) before `apply` returns, which the
server relies on to never reply to a promise or a write before it is on disk.

Engines live in sibling modules and are chosen with `open_storage(path, engine)`; see
docs/storage-engines.md for the measurements behind the default.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

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


def open_storage(path: str | Path, engine: str = "lmdb") -> Storage:
    """Open (creating if needed) the storage of a data dir with the named engine."""
    if engine == "memory":
        from rlog.storage.memory import MemoryStorage

        return MemoryStorage()
    if engine == "lmdb":
        from rlog.storage.lmdb_engine import LmdbStorage

        return LmdbStorage(Path(path))
    if engine == "leveldb":
        try:
            from rlog.storage.leveldb_engine import LevelDbStorage
        except ImportError as exc:
            raise StorageError(
                f"engine 'leveldb' needs plyvel (pip install rlog[dev]): {exc}"
            ) from None
        return LevelDbStorage(Path(path))
    if engine == "rocksdb":
        try:
            from rlog.storage.rocksdb_engine import RocksDbStorage
        except ImportError as exc:
            raise StorageError(
                f"engine 'rocksdb' needs rocksdict (pip install rlog[dev]): {exc}"
            ) from None
        return RocksDbStorage(Path(path))
    if engine == "segment":
        from rlog.storage.segment_engine import SegmentStorage

        return SegmentStorage(Path(path))
    raise StorageError(f"unknown storage engine {engine!r} (one of {', '.join(ENGINES)})")


# Engines `open_storage` knows; the first one is the default (docs/storage-engines.md).
ENGINES = ("lmdb", "leveldb", "rocksdb", "segment", "memory")
