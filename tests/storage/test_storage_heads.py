"""`Storage.scan_heads`: what bookkeeping reads of the log (the learned ranges, the admission
state) without a run's values, engine by engine, on real files.

Every engine yields exactly the heads `scan_records` would give (a run as its RunHead, an
action as it is, clipped alike), for runs small and large, runs at position 0, actions and
ranges that cut records. The segment engine reads only a run's first bytes: its values are
never read (a flipped byte among them does not stop a heads scan, while every read of the
values still raises CorruptRecord), and a beginning that does not add up (a flipped last
position in the header, a cut head) is read whole and judged by its checksum.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from engines import RUN_ENGINES, run

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import AdmissionState
from rlog.protocol.replica import ReplicaCore
from rlog.storage import Storage, WriteBatch, open_storage
from rlog.storage.base import CorruptRecord, RunHead, head_of
from rlog.storage.records import HEAD_BYTES

BIG = b"V" * 3000  # values of runs far longer than HEAD_BYTES


def _big_run(first: int, count: int, **head: object) -> pb.Run:
    r = run(first, count, b"big", **head)
    data = b"".join(BIG + b"%d" % p for p in range(first, first + count))
    sizes = [len(BIG + b"%d" % p) for p in range(first, first + count)]
    offsets = [0]
    for size in sizes:
        offsets.append(offsets[-1] + size)
    r.data = data
    r.offsets = b"".join(o.to_bytes(4, "little") for o in offsets)
    return r


def _fill(store: Storage) -> None:
    store.apply(
        WriteBatch(
            runs=[
                run(0, 3, b"z", epoch=1),  # first = 0: field 1 is absent from its message
                _big_run(10, 20, epoch=2, session=7, sequence=3, performed=5),
                run(40, 5, b"s", epoch=2, performed=6),
                _big_run(100, 4, epoch=3, origin_proposal=9, origin_leader=2),
            ],
            actions=[
                pb.Action(position=5, type=pb.SESSION, epoch=1, performed=5),
                pb.Action(position=50, type=pb.APPEND, value=BIG, epoch=2),
                pb.Action(position=51, type=pb.EPOCH, epoch=3),
            ],
            metadata=pb.Metadata(status=pb.VOTING, promised=7, log_id="heads"),
        )
    )


@pytest.fixture(params=RUN_ENGINES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Storage]:
    opened = open_storage(tmp_path / "data", str(request.param))
    try:
        _fill(opened)
        yield opened
    finally:
        opened.close()


RANGES = [(0, 2**64 - 2), (0, 0), (1, 2), (11, 12), (10, 29), (15, 45), (29, 100), (102, 200)]


@pytest.mark.parametrize(("first", "last"), RANGES)
def test_heads_are_the_heads_of_the_records(store: Storage, first: int, last: int) -> None:
    expected = [head_of(r) for r in store.scan_records(first, last)]
    assert expected, "every range holds something"
    assert list(store.scan_heads(first, last)) == expected


def test_heads_after_reopening(tmp_path: Path) -> None:
    """The segment engine's heads come from its files (its index rebuilt on open)."""
    store = open_storage(tmp_path / "data", "segment")
    _fill(store)
    store.close()
    store = open_storage(tmp_path / "data", "segment")
    try:
        heads = list(store.scan_heads(0, 2**64 - 2))
        assert heads == [head_of(r) for r in store.scan_records(0, 2**64 - 2)]
        big = [h for h in heads if isinstance(h, RunHead) and h.first == 10]
        assert big == [
            RunHead(10, 29, pb.Action(type=pb.APPEND, epoch=2, session=7, sequence=3, performed=5))
        ]
    finally:
        store.close()


def _segment_bytes(data: Path) -> list[Path]:
    return sorted((data / "segments").glob("*.seg"))


def _patch(data: Path, find: bytes, offset: int, byte: int) -> None:
    """Set the byte `offset` after the first occurrence of `find` in the segment files."""
    for path in _segment_bytes(data):
        at = path.read_bytes().find(find)
        if at >= 0:
            with path.open("r+b") as out:  # in place: the open store reads this file
                out.seek(at + offset)
                out.write(bytes([byte]))
            return
    raise AssertionError(f"{find!r} is not in the segment files")


