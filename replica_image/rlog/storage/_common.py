"""Shared plumbing of the disk engines: data dir checks, the one-process lock, key codec."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path
from typing import Any

from rlog.proto import rlog_pb2 as pb
from rlog.storage.base import StorageError

# Each engine keeps its files in a sub-directory of the data dir named after it, so a data
# dir written by one engine is never silently opened (as empty) by another.
ENGINE_SUBDIRS = ("lmdb", "leveldb", "rocksdb", "segments")
LOCK_NAME = "rlog.lock"
MAX_POSITION = 2**64 - 1

_KEY = struct.Struct(">Q")


def encode_position(position: int) -> bytes:
    """8-byte big-endian: byte order equals numeric order, so engine scans are in order."""
    if not 0 <= position <= MAX_POSITION:
        raise ValueError(f"position {position} is outside [0, 2**64-1]")
    return _KEY.pack(position)


def decode_position(key: bytes) -> int:
    return int(_KEY.unpack(key)[0])


class DirLock:
    """An exclusive `flock` on <data dir>/rlog.lock, held while the storage is open.

    flock locks belong to the open file description, so a second open of the same data dir
    fails both from another process and from this one; the kernel drops the lock when the
    holder dies (SIGKILL included), so a stale lock file never blocks a restart.
    """

    def __init__(self, fd: int, path: Path) -> None:
        self._fd: int | None = fd
        self.path = path

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def _why(exc: OSError) -> str:
    return exc.strerror or os.strerror(exc.errno or 0) or type(exc).__name__


def open_data_dir(path: Path, engine: str) -> tuple[Path, DirLock]:
    """Create (if needed) and lock the data dir; return the engine's sub-directory.

    Raises StorageError with a one-line reason when the dir cannot be used: its parent is
    missing, it is not a directory, it is not writable, it is locked by another live process,
    or it holds another engine's store.
    """
    path = Path(path)
    if not path.parent.is_dir():
        raise StorageError(f"data dir {path}: parent directory {path.parent} does not exist")
    try:
        path.mkdir(exist_ok=True)
    except FileExistsError:
        raise StorageError(f"data dir {path} exists and is not a directory") from None
    except OSError as exc:
        raise StorageError(f"data dir {path} is not writable: {_why(exc)}") from None
    if not path.is_dir():
        raise StorageError(f"data dir {path} exists and is not a directory")
    lock_path = path / LOCK_NAME
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise StorageError(f"data dir {path} is not writable: {_why(exc)}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = ""
        try:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        except OSError:
            pass
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            by = f" (pid {holder})" if holder else ""
            raise StorageError(
                f"data dir {path} is locked by another live process{by}: "
                "two replicas cannot share a data dir"
            ) from None
        raise StorageError(f"data dir {path} cannot be locked: {_why(exc)}") from None
    lock = DirLock(fd, lock_path)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        # Probe writability of the dir itself (as root, permission bits do not stop us, but a
        # read-only mount or an immutable dir does).
        probe = path / f".rlog-probe-{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        lock.release()
        raise StorageError(f"data dir {path} is not writable: {_why(exc)}") from None
    others = [e for e in ENGINE_SUBDIRS if e != engine and (path / e).exists()]
    if others and not (path / engine).exists():
        lock.release()
        raise StorageError(
            f"data dir {path} holds a {others[0]!r} store; open it with that engine "
            f"(not {engine!r})"
        )
    return path / engine, lock


# ---- the layout shared by the sorted key-value engines (LevelDB, RocksDB) ----------------
# Actions under b"a" + 8-byte big-endian position (so they sort by position), everything up
# to b"b" being actions; the metadata under b"m".
ACTION_PREFIX = b"a"
ACTION_END = b"b"
META_KEY = b"m"


def action_key(position: int) -> bytes:
    return ACTION_PREFIX + encode_position(position)


class KeyValueReads:
    """`metadata()` and `get()` for an engine whose `_db.get(key)` returns bytes or None."""

    _db: Any

    def metadata(self) -> pb.Metadata:
        raw = self._db.get(META_KEY)
        return pb.Metadata() if raw is None else pb.Metadata.FromString(raw)

    def get(self, position: int) -> pb.Action | None:
        if not 0 <= position < 2**64:
            return None
        raw = self._db.get(action_key(position))
        return None if raw is None else pb.Action.FromString(raw)
