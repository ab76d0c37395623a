"""Shared plumbing of the disk engines: data dir checks, the one-process lock, the storage
format version, the key codec."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from pathlib import Path

from rlog.durable import fsync_dir, write_durably
from rlog.storage.base import DataDirLocked, StorageError

# Each engine keeps its files in a sub-directory of the data dir named after it, so a data
# dir written by one engine is never silently opened (as empty) by another, and the engine of
# a data dir can be told from it (`engine_of`). Sub-directory -> the engine's name.
ENGINE_OF_SUBDIR = {
    "lmdb": "lmdb",
    "leveldb": "leveldb",
    "rocksdb": "rocksdb",
    "segments": "segment",
}
ENGINE_SUBDIRS = tuple(ENGINE_OF_SUBDIR)
LOCK_NAME = "rlog.lock"
MAX_POSITION = 2**64 - 1

# The storage format version of a data dir is the text of <data dir>/FORMAT ("2\n"), written
# atomically (temp file, fsync, rename, fsync of the dir) before any engine file. Version 2
# stores a run as one record (rlog/storage/records.py); version 1, written by rlog before
# runs, had no FORMAT file and one untagged Action record per position. Version 2 reads
# version-1 records as they are, so a version-1 dir is upgraded at open by writing FORMAT.
# Version 3 adds a CRC32C to every record and to the metadata (records.py); it reads the
# records of versions 1 and 2 (no CRC) as they are, so a version-2 dir is upgraded the same
# way (its old records get a CRC when rewritten; docs/faults.md).
# Version 4 writes the segment engine's frames with a CRC32C instead of zlib's CRC-32 (a
# flag in each frame's length; segment_engine.py), reading older frames as they are; the
# other engines write what version 3 did. A segment dir of version 3 is upgraded the same
# way, and a rlog that reads version 3 refuses it, as it must: it would cut a flagged frame
# off as torn. The other engines' dirs stay at version 3 (WRITTEN_VERSION), so that the rlog
# before version 4 still opens them: an image rolled back finds its LMDB volumes as it left
# them.
FORMAT_NAME = "FORMAT"
FORMAT_VERSION = 4  # the newest this code reads
UPGRADABLE_VERSIONS = (2, 3)  # recorded versions it also reads (and version 1: no FORMAT)
# The version each engine's dirs are written at (by sub-directory): the newest that changed
# what that engine writes.
WRITTEN_VERSION = {"lmdb": 3, "leveldb": 3, "rocksdb": 3, "segments": 4}

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


def format_version(path: Path) -> int | None:
    """The storage format version recorded in the data dir (None if it records none).
    Raises StorageError if the dir records one this code cannot read."""
    try:
        text = (path / FORMAT_NAME).read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageError(f"data dir {path}: cannot read {FORMAT_NAME}: {_why(exc)}") from None
    supported = (
        f"this rlog reads storage format version {FORMAT_VERSION} and upgrades versions 3, "
        f"2 and 1 (a dir without {FORMAT_NAME})"
    )
    try:
        version = int(text.strip())
    except ValueError:
        raise StorageError(
            f"data dir {path}: {FORMAT_NAME} holds {text.strip()[:40]!r}, not a storage "
            f"format version; {supported}"
        ) from None
    if version != FORMAT_VERSION and version not in UPGRADABLE_VERSIONS:
        raise StorageError(
            f"data dir {path} has storage format version {version}; {supported}: "
            "open it with the rlog that wrote it"
        )
    return version


def make_dir(path: Path) -> bool:
    """Create a directory and make its entry durable (an fsync of its parent); whether it
    was created (False: something is there already, a directory or not)."""
    try:
        path.mkdir()
    except FileExistsError:
        return False
    fsync_dir(path.parent)
    return True


def _write_format(path: Path, version: int) -> None:
    write_durably(path / FORMAT_NAME, f"{version}\n".encode())


def engine_of(path: Path) -> str | None:
    """The engine whose store the data dir holds, from its engine sub-directories; None if it
    holds none (a fresh dir, or none at all). Looks, changes nothing, takes no lock.

    Raises StorageError if it holds the stores of two engines: which one is the replica's
    cannot be told from the dir, and opening the wrong one would serve an empty or stale log.
    """
    path = Path(path)
    try:
        held = [ENGINE_OF_SUBDIR[sub] for sub in ENGINE_SUBDIRS if (path / sub).exists()]
    except OSError as exc:
        raise StorageError(f"data dir {path} cannot be read: {_why(exc)}") from None
    if len(held) > 1:
        quoted = [repr(engine) for engine in held]
        named = f"{', '.join(quoted[:-1])} and {quoted[-1]}"
        raise StorageError(
            f"data dir {path} holds the stores of {len(held)} engines, {named}: rlog will "
            "not guess which is this replica's; keep that one, move the others out"
        )
    return held[0] if held else None


def open_data_dir(path: Path, engine: str) -> tuple[Path, DirLock]:
    """Create (if needed) and lock the data dir; create (if needed) and return the engine's
    sub-directory. Each directory created has its entry synced.

    Raises StorageError with a one-line reason when the dir cannot be used: its parent is
    missing, it is not a directory, it is not writable, it is locked by another live process,
    it holds another engine's store, or it records a storage format version this code cannot
    read (checked before anything in the dir is touched). A dir without a version, or with
    an older one than the engine writes, gets the engine's WRITTEN_VERSION: a fresh one
    before any engine file, an older one as its upgrade (its records are read as they are).
    """
    path = Path(path)
    if path.is_dir():
        format_version(path)  # refuse an unreadable format before touching anything
    if not path.parent.is_dir():
        raise StorageError(f"data dir {path}: parent directory {path.parent} does not exist")
    try:
        make_dir(path)  # its entry synced: a power cut must not take a new data dir away
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
            raise DataDirLocked(
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
        held, asked = ENGINE_OF_SUBDIR[others[0]], ENGINE_OF_SUBDIR.get(engine, engine)
        raise StorageError(
            f"data dir {path} holds a {held!r} store; open it with that engine or 'auto' "
            f"(not {asked!r})"
        )
    try:
        recorded, written = format_version(path), WRITTEN_VERSION[engine]
        if recorded is None or recorded < written:
            _write_format(path, written)
    except StorageError:
        lock.release()
        raise
    except OSError as exc:
        lock.release()
        raise StorageError(f"data dir {path}: cannot write {FORMAT_NAME}: {_why(exc)}") from None
    try:
        # Created here, its entry synced, not left to the engine: none of them syncs the
        # data dir, and a power cut would take the whole store away (docs/faults.md).
        make_dir(path / engine)
    except OSError as exc:
        lock.release()
        raise StorageError(f"data dir {path}: cannot create {engine}/: {_why(exc)}") from None
    return path / engine, lock


# ---- the layout shared by the sorted key-value engines (LevelDB, RocksDB) ----------------
# Records (rlog/storage/records.py) under b"a" + 8-byte big-endian first position (so they
# sort by position), everything up to b"b" being records; the metadata under b"m".
ACTION_PREFIX = b"a"
ACTION_END = b"b"
META_KEY = b"m"


def action_key(position: int) -> bytes:
    return ACTION_PREFIX + encode_position(position)
