"""The segment engine's index snapshots (rlog/storage/segment_engine.py): a restart loads
the newest snapshot and replays only the segments written since, and arrives at the same
state as a full replay and as a model store that never restarts, through random batches of
runs, actions, partial overwrites (which delete and split records), truncations and
reclaimed segments; a snapshot that fails its check is ignored, and one whose segment was
never created (a crash between the two) is removed, so the frames written after it are
never skipped."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from rlog import packed
from rlog.proto import rlog_pb2 as pb
from rlog.storage import Storage, WriteBatch, open_storage
from rlog.storage.segment_engine import SegmentStorage
from rlog.storage.segment_format import decode_snapshot, encode_snapshot

SEGMENT = 16 << 10  # small segments: a roll (and a snapshot) every few batches


def state(store: Storage) -> tuple[pb.Metadata, list[bytes]]:
    """Everything a reader sees: the metadata and every position's action."""
    actions = [a.SerializeToString() for a in store.scan(0, 2**64 - 2)]
    return store.metadata(), actions


def run(first: int, count: int, tag: str) -> pb.Run:
    data, offsets = packed.pack([f"{tag}:{p}".encode() * 20 for p in range(first, first + count)])
    head = pb.Action(type=pb.APPEND, performed=1, origin_proposal=1)
    return packed.make_run(first, head, data, offsets)


