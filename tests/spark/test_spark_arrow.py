"""The Spark source's and sink's Arrow paths over packed values, without a SparkSession: the
source's record batches built from runs, the sink's chunks cut and packed from Arrow value
columns (the same cut as `rlog.client.batched`), against a real log where it matters."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from rlog import packed
from rlog.client import Client, batched
from rlog.client.errors import InvalidArgument
from rlog.proto import rlog_pb2 as pb
from rlog.spark import sink, wait_learned
from rlog.spark.markers import MARKER_MAGIC, encode_marker
from rlog.spark.source import ARROW_SCHEMA, read_range, to_arrow

pytestmark = pytest.mark.spark

KEY = b"k" * 32  # the markers' key here (rlog.spark.markers.marker_key)


def run(first: int, values: list[bytes]) -> pb.Run:
    data, offsets = packed.pack(values)
    return pb.Run(first=first, data=data, offsets=offsets)


def test_arrow_batches_from_runs():
    marker = encode_marker("s", 0, 0, 0, 2, key=KEY)
    runs = [run(5, [b"a", b"", b"ccc"]), run(9, [b"d", marker]), run(20, [b"e"])]
    batch = to_arrow(runs, skip_markers=False)
    assert batch.schema == ARROW_SCHEMA
    assert batch.column(0).to_pylist() == [5, 6, 7, 9, 10, 20]
    assert batch.column(1).to_pylist() == [b"a", b"", b"ccc", b"d", marker, b"e"]
    skipped = to_arrow(runs, skip_markers=True)
    assert skipped.column(0).to_pylist() == [5, 6, 7, 9, 20]
    # The magic inside a value (not at its start) is no marker.
    inside = to_arrow([run(1, [b"x" + MARKER_MAGIC])], skip_markers=True)
    assert inside.num_rows == 1
    assert to_arrow([], True).num_rows == 0
    # A run longer than any before it (the positions' shared 0, 1, ... grows).
    long = to_arrow([run(3, [b"v"] * 10_000)], True)
    assert long.column(0).to_pylist() == list(range(3, 10_003))


def test_a_run_with_bad_offsets_is_refused_by_arrow():
    bad = pb.Run(first=1, data=b"ab", offsets=b"\x00\x00\x00\x00\x05\x00\x00\x00")
    with pytest.raises(pa.ArrowInvalid):
        to_arrow([bad], False)


def column_batches(values: list[bytes], rng: random.Random) -> list[pa.RecordBatch]:
    """`values` in record batches of random sizes and kinds (sliced, large_binary)."""
    out = []
    i = 0
    while i < len(values):
        part = values[i : i + rng.randint(0, 7)]
        kind = rng.random()
        if kind < 0.3:  # a slice: offsets that do not start at 0
            column = pa.array([b"zz", *part, b"yy"], pa.binary()).slice(1, len(part))
        elif kind < 0.5:
            column = pa.array(part, pa.large_binary())
        else:
            column = pa.array(part, pa.binary())
        out.append(pa.RecordBatch.from_arrays([column], names=["value"]))
        i += len(part)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_sink_chunks_cut_like_batched_and_pack_with_their_marker(seed, monkeypatch):
    rng = random.Random(seed)
    limit = rng.choice([5, 20, 100, 1000])
    monkeypatch.setattr(sink, "MAX_APPEND_BYTES", limit)
    for _ in range(40):
        big = rng.random() < 0.3
        values = [
            bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 30 if big else 8)))
            for _ in range(rng.randint(0, 60))
        ]
        rows = rng.randint(1, 10)
        batches = column_batches(values, rng)
        chunks = list(sink.chunks(iter(batches), rows))
        assert [[v for piece in c for v in piece.to_pylist()] for c in chunks] == list(
            batched(values, rows, limit)
        )
        for chunk in chunks:
            data, offsets = sink.packed_chunk(chunk, b"MARK")
            packed.offsets_of(data, offsets)  # well-formed
            want = [v for piece in chunk for v in piece.to_pylist()] + [b"MARK"]
            assert packed.values_of(data, offsets) == want


def test_sink_value_columns():
    text = pa.RecordBatch.from_pydict({"value": pa.array(["é", "", "ab"], pa.string())})
    assert sink.value_column(text).to_pylist() == ["é".encode(), b"", b"ab"]
    with pytest.raises(InvalidArgument, match="nulls"):
        sink.value_column(pa.RecordBatch.from_pydict({"value": pa.array([b"a", None])}))
    with pytest.raises(InvalidArgument, match="BINARY or STRING"):
        sink.value_column(pa.RecordBatch.from_pydict({"value": pa.array([1, 2])}))
    with pytest.raises(InvalidArgument, match="'value' column"):
        sink.value_column(pa.RecordBatch.from_pydict({"other": pa.array([b"a"])}))


def test_source_batches_equal_a_plain_read(cluster):
    """read_range's Arrow batches hold exactly read()'s positions and values, also across
    the SESSION and EPOCH entries between appends."""
    with Client(cluster.endpoints) as client:
        start = client.status().learned + 1
        positions: list[int] = []
        for round_ in range(3):
            positions += client.append([b"arrow-%d-%d" % (round_, i) for i in range(700)])
            client.take_epoch()
        wait_learned(cluster.endpoints, positions[-1])
        want = [(e.position, e.value) for e in client.read(start, positions[-1])]
        assert [p for p, _ in want] == positions
        for endpoint in cluster.endpoints:
            got: list[tuple[int, bytes]] = []
            covered = start - 1
            for last, batch in read_range(client, endpoint, start, positions[-1], True, True):
                assert last > covered
                covered = last
                got += zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True)
            assert got == want and covered == positions[-1]
