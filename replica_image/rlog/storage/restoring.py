"""The mark of an unfinished restore (docs/backup.md, "All or nothing").

`rlog restore` writes <data dir>/RESTORING (synced, with the dir's entry) before any
record and removes it last, once every record and the metadata are synced. A dir that holds
the mark holds part of an archive at most: it is never fresh, never initialized, never
served (`refuse_if_restoring`); a restore run again on it discards what the interrupted one
wrote and starts over.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from pathlib import Path

from rlog.storage._common import ENGINE_SUBDIRS, FORMAT_NAME, LOCK_NAME, fsync_dir, make_dir
from rlog.storage.base import DataDirLocked, StorageError

RESTORING_NAME = "RESTORING"


class RestoreUnfinished(StorageError):
    """The data dir holds the mark of a restore that did not finish."""


def restoring(data_dir: Path) -> bool:
    """Whether the data dir holds the mark of an unfinished restore."""
    return (Path(data_dir) / RESTORING_NAME).exists()


def refuse_if_restoring(data_dir: Path) -> None:
    """Raise RestoreUnfinished (one line: the mark, what to do) if the dir holds the mark."""
    if restoring(data_dir):
        raise RestoreUnfinished(
            f"data dir {data_dir} holds an unfinished restore (the file "
            f"{Path(data_dir) / RESTORING_NAME}): it holds part of an archive at most and is "
            "never served; run the restore again (it starts over), or delete the data dir"
        )


def mark_restoring(data_dir: Path, what: str) -> None:
    """Create the mark (and the data dir if needed), synced with the dir's entry, then
    discard whatever an earlier, interrupted restore wrote in the dir."""
    data_dir = Path(data_dir)
    if not data_dir.parent.is_dir():
        raise StorageError(
            f"data dir {data_dir}: parent directory {data_dir.parent} does not exist"
        )
    make_dir(data_dir)
    lock = _lock(data_dir)  # never under a live replica (or another restore)
    try:
        fd = os.open(
            data_dir / RESTORING_NAME, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
        )
        try:
            os.write(fd, f"{what}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        fsync_dir(data_dir)
        discard_restored(data_dir)
    finally:
        os.close(lock)


def _lock(data_dir: Path) -> int:
    """The data dir's lock (rlog.storage._common.open_data_dir takes the same), as a file
    descriptor whose close releases it; DataDirLocked if a live process holds it."""
    fd = os.open(data_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise DataDirLocked(
                f"data dir {data_dir} is locked by another live process: restore only into "
                "the data dirs of a log that does not run"
            ) from None
        raise
    return fd


def discard_restored(data_dir: Path) -> None:
    """Remove what a restore writes in a marked data dir (the storage format and the
    engines' stores; nothing else), synced: none of it is kept as valid."""
    data_dir = Path(data_dir)
    for name in (*ENGINE_SUBDIRS, FORMAT_NAME, f"{FORMAT_NAME}.tmp"):
        path = data_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()
    fsync_dir(data_dir)


def clear_restoring(data_dir: Path) -> None:
    """Remove the mark, synced: the restore is complete (call only once every record and
    the metadata are synced)."""
    data_dir = Path(data_dir)
    (data_dir / RESTORING_NAME).unlink()
    fsync_dir(data_dir)


def abandon_restore(data_dir: Path) -> None:
    """Make a marked data dir fresh again: what the interrupted restore wrote, then the
    mark, removed (synced), for a replica that recovers from a running log instead."""
    data_dir = Path(data_dir)
    lock = _lock(data_dir)
    try:
        discard_restored(data_dir)
        clear_restoring(data_dir)
    finally:
        os.close(lock)
