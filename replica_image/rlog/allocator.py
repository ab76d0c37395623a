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
"""

from __future__ import annotations

import ctypes
import functools
import os

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