def random_batch(rng: random.Random, end: int, begin: int, step: int) -> tuple[WriteBatch, int]:
    """A batch of new runs at the end, overwrites of runs' parts, an action or a cut."""
    kind = rng.random()
    if kind < 0.55 or end - begin < 10:
        count = rng.randint(1, 40)
        return WriteBatch(runs=[run(end, count, f"n{step}")], sync=rng.random() < 0.7), end + count
    if kind < 0.8:  # rewrite the middle of stored runs: their records are split and deleted
        first = rng.randint(begin, end - 2)
        count = rng.randint(1, min(30, end - first))
        return WriteBatch(runs=[run(first, count, f"o{step}")]), end
    if kind < 0.92:
        position = rng.randint(begin, end - 1)
        action = pb.Action(position=position, type=pb.APPEND, value=b"a%d" % step, learned=True)
        return WriteBatch(actions=[action]), end
    cut = rng.randint(begin, begin + (end - begin) // 3)
    meta = pb.Metadata(status=pb.VOTING, log_id="snap", promised=step, begin=cut)
    return WriteBatch(delete_below=cut, metadata=meta), end


@pytest.mark.parametrize(("seed", "ratio"), [(1, 4), (2, 4), (3, 60), (4, 60)])
def test_restarts_from_snapshots_see_what_a_full_replay_and_a_model_see(
    tmp_path: Path, seed: int, ratio: int
) -> None:
    """`ratio` 60: snapshots far apart, so several segments (some of them reclaimable)
    lie between the newest snapshot and the active segment."""
    rng = random.Random(seed)
    data_dir = tmp_path / "data"

    def reopen() -> SegmentStorage:
        return SegmentStorage(data_dir, segment_bytes=SEGMENT, snapshot_ratio=ratio)

    store = reopen()
    model = open_storage(tmp_path / "model", "memory")
    end, begin, restarts, snapshots_seen = 1, 0, 0, set()
    for step in range(400):
        batch, end = random_batch(rng, end, begin, step)
        if batch.delete_below is not None:
            begin = batch.delete_below
        store.apply(batch)
        model.apply(batch)
        snapshots_seen |= {p.name for p in (data_dir / "segments").glob("*.idx")}
        if rng.random() < 0.08:
            store.close()
            store = reopen()
            restarts += 1
            assert state(store) == state(model), f"after restart {restarts} at step {step}"
    store.close()
    assert restarts >= 10 and len(snapshots_seen) >= 5  # the scenario did what it says
    segments = sorted((data_dir / "segments").glob("*.seg"))
    assert len(segments) < 40, "dead segments were never reclaimed"
    reopened = reopen()
    from_snapshot = state(reopened)
    reopened.close()
    for snapshot in (data_dir / "segments").glob("*.idx"):
        snapshot.unlink()  # a full replay of every segment left
    replayed = reopen()
    try:
        assert state(replayed) == from_snapshot == state(model)
    finally:
        replayed.close()


def test_a_snapshot_that_fails_its_check_is_ignored(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    store = SegmentStorage(data_dir, segment_bytes=SEGMENT)
    for k in range(60):
        store.apply(WriteBatch(runs=[run(1 + 10 * k, 10, "v")]))
    expected = state(store)
    store.close()
    (snapshot,) = (data_dir / "segments").glob("*.idx")
    raw = bytearray(snapshot.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    snapshot.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="fails its CRC"):
        decode_snapshot(bytes(raw))
    store = SegmentStorage(data_dir, segment_bytes=SEGMENT)  # every segment replayed
    try:
        assert state(store) == expected
    finally:
        store.close()


def test_a_snapshot_whose_segment_never_came_is_removed(tmp_path: Path) -> None:
    """A crash after a snapshot was renamed into place but before its segment was created:
    the segment before it stays the newest and takes more frames, which the snapshot does
    not describe. Opening must not trust it."""
    data_dir = tmp_path / "data"
    store = SegmentStorage(data_dir, segment_bytes=1 << 30)  # one segment, no roll
    for k in range(20):
        store.apply(WriteBatch(runs=[run(1 + 10 * k, 10, "v")]))
    (segment,) = (data_dir / "segments").glob("*.seg")
    newest = int(segment.stem, 16)
    # What the crash left: the snapshot of the next segment, durable, and no such segment.
    stale = encode_snapshot(newest + 1, store._meta, store._begin, store._index)
    (data_dir / "segments" / f"{newest + 1:016x}.idx").write_bytes(stale)
    store.close()
    store = SegmentStorage(data_dir, segment_bytes=1 << 30)
    store.apply(WriteBatch(runs=[run(201, 10, "after")]))  # into the old newest segment
    expected = state(store)
    store.close()
    store = SegmentStorage(data_dir, segment_bytes=1 << 30)
    try:
        assert state(store) == expected
        assert store.scan(201, 201).__next__().value == b"after:201" * 20
        assert not list((data_dir / "segments").glob("*.idx"))
    finally:
        store.close()


def test_segments_written_after_a_snapshot_are_kept_until_the_next_one(tmp_path: Path) -> None:
    """A record the snapshot lists, deleted later by a frame whose segment then died: were
    that segment reclaimed, a restart from the snapshot would never see the deletion (the
    record back, or its segment missing). Segments from the snapshot on stay until the next
    snapshot."""
    data_dir = tmp_path / "data"
    # segment_bytes 1: every batch starts a segment of its own
    store = SegmentStorage(data_dir, segment_bytes=1, snapshot_ratio=1)
    store.apply(WriteBatch(runs=[run(5, 10, "old")]))  # key 5, in its own segment
    store.apply(WriteBatch(runs=[run(100, 5, "filler")]))  # the roll before it: a snapshot
    assert list((data_dir / "segments").glob("*.idx"))
    store._snapshot_ratio = 10**9  # no snapshot from here on
    store.apply(WriteBatch(runs=[run(1, 20, "cover")]))  # deletes key 5, puts key 1
    store.apply(WriteBatch(runs=[run(1, 20, "again")]))  # key 1 again: "cover" is dead
    store.apply(WriteBatch(runs=[run(200, 1, "sync")], sync=True))  # reclaims what is dead
    expected = state(store)
    store.close()
    store = SegmentStorage(data_dir, segment_bytes=1, snapshot_ratio=10**9)
    try:
        assert state(store) == expected
        assert [a.position for a in store.scan(1, 30)] == list(range(1, 21))
    finally:
        store.close()
