"""A replica keeps large buffers in the C heap (rlog/allocator.py): a buffer of a batch's size
freed and allocated again reuses pages instead of faulting in fresh ones. Each case runs in a
child process, so the test process keeps glibc's own settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPLICA_IMAGE = Path(__file__).resolve().parents[2] / "replica_image"

# A data path's pattern: buffers of about a batch's size (1-1.6 MiB), two alive at a time
# (a message and its copy), freed and made again, 200 times.
CHILD = """
import resource, sys
from rlog import allocator
if sys.argv[1] == "keep":
    print(allocator.keep_large_buffers())
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for i in range(200):
    first = b"x" * ((1 << 20) + (i % 7) * 100_000)
    copy = first + b"y"
    del first, copy
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _glibc() -> bool:
    try:
        return sys.platform == "linux" and bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):  # a C library without the name (musl)
        return False


glibc_only = pytest.mark.skipif(not _glibc(), reason="the thresholds are glibc's")


def run_child(mode: str, child: str = CHILD, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run(
        [sys.executable, "-c", child, mode],
        capture_output=True,
        text=True,
        check=True,
        env={**clean, "PYTHONPATH": str(REPLICA_IMAGE), **env},
        timeout=60,
    )
    return out.stdout.split("\n")[:-1]


@glibc_only
def test_large_buffers_reuse_heap_pages() -> None:
    (plain_faults,) = run_child("plain")
    said, kept_faults = run_child("keep")
    assert said.startswith("allocator: glibc "), said
    # Each fresh 1-1.6 MiB buffer is 250-400 pages to fault in; kept buffers fault only
    # where the heap grows. Measured: 26,000 faults against 800.
    assert int(kept_faults) * 5 < int(plain_faults), (plain_faults, kept_faults)


@glibc_only
def test_the_environment_settings_win() -> None:
    said, faults = run_child("keep", MALLOC_MMAP_THRESHOLD_="131072")
    assert said == "allocator: left to the environment's MALLOC_* settings"
    assert int(faults) > 0


# A 20 MiB buffer (under the kept-buffer threshold of 32 MiB) made and freed: `heap()` sees
# it in use, then free but kept in the heap (tuned) or given back at once (glibc's own
# settings map a buffer that large and unmap it on free).
HEAP_CHILD = """
import sys
from rlog import allocator
if sys.argv[1] == "keep":
    allocator.keep_large_buffers()
before = allocator.heap()
buffer = bytearray(20 << 20)
held = allocator.heap()
del buffer
after = allocator.heap()
print(held.in_use - before.in_use, after.free - before.free)
"""


@glibc_only
def test_the_heap_says_what_is_in_use_and_what_is_kept_free() -> None:
    def run(mode: str) -> tuple[int, int]:
        (line,) = run_child(mode, HEAP_CHILD)
        in_use, kept = line.split()
        return int(in_use), int(kept)

    in_use, kept = run("keep")
    assert in_use >= 20 << 20 and kept >= 20 << 20, (in_use, kept)
    in_use, kept = run("plain")
    assert in_use >= 20 << 20 and kept < 1 << 20, (in_use, kept)
