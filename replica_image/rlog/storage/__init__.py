"""Storage: one narrow interface between the protocol and a disk engine.

A replica persists two things: its `Metadata` (status, implicit promise, identity, begin,
learned watermark) and the log: an `Action` per position, or one `Run` record for many
consecutive positions (docs/data-path.md). Every change arrives as a `WriteBatch`
applied atomically; with `sync=True` it is durable (fsync) before `apply` returns, which the
server relies on to never reply to a promise or a write before it is on disk.

The interface is defined in `rlog.storage.base` (engines import it from there, never from
this package, which imports them) and re-exported here. Engines live in sibling modules and
are chosen with `open_storage(path, engine)`; see docs/storage-engines.md for the
measurements behind the default.
"""

from __future__ import annotations

from pathlib import Path

from rlog.storage.base import DataDirLocked, Storage, StorageError, WriteBatch

__all__ = ["ENGINES", "DataDirLocked", "Storage", "StorageError", "WriteBatch", "open_storage"]


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