def test_a_heads_scan_never_reads_the_values(tmp_path: Path) -> None:
    """A byte flipped among a big run's values after it was written (the store open, as a
    failing disk does it): reads of the values fail (the checksum), a scan of heads does not
    read them and answers."""
    data = tmp_path / "data"
    store = open_storage(data, "segment")
    try:
        _fill(store)
        assert list(store.scan_records(10, 29))
        _patch(data, BIG + b"10", len(BIG) // 2, ord("X"))
        with pytest.raises(CorruptRecord):
            list(store.scan_records(10, 29))
        heads = list(store.scan_heads(10, 29))
        assert [(h.first, h.last) for h in heads if isinstance(h, RunHead)] == [(10, 29)]
    finally:
        store.close()


def test_a_last_position_that_does_not_add_up_is_read_whole(tmp_path: Path) -> None:
    """The header's last position is checked against the message's layout; a flipped one
    sends the scan to the whole record, whose checksum fails."""
    data = tmp_path / "data"
    store = open_storage(data, "segment")
    try:
        _fill(store)
        # The run at 10 is stored as tag 0x04, last (8 bytes, big-endian: 29), CRC, message.
        header = bytes([0x04]) + (29).to_bytes(8, "big")
        _patch(data, header, 8, 28)  # last 29 -> 28
        with pytest.raises(CorruptRecord):
            list(store.scan_heads(10, 29))
        expected = [head_of(r) for r in store.scan_records(40, 44)]
        assert list(store.scan_heads(40, 44)) == expected
    finally:
        store.close()


def test_a_head_longer_than_the_bytes_read_is_read_whole(tmp_path: Path) -> None:
    """No rlog head is this long, but a record whose head does not fit in the bytes read
    first is still read correctly (whole)."""
    store = open_storage(tmp_path / "data", "segment")
    try:
        long_head = _big_run(200, 3, epoch=4)
        long_head.head.value = b"H" * (2 * HEAD_BYTES)  # a head field no run head sets
        store.apply(WriteBatch(runs=[long_head]))
        assert list(store.scan_heads(200, 202)) == [RunHead(200, 202, long_head.head)]
    finally:
        store.close()


def test_learned_heads_feed_the_admission_state_as_the_records_do(tmp_path: Path) -> None:
    """The admission state applied from learned heads is the one applied from the learned
    records, position by position (a session's answers, the epoch, a SESSION entry)."""
    store = open_storage(tmp_path / "data", "segment")
    try:
        store.apply(
            WriteBatch(
                actions=[pb.Action(position=1, type=pb.SESSION, epoch=1)],
                runs=[
                    _big_run(2, 30, epoch=1, session=1, sequence=1),
                    run(32, 4, epoch=2, session=1, sequence=2),
                ],
                metadata=pb.Metadata(status=pb.VOTING, learned_below=36, log_id="heads"),
            )
        )
        core = ReplicaCore(store)
        from_records, from_heads = AdmissionState(100, 1), AdmissionState(100, 1)
        for record in core.learned_records(1, 35, 1000):
            from_records.apply_record(record)
        heads = core.learned_heads(1, 35, 1000)
        assert [type(h).__name__ for h in heads] == ["Action", "RunHead", "RunHead"]
        for head in heads:
            from_heads.apply_record(head)
        assert (from_heads.next_position, from_heads.epoch) == (36, 2)
        assert from_heads.sessions[1].answers == {1: (2, 30), 2: (32, 4)}
        assert (from_heads.next_position, from_heads.epoch) == (
            from_records.next_position,
            from_records.epoch,
        )
        assert from_heads.sessions[1].answers == from_records.sessions[1].answers
        # a limit cuts a run head as it cuts the run
        assert core.learned_heads(1, 35, 10)[-1] == RunHead(2, 10, heads[1].head)  # type: ignore[union-attr]
    finally:
        store.close()


def test_a_write_after_a_big_run_does_not_read_that_run(tmp_path: Path) -> None:
    """Every write asks whether the record before it reaches into its positions; the segment
    engine answers from that record's header, and reads a record whole only when it does
    reach (a write inside a stored run, which splits it)."""
    store = open_storage(tmp_path / "data", "segment")
    try:
        store.apply(WriteBatch(runs=[_big_run(0, 40)]))
        whole_reads: list[int] = []
        floor = store._floor  # type: ignore[attr-defined]

        def counted(position: int) -> tuple[int, bytes] | None:
            found = floor(position)
            whole_reads.append(len(found[1]) if found else 0)
            return found

        store._floor = counted  # type: ignore[attr-defined]
        store.apply(WriteBatch(runs=[_big_run(40, 40)]))
        assert whole_reads == []
        # A write inside the stored run splits it: that one is read whole.
        store.apply(WriteBatch(actions=[pb.Action(position=60, type=pb.APPEND, value=b"x")]))
        assert len(whole_reads) == 1 and whole_reads[0] > 40 * len(BIG)
        assert [head_of(r) for r in store.scan_records(0, 79)] == list(store.scan_heads(0, 79))
        assert store.get(60) is not None and store.get(60).value == b"x"  # type: ignore[union-attr]
        assert store.get(61) is not None and store.get(61).value == BIG + b"61"  # type: ignore[union-attr]
    finally:
        store.close()
