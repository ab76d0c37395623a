"""How the segment engine cuts a frame into write calls (`write_calls`): the bytes are the
frame's, in order; no call holds more than a piece's bytes or more buffers than writev
takes; and a store written that way reads back and reopens."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rlog.proto import rlog_pb2 as pb
from rlog.storage.base import WriteBatch
from rlog.storage.segment_engine import SegmentStorage
from rlog.storage.segment_format import WRITE_PIECE, write_calls

parts_of = st.lists(st.binary(min_size=0, max_size=300), max_size=40)


@given(parts=parts_of, piece=st.integers(1, 700), iov_max=st.integers(1, 9))
@settings(max_examples=400, deadline=None)
def test_write_calls_keep_the_bytes_and_the_limits(
    parts: list[bytes], piece: int, iov_max: int
) -> None:
    calls = list(write_calls(parts, piece, iov_max))
    assert b"".join(bytes(b) for call in calls for b in call) == b"".join(parts)
    for call in calls:
        assert call, "an empty call"
        assert 0 < sum(map(len, call)) <= piece
        assert len(call) <= iov_max
    # Only the last call may be short of both limits: the others are full on one of them.
    for call in calls[:-1]:
        assert sum(map(len, call)) == piece or len(call) == iov_max


def test_a_large_part_is_sliced_without_copies() -> None:
    big = bytes(range(256)) * (3 * WRITE_PIECE // 256 + 7)
    calls = list(write_calls([b"head", big, b"tail"]))
    assert [sum(map(len, call)) for call in calls[:3]] == [WRITE_PIECE] * 3
    sliced = [b for call in calls for b in call if isinstance(b, memoryview)]
    assert sliced and all(view.obj is big for view in sliced)


def test_a_frame_of_several_pieces_reads_back_and_reopens(tmp_path: Path) -> None:
    # 40 records of 100 KiB in one batch: one frame of about 4 MiB, written in 4+ calls.
    values = [bytes([i]) * (100 << 10) for i in range(40)]
    store = SegmentStorage(tmp_path)
    actions = [
        pb.Action(position=i + 1, type=pb.APPEND, value=v, learned=True)
        for i, v in enumerate(values)
    ]
    store.apply(WriteBatch(actions=actions))
    assert [a.value for a in store.scan(1, 40)] == values
    store.close()
    again = SegmentStorage(tmp_path)
    assert [a.value for a in again.scan(1, 40)] == values
    again.close()
