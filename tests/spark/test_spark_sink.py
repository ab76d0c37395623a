"""The sink's pipelined appends (option appendsInFlight) against real `rlog replica` processes:
order within a task, a failed task leaves nothing in flight, exactly-once replay."""

from __future__ import annotations

import os

import pyarrow as pa
import pytest

from rlog.client import Client
from rlog.client.errors import InvalidArgument
from rlog.spark import (
    RlogWriter,
    decode_marker,
    find_markers,
    leader_first,
    observe,
    wait_learned,
    write_chunks,
)

pytestmark = pytest.mark.spark

KEY = b"k" * 32  # the markers' key here (rlog.spark.markers.marker_key)


def log_entries(endpoint: str, first: int, last: int) -> list[tuple[int, bytes]]:
    with Client(endpoint) as client:
        return [(e.position, e.value) for e in client.read(first, last)]


def batches(values: list[bytes], size: int, fail_after: int | None = None):
    for n, i in enumerate(range(0, len(values), size)):
        if fail_after is not None and n == fail_after:
            raise RuntimeError("the task's input failed")
        yield pa.RecordBatch.from_pydict({"value": pa.array(values[i : i + size], pa.binary())})


def test_pipelined_appends_keep_the_task_order(cluster):
    endpoints = leader_first(tuple(cluster.endpoints))
    sink = "order-" + os.urandom(4).hex()
    values = [b"%s-%05d" % (sink.encode(), i) for i in range(5000)]
    start = observe(cluster.endpoints).learned + 1
    message = write_chunks(
        endpoints, batches(values, 700), sink, 0, 0, 250, set(), in_flight=4, key=KEY
    )
    assert (message.rows, message.chunks, message.in_flight) == (5000, 20, 4)
    wait_learned(cluster.endpoints, message.positions[1])
    entries = log_entries(cluster.endpoint, start, message.positions[1])
    ours = [(p, v) for p, v in entries if v.startswith(sink.encode())]
    assert [v for _, v in ours] == values  # in position order = the task's order
    # Every chunk is one call: its 250 values, then its marker, at consecutive positions.
    markers = [(p, decode_marker(v)) for p, v in entries if (decode_marker(v) or {}).get("sink")]
    markers = [(p, m) for p, m in markers if m and m["sink"] == sink]
    assert [m["chunk"] for _, m in markers] == list(range(20))
    by_position = dict(entries)
    for p, m in markers:
        chunk = [by_position[q] for q in range(p - 250, p)]
        assert chunk == values[m["chunk"] * 250 : (m["chunk"] + 1) * 250]


def test_a_failed_pipelined_task_leaves_nothing_in_flight_and_replays_once(cluster):
    endpoints = leader_first(tuple(cluster.endpoints))
    sink = "fail-" + os.urandom(4).hex()
    values = [b"%s-%05d" % (sink.encode(), i) for i in range(3000)]
    start = observe(cluster.endpoints).learned + 1
    with pytest.raises(RuntimeError, match="input failed"):
        # 7 input batches of 100 read: chunks 0..5 of 100 were submitted (6 is still filling)
        write_chunks(
            endpoints, batches(values, 100, 7), sink, 0, 0, 100, set(), in_flight=4, key=KEY
        )
    # Raised only once every submitted append had settled: all of them are in the log now.
    done = find_markers(endpoints, sink, 0, 0, None, 100_000, key=KEY)
    assert done == set(range(6))
    again = write_chunks(
        endpoints, batches(values, 100), sink, 0, 0, 100, done, in_flight=4, key=KEY
    )
    assert (again.rows, again.chunks, again.skipped_chunks) == (2400, 30, 6)
    wait_learned(cluster.endpoints, again.positions[1])
    ours = [v for _, v in log_entries(cluster.endpoint, start, again.positions[1])]
    ours = [v for v in ours if v.startswith(sink.encode())]
    assert ours == values  # each once; here even in order (the failure left a prefix)


def ballots(endpoints: list[str]) -> dict[str, int]:
    """Each replica's promised ballot: it changes when leadership moves."""
    with Client(endpoints) as client:
        answers = client.statuses()
    return {e: s.promised for e, s in answers.items() if not isinstance(s, Exception)}


def test_spark_sink_with_appends_in_flight(spark, cluster):
    tag = os.urandom(4).hex()
    start = observe(cluster.endpoints).learned + 1
    ballots_before = ballots(cluster.endpoints)
    rows = [(f"{tag}-{part}-{i:05d}", part) for part in range(3) for i in range(4000)]
    df = spark.createDataFrame(rows, "value string, part int").repartition(3, "part")
    df = df.sortWithinPartitions("value")
    for in_flight in ("8", "1"):
        (
            df.write.format("rlog")
            .option("endpoints", cluster.endpoint)
            .option("appendsInFlight", in_flight)
            .option("batchSize", "500")
            .mode("append")
            .save()
        )
    end = observe(cluster.endpoints).learned
    wait_learned(cluster.endpoints, end)
    entries = log_entries(cluster.endpoint, start, end)
    ours = [v.decode() for _, v in entries if v.startswith(tag.encode())]
    assert sorted(ours) == sorted([v for v, _ in rows] * 2)
    first_write, second_write = ours[: len(rows)], ours[len(rows) :]
    # Order holds unless leadership moved or an append failed (docs/spark.md, "Ordering");
    # say which if it does not.
    moved = f"ballots before {ballots_before}, after {ballots(cluster.endpoints)}"
    for written in (first_write, second_write):
        for part in range(3):  # each task's rows in its order
            mine = [v for v in written if v.startswith(f"{tag}-{part}-")]
            assert len(mine) == 4000
            assert mine == sorted(mine), moved
    with pytest.raises(InvalidArgument, match="appendsInFlight"):
        RlogWriter({"endpoints": cluster.endpoint, "appendsInFlight": "0"}, False)
