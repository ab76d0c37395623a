"""The segment engine keeps only the newest `cache_behind` bytes it wrote in the page cache
(rlog/storage/page_cache.py): the window's bookkeeping, and the real page cache of real
segment files, read with util-linux's `fincore`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rlog.proto import rlog_pb2 as pb
from rlog.storage import WriteBatch
from rlog.storage.page_cache import CacheWindow
from rlog.storage.segment_engine import SegmentStorage


def test_the_window_drops_the_oldest_bytes_past_its_size_in_steps() -> None:
    window = CacheWindow(behind=100, step=10)
    window.written(0, 0, 60)
    window.written(0, 60, 105)  # contiguous: one range
    assert window.to_drop() == []  # 5 past the window: less than a step
    window.written(1, 0, 20)  # a new segment
    assert window.to_drop() == [(0, 0, 25)]
    assert window.cached_bytes == 100
    window.written(1, 20, 120)
    assert window.to_drop() == [(0, 25, 80), (1, 0, 20)]  # across segments, oldest first
    assert window.cached_bytes == 100
    window.forget(1)  # reclaimed: its ranges are not dropped, nor counted
    assert window.cached_bytes == 0 and window.to_drop() == []


def _cached_bytes(path: Path) -> int:
    out = subprocess.run(
        ["fincore", "--bytes", "--raw", "--noheadings", "--output", "RES", str(path)],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(out.stdout.split()[0])


@pytest.mark.skipif(shutil.which("fincore") is None, reason="needs util-linux's fincore")
def test_synced_segment_bytes_past_the_window_leave_the_page_cache(tmp_path: Path) -> None:
    mib = 1 << 20
    store = SegmentStorage(tmp_path / "data", segment_bytes=16 * mib, cache_behind=8 * mib)
    value = b"v" * (256 << 10)
    try:
        # 40 MiB in unsynced batches: all of it stays cached (dropping needs clean pages).
        for p in range(160):
            store.apply(WriteBatch(actions=[pb.Action(position=p, value=value)], sync=False))
        segments = sorted((tmp_path / "data" / "segments").glob("*.seg"))
        newest = segments[-1]
        assert len(segments) >= 3
        older_cached = sum(_cached_bytes(s) for s in segments[:-1])
        assert older_cached > 16 * mib
        # One synced batch: everything but the newest ~8 MiB written is dropped.
        store.apply(WriteBatch(actions=[pb.Action(position=160, value=value)]))
        cached = sum(_cached_bytes(s) for s in segments)
        assert 4 * mib <= cached <= 8 * mib + (4 << 20) + (1 << 16), cached
        assert _cached_bytes(newest) > 0
        # What left the cache still reads back, from the disk.
        got = store.get(0)
        assert got is not None and got.value == value
    finally:
        store.close()
