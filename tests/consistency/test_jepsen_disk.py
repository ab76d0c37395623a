"""The disk nemeses' damage (jepsen/disk.py) on real segment data dirs: each is a fault the
segment engine sees at open (storage lost, or a damaged frame skipped), never one it takes
for a clean store; `disk` names every disk kind, and `mix` none of them."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from jepsen import disk
from jepsen.nemesis import MIX, expand
from rlog.proto import rlog_pb2 as pb
from rlog.storage import WriteBatch
from rlog.storage.base import CorruptRecord, StorageLost
from rlog.storage.segment_engine import SegmentStorage


def written(data: Path) -> None:
    """Many small segments (as the suite's replicas write them), closed like a SIGKILL
    leaves them: every batch synced."""
    store = SegmentStorage(data, segment_bytes=4096)
    meta = pb.Metadata(status=pb.VOTING, promised=3, log_id="disk")
    for first in range(1, 400, 5):
        actions = [pb.Action(position=p, value=b"v%d" % p) for p in range(first, first + 5)]
        store.apply(WriteBatch(actions=actions, metadata=meta))
    store.close()
    assert len(list((data / "segments").glob("*.seg"))) > 3


def test_disk_names_every_disk_kind_and_mix_none() -> None:
    assert expand(["disk"], partitions=False) == list(disk.DISK)
    assert not set(disk.DISK) & set(MIX)
    assert disk.NEEDS_QUORUM == {"lose-segment", "truncate-segment", "bit-flip", "eio"}


@pytest.mark.parametrize("seed", range(4))
def test_a_lost_or_cut_segment_is_storage_lost(tmp_path: Path, seed: int) -> None:
    for kind in (disk.LOSE_SEGMENT, disk.TRUNCATE_SEGMENT):
        data = tmp_path / kind
        written(data)
        done = disk.DAMAGE[kind](data, random.Random(seed))
        assert done.get("lost") or done.get("cut"), done
        with pytest.raises(StorageLost):
            SegmentStorage(data, segment_bytes=4096).close()


@pytest.mark.parametrize("seed", range(8))
def test_a_flipped_byte_is_seen(tmp_path: Path, seed: int) -> None:
    """At open (the frame skipped, reported) when the engine replays its segment; else
    when its record is read (CRC32C). Either way it is never taken for good data."""
    data = tmp_path / "data"
    written(data)
    done = disk.flip_byte(data, random.Random(seed))
    assert done["flipped"], done
    store = SegmentStorage(data, segment_bytes=4096)
    try:
        if store.damage():
            return
        assert not done["replayed_at_open"], done
        with pytest.raises(CorruptRecord):
            list(store.scan(1, 399))
    finally:
        store.close()


def test_fill_leaves_no_space_and_unfill_gives_it_back(tmp_path: Path) -> None:
    where = tmp_path / "small"
    try:
        disk.mount_tmpfs(where, "4m")
    except disk.DiskFaultError as exc:
        pytest.skip(str(exc))
    try:
        done = disk.fill(where)
        assert done["free_after"] == 0 and done["filled_bytes"] > 3 << 20
        disk.unfill(where)
        assert not (where / disk.FILLER).exists()
    finally:
        disk.unmount(where)
