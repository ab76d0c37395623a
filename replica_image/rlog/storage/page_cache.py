"""How much of the segments a replica keeps in the page cache behind its writes.

A segment is written once and, but for the newest entries (tailing readers, a follower a
little behind), rarely read back soon. Left alone, the page cache keeps every byte written
until memory runs short, so each new write needs pages the kernel has not handed out for a
while. On a VM that returns free memory to its host (a balloon with free page reporting, as
on the machines rlog is benchmarked on) such a page faults in the host on first touch:
copying a write into it was 56 % of a follower's CPU under a sustained 4 KiB batched load,
and three processes making synced 256 KiB appends reached 220-320 MB/s together at 3.7-4.5 ms
of system time per MB. Dropping what is synced and more than `CACHE_BEHIND` behind the write
position (POSIX_FADV_DONTNEED) frees those pages while they are still hot, and the next writes
get them back: the same appends ran at 610-800 MB/s and 0.9 ms per MB (docs/storage-engines.md,
"Page cache behind the writes").

`CacheWindow` is the bookkeeping (which byte ranges to drop, oldest first); the engine calls
`drop` on them after a synced write, when every byte written before it is on the disk (the
pages are clean, so the kernel frees them at once).
"""

from __future__ import annotations

import contextlib
import os
from collections import deque

CACHE_BEHIND = 256 << 20  # bytes of the newest segment data left cached
DROP_STEP = 4 << 20  # drop at least this much at a time (one system call per range)

_FADVISE = getattr(os, "posix_fadvise", None)  # not on macOS: the window is then advisory only


class CacheWindow:
    """Segment byte ranges written and still cached, oldest first."""

    def __init__(self, behind: int = CACHE_BEHIND, step: int = DROP_STEP) -> None:
        self.behind = behind
        self.step = step
        self._ranges: deque[list[int]] = deque()  # [segment, start, end), end exclusive
        self._bytes = 0

    @property
    def cached_bytes(self) -> int:
        """Bytes written and not yet dropped."""
        return self._bytes

    def written(self, segment: int, start: int, end: int) -> None:
        """Bytes [start, end) of `segment` were just written."""
        if end <= start:
            return
        last = self._ranges[-1] if self._ranges else None
        if last is not None and last[0] == segment and last[2] == start:
            last[2] = end
        else:
            self._ranges.append([segment, start, end])
        self._bytes += end - start

    def to_drop(self) -> list[tuple[int, int, int]]:
        """The (segment, offset, length) ranges now more than `behind` bytes behind the
        newest byte written, if they make at least `step` bytes; forgotten here once
        returned."""
        excess = self._bytes - self.behind
        if excess < self.step:
            return []
        out = []
        while excess > 0:
            segment, start, end = self._ranges[0]
            take = min(end - start, excess)
            out.append((segment, start, take))
            excess -= take
            self._bytes -= take
            if start + take == end:
                self._ranges.popleft()
            else:
                self._ranges[0][1] = start + take
        return out

    def forget(self, segment: int) -> None:
        """A segment is gone (reclaimed): nothing of it is to be dropped any more."""
        kept = deque(r for r in self._ranges if r[0] != segment)
        self._bytes -= sum(r[2] - r[1] for r in self._ranges if r[0] == segment)
        self._ranges = kept


def drop(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to drop a file's clean cached pages in [offset, offset + length)
    (advice: an error changes nothing that matters, so none is raised)."""
    if _FADVISE is not None:
        with contextlib.suppress(OSError):
            _FADVISE(fd, offset, length, os.POSIX_FADV_DONTNEED)
