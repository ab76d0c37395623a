"""rlog.state's entry format and in-memory image, without a log: encoding round trips,
refusal of unknown and corrupted entries, decisions within a batch, loading from a snapshot
whose chunks are interleaved with later diffs."""

from __future__ import annotations

import pytest

from rlog.state import CorruptEntry, UnknownFormat, Variable
from rlog.state.format import (
    NO_SNAPSHOT,
    Diff,
    Op,
    OpKind,
    SnapshotChunk,
    decode,
    encode_diff,
    snapshot_chunks,
)
from rlog.state.image import Image, Mutation


def test_a_diff_round_trips():
    diff = Diff(
        7, b"0123456789abcdef", (Op(OpKind.SET, "wörker", 3, b"\x00v"), Op(OpKind.EXPUNGE, "y"))
    )
    assert decode(encode_diff(diff), 10) == diff


def test_an_unknown_format_is_named_and_refused():
    with pytest.raises(UnknownFormat, match="position 4 has state format 104"):
        decode(b"hello", 4)
    with pytest.raises(UnknownFormat, match="position 5 is empty"):
        decode(b"", 5)


@pytest.mark.parametrize("cut", [1, 5, 20])
def test_a_damaged_entry_is_refused(cut):
    value = encode_diff(Diff(NO_SNAPSHOT, b"n" * 16, (Op(OpKind.SET, "a", 1, b"v" * 10),)))
    with pytest.raises(CorruptEntry, match="position 9 is corrupted"):
        decode(value[:-cut], 9)
    flipped = bytearray(value)
    flipped[-cut] ^= 0x40
    with pytest.raises(CorruptEntry, match="checksum"):
        decode(bytes(flipped), 9)


def test_a_batch_is_decided_in_order_and_versions_never_repeat():
    image = Image()
    results, ops = image.decide(
        [
            Mutation(OpKind.SET, "a", 0, b"first"),
            Mutation(OpKind.SET, "a", 0, b"second"),  # decided against the first: refused
            Mutation(OpKind.SET, "a", 1, b"third"),  # based on the first's version
            Mutation(OpKind.EXPUNGE, "b", 0),  # nothing to expunge
        ]
    )
    assert results == [Variable("a", b"first", 1), None, Variable("a", b"third", 2), False]
    image.apply(0, Diff(NO_SNAPSHOT, b"n" * 16, tuple(ops)), 1)
    assert image.get("a") == Variable("a", b"third", 2)
    results, ops = image.decide(
        [Mutation(OpKind.EXPUNGE, "a", 2), Mutation(OpKind.SET, "a", 0, b"new")]
    )
    assert results == [True, Variable("a", b"new", 3)]


def test_loading_from_a_snapshot_applies_the_diffs_after_it_once_complete():
    source = Image()
    for i in range(50):
        _, ops = source.decide([Mutation(OpKind.SET, f"v{i}", 0, b"x" * 40)])
        source.apply(i, Diff(NO_SNAPSHOT, b"n" * 16, tuple(ops)), 60)
    chunks = snapshot_chunks(50, NO_SNAPSHOT, source.counter, source.snapshot_items(), 500)
    assert len(chunks) > 3
    later = Diff(NO_SNAPSHOT, b"m" * 16, (Op(OpKind.SET, "v0", 51, b"after"),))
    image = Image(start=50, base_snapshot=50)
    # A diff lands between the chunks: it applies on top of the snapshot.
    image.apply(50, decode(chunks[0], 50), 0)
    image.apply(51, later, 0)
    for offset, chunk in enumerate(chunks[1:], start=52):
        assert image.loading
        image.apply(offset, decode(chunk, offset), 0)
    assert not image.loading
    assert image.snapshot == 50
    assert image.get("v0") == Variable("v0", b"after", 51)
    assert image.get("v49") == source.get("v49")
    assert image.counter == 51


def test_a_snapshot_chunk_claiming_a_later_position_is_refused():
    chunk = SnapshotChunk(30, NO_SNAPSHOT, 0, 1, 0, ())
    with pytest.raises(CorruptEntry):
        Image().apply(12, chunk, 0)


def test_an_update_is_decided_against_the_batch_so_far():
    image = Image()
    results, ops = image.decide(
        [
            Mutation(OpKind.SET, "n", 0, update=lambda v: str(int(v.value or b"0") + 1).encode()),
            Mutation(OpKind.SET, "n", 0, update=lambda v: str(int(v.value) * 10).encode()),
            Mutation(OpKind.SET, "n", 0, update=lambda v: None),  # leaves it
            Mutation(OpKind.SET, "n", 0, update=lambda v: 1 / 0),  # type: ignore[arg-type, return-value]
        ]
    )
    assert results[:3] == [Variable("n", b"1", 1), Variable("n", b"10", 2), Variable("n", b"10", 2)]
    assert isinstance(results[3], ZeroDivisionError)
    assert [op.value for op in ops] == [b"1", b"10"]
