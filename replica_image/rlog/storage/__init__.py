"""Storage: one narrow interface between the protocol and a disk engine.

A replica persists two things: its `Metadata` (status, implicit promise, identity, begin,
learned watermark) and the log: an `Action` per position, or one `Run` record for many
consecutive positions (docs/data-path.md). Every change arrives as a `WriteBatch`
applied atomically; with `sync=True` it is durable (fsync) before `apply` returns, which the
server relies on to never reply to a promise or a write before it is on disk.

The interface is defined in `rlog.storage.base` (engines import it from there, never from
this package, which imports them) and re-exported here. Engines live in sibling modules and
are chosen with `open_storage(path, engine)`. The engine `auto` (the default) is the one
whose store the data dir holds, and DEFAULT_ENGINE for a data dir that holds none, so a
change of the default never strands the data dirs written under the old one; see
docs/storage-engines.md for the measurements behind the default.
"""

from __future__ import annotations

from pathlib import Path

from rlog.storage._common import engine_of
from rlog.storage.base import DataDirLocked, Storage, StorageError, WriteBatch

__all__ = [
    "AUTO",
    "DEFAULT_ENGINE",
    "ENGINES",
    "ENGINE_CHOICES",
    "DataDirLocked",
    "Storage",
    "StorageError",
    "WriteBatch",
    "choose_engine",
    "engine_of",
    "open_storage",
    "resolve_engine",
]

# Engines `open_storage` knows (docs/storage-engines.md).
ENGINES = ("lmdb", "leveldb", "rocksdb", "segment", "memory")
# The engine of a data dir that holds no store yet (docs/storage-engines.md says why).
DEFAULT_ENGINE = "segment"
# The engine of the data dir's store, or DEFAULT_ENGINE if it holds none: the default
# wherever an engine is chosen (--storage-engine), never `memory`.
AUTO = "auto"
ENGINE_CHOICES = (AUTO, *ENGINES)


def choose_engine(path: str | Path, engine: str) -> tuple[str, str]:
    """The engine to open the data dir with, and why (for the replica's log): `engine`
    itself, or for AUTO the engine whose store the dir holds (DEFAULT_ENGINE if it holds
    none). Raises StorageError for an unknown engine, and for AUTO on a dir that holds the
    stores of two engines."""
    if engine == AUTO:
        held = engine_of(Path(path))
        if held is None:
            return DEFAULT_ENGINE, f"data dir {path} holds no store: the default engine"
        return held, f"data dir {path} holds a {held} store"
    if engine not in ENGINES:
        raise StorageError(
            f"unknown storage engine {engine!r} (one of {', '.join(ENGINE_CHOICES)})"
        )
    return engine, "asked for by name"


def resolve_engine(path: str | Path, engine: str) -> str:
    """The engine to open the data dir with (`choose_engine` without the why)."""
    return choose_engine(path, engine)[0]


def open_storage(path: str | Path, engine: str = AUTO) -> Storage:
    """Open (creating if needed) the storage of a data dir with the named engine (AUTO: the
    one whose store it holds; see `resolve_engine`). An engine other than the one whose
    store the dir holds is refused (rlog.storage._common.open_data_dir)."""
    engine = resolve_engine(path, engine)
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
                f"engine 'leveldb' needs plyvel (pip install rlog-paxos[dev]): {exc}"
            ) from None
        return LevelDbStorage(Path(path))
    if engine == "rocksdb":
        try:
            from rlog.storage.rocksdb_engine import RocksDbStorage
        except ImportError as exc:
            raise StorageError(
                f"engine 'rocksdb' needs rocksdict (pip install rlog-paxos[dev]): {exc}"
            ) from None
        return RocksDbStorage(Path(path))
    if engine == "segment":
        from rlog.storage.segment_engine import SegmentStorage

        return SegmentStorage(Path(path))
    raise AssertionError(f"engine {engine!r} is in ENGINES but not opened here")
