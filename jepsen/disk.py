"""Disk faults for real replica processes (docs/faults.md; the kinds of `--nemesis disk`).

- `lose-segment`: a segment file of a stopped replica deleted (the newest, or one before
  it); `truncate-segment`: its newest segment cut short; `bit-flip`: one byte of a synced
  frame's payload flipped. The replica is SIGKILLed first and restarted on what is left at
  the end of the hold: it must find the loss at open and rejoin only through a quorum
  (storage lost: set aside, RECOVERING; a damaged frame: skipped, RECOVERING);
- `disk-full`: the replica's data dir is a small tmpfs (`mount_tmpfs`), filled up by a file
  beside the engine's (`fill`), freed at the end (`unfill`): appends refused, no write lost;
- `eio`: every write and sync of the replica's data dir fails with EIO, through the
  test-only shim tests/eio_shim/ (on the replicas' PYTHONPATH when `eio` is asked for) while
  `<data dir>.eio` exists: the replica leaves the quorum and rejoins once its disk works.

The damage is made durable (fsync of the file or of its directory): on powerfs a later
power cut would otherwise undo it, which no bad disk does.

The choices (which segment, which byte) are drawn from a `random.Random` the nemesis seeds
from the step, so a seed picks the same ones given the same files.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import subprocess
from pathlib import Path
from typing import Any

from rlog.storage._common import fsync_dir
from rlog.storage.segment_format import (
    FRAME_HEADER,
    MARK_NAME,
    decode_mark,
    frame_header,
    segment_name,
)

REPO = Path(__file__).resolve().parent.parent
EIO_SHIM = REPO / "tests" / "eio_shim"

LOSE_SEGMENT = "lose-segment"
TRUNCATE_SEGMENT = "truncate-segment"
BIT_FLIP = "bit-flip"
DISK_FULL = "disk-full"
EIO = "eio"
DISK = (LOSE_SEGMENT, TRUNCATE_SEGMENT, BIT_FLIP, DISK_FULL, EIO)
# Kinds that damage the files of a stopped replica (restarted at the end of the hold).
STOPPED = {LOSE_SEGMENT, TRUNCATE_SEGMENT, BIT_FLIP}
# Kinds after which the target leaves the quorum and must rejoin through one: injected only
# while the other replicas hold a quorum of VOTING members (as wipes are).
NEEDS_QUORUM = STOPPED | {EIO}

# Segments small enough that a run of seconds rolls many (so there is a middle one to lose,
# and index snapshots): rlog's test-only RLOG_TEST_SEGMENT_BYTES (in the runs of odd seeds).
SEGMENT_BYTES = 4096
TMPFS_SIZE = "48m"  # each data dir's tmpfs with disk-full
# --min-free-bytes with disk-full: appends are refused only when the tmpfs is nearly full.
MIN_FREE_BYTES = 2 * 1024 * 1024
FILLER = ".jepsen-disk-full"  # the file that fills a data dir's disk, beside the engine's


class DiskFaultError(RuntimeError):
    pass


def eio_env(env: dict[str, str]) -> dict[str, str]:
    """`env` with the EIO shim switched on (its control file decides when it fails)."""
    path = os.pathsep.join(p for p in (str(EIO_SHIM), env.get("PYTHONPATH", "")) if p)
    return {**env, "RLOG_TEST_EIO": "1", "PYTHONPATH": path}


def eio_control(data_dir: Path) -> Path:
    """The file whose existence makes the shim fail the replica's writes."""
    return Path(f"{os.path.realpath(data_dir)}.eio")


