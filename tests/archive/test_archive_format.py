"""The archive's pure parts: segment encoding and its checks, the manifest's consistency
rules, retention, and the records a restore writes for a segment."""

from __future__ import annotations

import pytest

from rlog import packed
from rlog.archive.archiver import Retention
from rlog.archive.format import (
    ArchiveError,
    CorruptSegment,
    Manifest,
    SegmentInfo,
    decode_segment,
    encode_segment,
    sha256,
)
from rlog.archive.restore import _batch
from rlog.proto import rlog_pb2 as pb


def run(first: int, *values: bytes) -> pb.Run:
    data, offsets = packed.pack(list(values))
    return pb.Run(first=first, data=data, offsets=offsets)


def info_of(body: bytes, first: int, last: int, entries: int) -> SegmentInfo:
    return SegmentInfo(
        SegmentInfo.key_for(first, last), first, last, entries, len(body), sha256(body), 0.0
    )


def test_segment_round_trip():
    runs = [run(3, b"a", b"bb"), run(7, b"c")]
    body = encode_segment(runs)
    decoded = decode_segment(body, info_of(body, 2, 9, 3), "x")
    assert [(r.first, packed.values_of(r.data, r.offsets)) for r in decoded] == [
        (3, [b"a", b"bb"]),
        (7, [b"c"]),
    ]


@pytest.mark.parametrize("flip", [0, 5, 12, -1])
def test_any_flipped_byte_is_refused(flip):
    body = bytearray(encode_segment([run(1, b"hello", b"world")]))
    info = info_of(bytes(body), 1, 2, 2)
    body[flip] ^= 0x40
    with pytest.raises(CorruptSegment, match="fails its checksum"):
        decode_segment(bytes(body), info, "s3://b/p/segments/x")


def test_a_segment_whose_runs_leave_its_range_is_refused_even_with_a_good_checksum():
    body = encode_segment([run(5, b"a", b"b")])
    with pytest.raises(CorruptSegment, match="outside"):
        decode_segment(body, info_of(body, 1, 5, 2), "x")
    truncated = body[:-1]
    with pytest.raises(CorruptSegment, match="bytes, the manifest says"):
        decode_segment(truncated, info_of(body, 1, 9, 2), "x")


def test_manifest_round_trip_and_contiguity():
    m = Manifest(log_id="L", begin=0)
    m.segments = [
        SegmentInfo("k1", 0, 9, 5, 10, "h", 1.0),
        SegmentInfo("k2", 10, 19, 5, 10, "h", 2.0),
    ]
    m.archived_through = 19
    again = Manifest.from_json(m.to_json(), "x")
    assert again == m and again.next_position == 20
    m.segments[1].first = 11
    with pytest.raises(ArchiveError, match="expected one starting at 10"):
        Manifest.from_json(m.to_json(), "x")
    with pytest.raises(ArchiveError, match="format version 9"):
        Manifest.from_json(m.to_json().replace(b'"format": 1', b'"format": 9'), "x")
    with pytest.raises(ArchiveError, match="not an rlog archive manifest"):
        Manifest.from_json(b"{}", "x")


def test_retention_cuts_a_prefix_and_keeps_the_newest():
    segs = [SegmentInfo(f"k{i}", i * 10, i * 10 + 9, 1, 1, "h", 0.0, i * 50.0) for i in range(4)]
    m = Manifest("log", 0, 39, segs)
    assert Retention(keep_from=25).expired(m, 150.0, 100) == segs[:2]
    assert Retention(max_age=98.5).expired(m, 150.0, 100) == segs[:2]
    assert Retention(max_age=0.1).expired(m, 150.0, 100) == segs[:3]  # never the last
    assert Retention().expired(m, 150.0, 100) == []


def test_restore_records_keep_positions_with_learned_nops_in_the_gaps():
    batch = _batch([run(3, b"a", b"b"), run(8, b"c", b"d", b"e")], 1, 9)
    nops = [a.position for a in batch.actions]
    assert nops == [1, 2, 5, 6, 7]
    assert all(a.type == pb.NOP and a.learned for a in batch.actions)
    assert [(r.first, packed.run_last(r)) for r in batch.runs] == [(3, 4), (8, 9)]
    assert all(r.head.type == pb.APPEND and r.head.learned for r in batch.runs)
    clipped = _batch([run(3, b"a", b"b"), run(8, b"c", b"d", b"e")], 1, 8)  # PITR at 8
    assert [(r.first, packed.run_last(r)) for r in clipped.runs] == [(3, 4), (8, 8)]
