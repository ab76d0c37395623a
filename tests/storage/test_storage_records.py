"""The record codec and the split/clip planning the disk engines share (pure code, no disk)."""

from __future__ import annotations

from engines import run

from rlog import packed
from rlog.proto import rlog_pb2 as pb
from rlog.storage.base import WriteBatch
from rlog.storage.records import Overlay, decode, encode, normalize, raw_last, spans


def test_codec_round_trip_and_format_1_and_2_records() -> None:
    r = run(10, 5, epoch=3)
    a = pb.Action(position=7, type=pb.APPEND, value=b"x", performed=2)
    assert decode(10, encode(r)) == r and decode(7, encode(a)) == a
    # Format 3 (with a CRC32C): tags 0x04 (run) and 0x03 (action).
    assert encode(r)[0] == 0x04 and encode(a)[0] == 0x03
    assert raw_last(10, encode(r)) == 14 and raw_last(7, encode(a)) == 7
    # Format 2 (no CRC): 0x02 + last + Run, 0x01 + Action; still read as they are.
    assert decode(10, b"\x02" + (14).to_bytes(8, "big") + r.SerializeToString()) == r
    assert decode(7, b"\x01" + a.SerializeToString()) == a
    assert raw_last(10, b"\x02" + (14).to_bytes(8, "big") + r.SerializeToString()) == 14
    # Format 1 stored the Action's bytes untagged; an all-default Action is zero bytes.
    assert decode(7, a.SerializeToString()) == a
    assert decode(0, b"") == pb.Action()
    assert raw_last(7, a.SerializeToString()) == 7


def test_normalize_drops_and_clips_below_the_cut() -> None:
    batch = WriteBatch(
        delete_below=5,
        runs=[run(0, 3), run(3, 4), pb.Run(first=9)],  # below, straddling, empty
        actions=[pb.Action(position=4), pb.Action(position=5)],
    )
    cut, records = normalize(batch)
    assert cut == 5
    assert records == [packed.clip(run(3, 4), 5, 6), pb.Action(position=5)]


def test_spans_merge_overlapping_and_adjacent_ranges() -> None:
    records = [run(10, 5), pb.Action(position=15), pb.Action(position=30), run(12, 2)]
    assert spans(records) == [(10, 15), (30, 30)]


def test_overlay_splits_and_clips() -> None:
    overlay = Overlay()
    stored = run(10, 64)
    overlay.load(10, stored)
    overlay.load(100, pb.Action(position=100))
    overlay.cut(12)
    overlay.put(pb.Action(position=20, value=b"a"))
    overlay.put(run(70, 40, b"n"))  # over the run's tail and the action at 100
    deletes, puts = overlay.changes()
    assert deletes == [100]  # 10 is below the cut: the engine's range delete takes it
    assert puts == [
        (12, packed.clip(stored, 12, 19)),
        (20, pb.Action(position=20, value=b"a")),
        (21, packed.clip(stored, 21, 69)),
        (70, run(70, 40, b"n")),
    ]
