"""The segment engine's open checks (docs/faults.md, "Lost or cut segments"): a data dir
that lacks what its synced mark and index snapshots say it holds is `StorageLost`; a
torn write (the mark never moved past it) and a lost index snapshot are not. And
`set_aside`: the damaged files kept, the dir left fresh."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlog.proto import rlog_pb2 as pb
from rlog.runtime.repair import DAMAGED_PREFIX, set_aside
from rlog.storage import WriteBatch
from rlog.storage.base import StorageLost
from rlog.storage.segment_engine import SegmentStorage
from rlog.storage.segment_format import MARK_NAME, decode_mark

SEGMENT = 4 << 10


def filled(data: Path, batches: int = 200) -> list[Path]:
    """A dir of many small segments (with index snapshots); its segments."""
    store = SegmentStorage(data, segment_bytes=SEGMENT)
    for b in range(batches):
        store.apply(
            WriteBatch(
                actions=[pb.Action(position=b + 1, type=pb.APPEND, value=b"v" * 100)],
                metadata=pb.Metadata(status=pb.VOTING, promised=b),
            )
        )
    store.close()
    return sorted((data / "segments").glob("*.seg"))


def reopen(data: Path) -> SegmentStorage:
    return SegmentStorage(data, segment_bytes=SEGMENT)


def test_the_synced_mark_names_the_newest_segment_and_its_synced_end(tmp_path: Path) -> None:
    segments = filled(tmp_path)
    mark = decode_mark((tmp_path / "segments" / MARK_NAME).read_bytes())
    assert mark.active == int(segments[-1].stem, 16)
    assert mark.end == segments[-1].stat().st_size
    store = reopen(tmp_path)  # an intact dir opens as it was
    try:
        assert store.get(200) is not None and store.metadata().promised == 199
    finally:
        store.close()


@pytest.mark.parametrize("which", ["middle", "first", "newest"])
def test_a_deleted_segment_is_storage_lost(tmp_path: Path, which: str) -> None:
    segments = filled(tmp_path)
    victim = {"middle": segments[len(segments) // 2], "first": segments[0]}.get(which, segments[-1])
    victim.unlink()
    with pytest.raises(StorageLost, match="is missing"):
        reopen(tmp_path)


def test_the_newest_segment_cut_short_is_storage_lost(tmp_path: Path) -> None:
    newest = filled(tmp_path)[-1]
    os.truncate(newest, newest.stat().st_size // 2)
    with pytest.raises(StorageLost, match="short of the"):
        reopen(tmp_path)


def test_a_corrupt_mark_is_storage_lost(tmp_path: Path) -> None:
    filled(tmp_path)
    mark = tmp_path / "segments" / MARK_NAME
    raw = bytearray(mark.read_bytes())
    raw[20] ^= 0x01
    mark.write_bytes(bytes(raw))
    with pytest.raises(StorageLost, match="synced mark"):
        reopen(tmp_path)


@pytest.mark.parametrize("how", ["deleted", "corrupted"])
def test_a_lost_index_snapshot_costs_a_full_replay(tmp_path: Path, how: str) -> None:
    filled(tmp_path)
    (snapshot,) = (tmp_path / "segments").glob("*.idx")
    if how == "deleted":
        snapshot.unlink()
    else:
        raw = bytearray(snapshot.read_bytes())
        raw[len(raw) // 2] ^= 0x01
        snapshot.write_bytes(bytes(raw))
    store = reopen(tmp_path)
    try:
        assert [a.position for a in store.scan(1, 200)] == list(range(1, 201))
    finally:
        store.close()


def test_set_aside_keeps_the_files_and_leaves_a_fresh_dir(tmp_path: Path) -> None:
    segments = filled(tmp_path)
    segments.pop(len(segments) // 2).unlink()
    with pytest.raises(StorageLost) as lost:
        reopen(tmp_path)
    aside = set_aside(tmp_path, lost.value)
    assert aside.engine == "segment" and aside.where.name.startswith(DAMAGED_PREFIX)
    kept = sorted(p.name for p in (aside.where / "segments").glob("*.seg"))
    assert kept == [p.name for p in segments]
    assert "is missing" in aside.reason and str(aside.where) in aside.reason
    store = reopen(tmp_path)
    try:
        assert store.metadata().status == pb.EMPTY and store.last_position() is None
    finally:
        store.close()


def test_an_empty_mark_from_an_interrupted_creation_is_no_mark(tmp_path: Path) -> None:
    """The mark created empty and never written (an older version, crashed or out of space
    between the two) opens as no mark: nothing lost, nothing to set aside; the mark is
    whole again after, and checks the segments as before."""
    segments = filled(tmp_path)
    mark = tmp_path / "segments" / MARK_NAME
    os.truncate(mark, 0)
    store = reopen(tmp_path)
    try:
        assert [a.position for a in store.scan(1, 200)] == list(range(1, 201))
        assert store.metadata().promised == 199
    finally:
        store.close()
    assert decode_mark(mark.read_bytes()).active == int(segments[-1].stem, 16)
    segments[-1].unlink()
    with pytest.raises(StorageLost, match="is missing"):
        reopen(tmp_path)


def test_a_mark_created_for_a_dir_without_one_is_whole(tmp_path: Path) -> None:
    """A dir without a mark (or with only the temp file of a creation a crash interrupted)
    gets a whole mark at open, the temp file gone."""
    segments = filled(tmp_path)
    mark = tmp_path / "segments" / MARK_NAME
    mark.rename(mark.with_name(MARK_NAME + ".tmp"))
    reopen(tmp_path).close()
    assert decode_mark(mark.read_bytes()).end == segments[-1].stat().st_size
    assert not list((tmp_path / "segments").glob("*.tmp"))


def test_a_short_mark_is_storage_lost(tmp_path: Path) -> None:
    """A mark is never seen shorter than whole (created whole, rewritten in place): a short
    one was damaged after it recorded something."""
    filled(tmp_path)
    os.truncate(tmp_path / "segments" / MARK_NAME, 20)
    with pytest.raises(StorageLost, match="synced mark"):
        reopen(tmp_path)