def mount_tmpfs(where: Path, size: str = TMPFS_SIZE) -> None:
    """Mount a tmpfs of `size` at `where` (root needed)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise DiskFaultError(
            f"cannot mount a tmpfs at {where} (disk-full needs root): {done.stderr.strip()}"
        )


def unmount(where: Path) -> None:
    subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def fill(data_dir: Path) -> dict[str, Any]:
    """Write a file into the data dir until its file system has no space left."""
    written = 0
    chunk = bytes(1 << 20)
    fd = os.open(data_dir / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                n = os.write(fd, chunk)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[: len(chunk) // 2]  # the last bytes, smaller and smaller
                continue
            written += n
    finally:
        os.close(fd)
    st = os.statvfs(data_dir)
    return {"filled_bytes": written, "free_after": st.f_bavail * st.f_frsize}


def unfill(data_dir: Path) -> None:
    """Remove the filler: cut to nothing first (powerfs keeps a handle on a file it served
    until the kernel forgets it, so an unlink alone may free no space), then unlinked and
    the unlink synced (else a power cut on powerfs brings the file back)."""
    with contextlib.suppress(FileNotFoundError):
        os.truncate(data_dir / FILLER, 0)
        (data_dir / FILLER).unlink()
        fsync_dir(data_dir)


def _segments(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "segments").glob("*.seg"))


def _replayed_from(data_dir: Path) -> int:
    """The first segment the engine replays at open (the newest index snapshot's; 0)."""
    numbers = []
    for path in (data_dir / "segments").glob("*.idx"):
        with contextlib.suppress(ValueError):
            numbers.append(int(path.stem, 16))
    return max(numbers, default=0)


def lose_segment(data_dir: Path, rng: random.Random) -> dict[str, Any]:
    """Delete the newest segment (half the time) or one before it."""
    segments = _segments(data_dir)
    if not segments:
        return {"lost": None}
    older = segments[:-1]
    victim = segments[-1] if not older or rng.random() < 0.5 else rng.choice(older)
    victim.unlink()
    fsync_dir(victim.parent)
    return {"lost": victim.name, "segments": len(segments)}


def truncate_segment(data_dir: Path, rng: random.Random) -> dict[str, Any]:
    """Cut the newest segment to a random length short of its end."""
    segments = _segments(data_dir)
    if not segments:
        return {"cut": None}
    newest = segments[-1]
    size = newest.stat().st_size
    to = rng.randrange(size) if size else 0
    fd = os.open(newest, os.O_WRONLY)
    try:
        os.ftruncate(fd, to)
        os.fsync(fd)
    finally:
        os.close(fd)
    return {"cut": newest.name, "from_bytes": size, "to_bytes": to}


def _frames(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of each whole frame of a segment's bytes."""
    frames, off = [], 0
    while off + FRAME_HEADER.size <= len(data):
        end = off + FRAME_HEADER.size + frame_header(data, off)[0]
        if end > len(data):
            break
        frames.append((off, end))
        off = end
    return frames


def flip_byte(data_dir: Path, rng: random.Random) -> dict[str, Any]:
    """Flip one byte in the payload of a synced frame: mostly one the engine replays at open
    (from the newest index snapshot's segment on: seen at open, the frame skipped), else one
    of an older segment (seen when a record in it is read). Never the last synced frame of
    the newest segment, which the engine cannot tell from a torn write (it finds the
    segment short of the synced mark: storage lost, the case of truncate-segment)."""
    segments = _segments(data_dir)
    mark = None
    with contextlib.suppress(OSError, ValueError):
        mark = decode_mark((data_dir / "segments" / MARK_NAME).read_bytes())
    first_replayed = _replayed_from(data_dir)
    replayed: list[tuple[Path, int, int]] = []
    covered: list[tuple[Path, int, int]] = []
    for k, path in enumerate(segments):
        number = int(path.stem, 16)
        frames = _frames(path.read_bytes())
        if k == len(segments) - 1:
            synced_end = mark.end if mark is not None and mark.active == number else 0
            frames = [f for f in frames if f[1] <= synced_end][:-1]
        into = replayed if number >= first_replayed else covered
        into.extend((path, start, end) for start, end in frames)
    pool = replayed if replayed and (not covered or rng.random() < 0.75) else covered
    if not pool:
        return {"flipped": None}
    path, start, end = rng.choice(pool)
    at = rng.randrange(start + FRAME_HEADER.size, end)
    mask = rng.randrange(1, 256)
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(1)[0]
        f.seek(at)
        f.write(bytes([old ^ mask]))
        f.flush()
        os.fsync(f.fileno())
    return {
        "flipped": path.name,
        "byte": at,
        "frame": [start, end],
        "replayed_at_open": path.name >= segment_name(first_replayed),
    }


DAMAGE = {LOSE_SEGMENT: lose_segment, TRUNCATE_SEGMENT: truncate_segment, BIT_FLIP: flip_byte}
