"""How a replica's C allocator treats large buffers: kept in the heap, not mapped per use.

A batch on the data path is one large buffer copied a few times over (gRPC's receive
buffer, protobuf's message, the record, the storage engine's pages), every copy a fresh
allocation of up to megabytes. glibc serves an allocation above its mmap threshold with a
new mapping and unmaps it on free, and trims the top of the heap once enough of it is
free; either way the next buffer starts on pages the kernel must fault in and zero again.
Under a batched write load that was 1.6 minor page faults per 1 KiB entry over the three
replicas (6 KiB of fresh pages per KiB appended, at about 3.5 µs a page on the VMs this is
built on); raising the two thresholds keeps those pages in the heap for the next buffer,
and took a quarter off the replicas' CPU per entry (docs/performance.md, "What each
change bought").

The cost is memory held after a burst: up to `TRIM_THRESHOLD` bytes free at the top of each
heap before glibc gives it back. A replica's RSS stays bounded (bench/soak.py reports it).

Set either `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` in the environment to keep
glibc's own settings (or choose others): the replica then leaves the allocator alone.
Other C libraries (musl, macOS) are left alone too.

`heap()` says how much of the C heap is in use and how much is free but kept: after a burst,
a replica's RSS is mostly the latter (a flood of 4 MiB appends left 85-254 MiB free in the
heap at the peak; docs/testing.md), which is not a leak, and the metric
`rlog_heap_bytes{state}` tells the two apart.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD = 32 << 20  # glibc's largest dynamic threshold: a whole batch fits under it
TRIM_THRESHOLD = 64 << 20
OVERRIDE_ENV = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@functools.cache  # once per process: `rlog replica` reaches it from the CLI and the server
def keep_large_buffers() -> str:
    """Tune glibc so large buffers are reused from the heap; says what was done (for the
    log)."""
    if any(name in os.environ for name in OVERRIDE_ENV):
        return "allocator: left to the environment's MALLOC_* settings"
    if os.uname().sysname != "Linux":
        return "allocator: left alone (not Linux)"
    try:
        # The C library the interpreter runs on (its symbols are the process's own):
        # no ldconfig subprocess at start, as ctypes.util.find_library would run.
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        gnu_get_libc_version = libc.gnu_get_libc_version  # only glibc has it
    except (OSError, AttributeError):
        return "allocator: left alone (not glibc)"
    gnu_get_libc_version.restype = ctypes.c_char_p
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    version = gnu_get_libc_version().decode()
    if not ok:
        return f"allocator: glibc {version} refused the thresholds; left at its own"
    return (
        f"allocator: glibc {version}, buffers up to {MMAP_THRESHOLD >> 20} MiB from the heap, "
        f"trimmed above {TRIM_THRESHOLD >> 20} MiB free"
    )


@dataclass(frozen=True)
class Heap:
    """The C allocator's totals over all its arenas, in bytes."""

    in_use: int  # handed out by malloc, mapped buffers included
    free: int  # free in the heap, kept for the next allocations (not given back)


class _MallInfo2(ctypes.Structure):  # glibc's struct mallinfo2 (malloc.h, glibc 2.33+)
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",  # bytes the heap has from the kernel (sbrk and arenas)
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",  # bytes in mapped buffers
            "usmblks",
            "fsmblks",
            "uordblks",  # bytes in use in the heap
            "fordblks",  # bytes free in the heap
            "keepcost",
        )
    ]


@functools.cache
def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


def heap() -> Heap | None:
    """What the C heap holds now (None where the C library cannot say: not glibc 2.33+).
    It walks the allocator's free lists under its locks: for a scrape, not for every call."""
    mallinfo2 = _mallinfo2()
    if mallinfo2 is None:
        return None
    info = mallinfo2()
    return Heap(in_use=info.uordblks + info.hblkhd, free=info.fordblks)
