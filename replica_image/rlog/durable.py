"""Durable file writes: a file replaced whole and kept across a power cut, and a directory's
entries synced. Shared by the storage engines and the certificates (docs/faults.md, "Power
loss")."""

from __future__ import annotations

import os
from pathlib import Path

# At most this many bytes a write call, as the segment engine writes (WRITE_PIECE in
# rlog/storage/segment_format.py): on the VMs rlog is benchmarked on, larger writes of new
# file data ran at a quarter of the speed (docs/performance.md).
_PIECE = 1 << 20


def fsync_dir(path: Path) -> None:
    """Make a directory's entries durable: a file or directory created in it, a rename, an
    unlink. A file's own fsync does not: after a power cut its name may be gone, whatever
    its data (docs/faults.md, "Power loss")."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(
    path: Path, data: bytes, *, aside: Path | None = None, mode: int | None = None
) -> None:
    """Replace `path` whole with `data`, durably: written to `aside` (default: `path` with
    ".tmp" appended, in the same directory), synced, renamed over `path`, and the directory
    synced. A reader never sees half a file; a crash leaves the old file or the new one, and
    perhaps the aside file (which a failed write or sync removes: a full disk gets its space
    back). The error of the failed step is raised as it is.

    `mode`: None creates the file 0o644 less the umask, as open(2) does; a mode sets exactly
    that on the aside file before any data is in it (a key is never readable by others,
    whatever the umask)."""
    if aside is None:
        aside = path.with_name(path.name + ".tmp")
    fd = os.open(
        aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644 if mode is None else mode
    )
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        view = memoryview(data)
        while view:  # a short write (rare) is followed by the rest
            view = view[os.write(fd, view[:_PIECE]) :]
        os.fsync(fd)
    except OSError:
        aside.unlink(missing_ok=True)
        raise
    finally:
        os.close(fd)
    os.rename(aside, path)
    fsync_dir(path.parent)
