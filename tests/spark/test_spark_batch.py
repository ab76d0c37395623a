"""rlog.spark batch source and batch sink on real PySpark (local[2]) against real `rlog
replica` processes."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys

import pytest
from pyspark import cloudpickle
from pyspark.sql.datasource import GreaterThanOrEqual, LessThan

from rlog.client import Client
from rlog.client.errors import PastEnd, Truncated
from rlog.spark import (
    MARKER_MAGIC,
    RlogDataSource,
    RlogPartition,
    RlogPushdownReader,
    RlogReader,
    RlogStreamReader,
    RlogStreamWriter,
    RlogWriter,
    decode_marker,
    encode_marker,
    find_markers,
    observe,
    plan_partitions,
    read_partition,
    split_range,
    wait_learned,
    write_chunks,
)

pytestmark = pytest.mark.spark

KEY = b"k" * 32  # the markers' key here (rlog.spark.markers.marker_key)

RLOG = [sys.executable, "-m", "rlog.tools.cli"]
N = 100_000


def value_of(i: int) -> bytes:
    return f"{i:08d}-".encode() + bytes(range(32, 123))  # 100 bytes


@pytest.fixture(scope="module")
def loaded(cluster):
    """100k entries of 100 B, learned by every replica: (first, last) positions."""
    client = Client(cluster.endpoint)
    positions: list[int] = []
    for start in range(0, N, 10_000):
        positions += client.append([value_of(i) for i in range(start, start + 10_000)])
    client.close()
    wait_learned(cluster.endpoints, positions[-1])
    return positions[0], positions[-1]


def rlog_read(endpoint: str, first: int, last: int) -> list[tuple[int, bytes]]:
    out = subprocess.run(
        [*RLOG, "read", "--endpoint", endpoint, "--from", str(first), "--to", str(last), "--json"],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    return [(r["position"], base64.b64decode(r["value"])) for r in rows]


def test_batch_read_100k_equals_rlog_read(spark, cluster, loaded):
    first, last = loaded
    df = (
        spark.read.format("rlog")
        .option("endpoints", cluster.endpoint)
        .option("from", first)
        .option("to", last)
        .load()
    )
    assert df.schema.simpleString() == "struct<position:bigint,value:binary>"
    assert [f.nullable for f in df.schema.fields] == [False, False]
    assert df.rdd.getNumPartitions() == 3
    got = sorted((r.position, bytes(r.value)) for r in df.collect())
    assert got == rlog_read(cluster.endpoint, first, last)
    assert len(got) == N


def test_partitions_spread_over_the_voting_replicas(cluster, loaded):
    first, last = loaded
    view = observe(cluster.endpoints)
    parts = plan_partitions(view, cluster.endpoints, first, last, 3)
    assert [(p.start, p.end) for p in parts] == split_range(first, last, 3)
    assert {p.replicas[0] for p in parts} == set(cluster.endpoints)  # one range per replica
    assert all(set(p.replicas) == set(cluster.endpoints) for p in parts)  # the rest: failover


def test_pickling_round_trips():
    options = {"endpoints": "127.0.0.1:1,127.0.0.1:2", "from": "5", "partitions": "2"}
    for obj in (
        RlogReader(options),
        RlogPushdownReader(options),
        RlogStreamReader({"endpoints": options["endpoints"], "maxEntriesPerTrigger": "10"}),
        RlogPartition(1, 10, ("a:1", "b:2"), ("a:1", "b:2", "c:3")),
        RlogDataSource(options),
    ):
        copy = cloudpickle.loads(cloudpickle.dumps(obj))
        assert type(copy) is type(obj)
        assert vars(copy) == vars(obj)


def test_pickling_of_writers(cluster):
    options = {"endpoints": cluster.endpoint}
    for obj in (RlogWriter(options, False), RlogStreamWriter(options, False)):
        copy = cloudpickle.loads(cloudpickle.dumps(obj))
        assert vars(copy) == vars(obj)


def test_filter_pushdown_narrows_the_range(spark, cluster, loaded):
    first, _ = loaded
    reader = RlogPushdownReader({"endpoints": cluster.endpoint})
    rest = list(
        reader.pushFilters(
            [GreaterThanOrEqual(("position",), first + 10), LessThan(("position",), first + 20)]
        )
    )
    assert rest == []
    parts = reader.partitions()
    assert (parts[0].start, parts[-1].end) == (first + 10, first + 19)
    df = spark.read.format("rlog").option("endpoints", cluster.endpoint).load()
    rows = df.where(f"position >= {first + 10} AND position < {first + 20}").collect()
    assert [r.position for r in rows] == list(range(first + 10, first + 20))


def test_truncated_and_past_end_errors(spark, tmp_path):
    # A log of its own: truncation is forever.
    from rlog.tools.dev import DevCluster

    with DevCluster(3, tmp_path / "t", election_timeout=0.5) as log:
        log.wait_for_leader()
        with Client(log.endpoint) as client:
            positions = client.append([b"x%d" % i for i in range(100)])
            client.truncate(positions[50])
            end = client.append([b"tail"])[0]
        wait_learned(log.endpoints, end)

        def reader():
            return spark.read.format("rlog").option("endpoints", log.endpoint)

        with pytest.raises(Exception, match="truncated: the log begins at"):
            reader().option("from", positions[10]).load().collect()
        with pytest.raises(Exception, match="past the end of the log"):
            reader().option("to", end + 1000).load().collect()
        # Outside Spark, the typed errors.
        with pytest.raises(Truncated):
            RlogReader({"endpoints": log.endpoint, "from": str(positions[10])}).partitions()
        with pytest.raises(PastEnd):
            RlogReader({"endpoints": log.endpoint, "to": str(end + 1)}).partitions()
        # A partition planned before the truncation fails clearly when read after it.
        stale_plan = RlogPartition(positions[0], positions[-1], tuple(log.endpoints), ())
        with pytest.raises(Truncated, match="are truncated"):
            list(read_partition(stale_plan))
        # The default range starts at the begin.
        rows = spark.read.format("rlog").option("endpoints", log.endpoint).load().collect()
        assert [bytes(r.value) for r in rows] == [b"x%d" % i for i in range(50, 100)] + [b"tail"]


def test_an_unknown_option_fails_the_query_and_appends_nothing(spark, cluster, tmp_path):
    """On real Spark, which hands the options over in lower case: a Kafka user's
    `maxOffsetsPerTrigger` fails the stream at its start instead of leaving its batches
    unbounded, and a misspelt sink option fails the write before anything is appended."""
    before = observe(cluster.endpoints).learned
    stream = (
        spark.readStream.format("rlog")
        .option("endpoints", cluster.endpoint)
        .option("maxOffsetsPerTrigger", "100")
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
    )
    with pytest.raises(Exception, match="did you mean 'maxEntriesPerTrigger'") as caught:
        stream.start().awaitTermination(120)
    assert "unknown option 'maxoffsetspertrigger' for the rlog streaming source" in str(
        caught.value
    )
    with pytest.raises(Exception, match="unknown option 'partition' for the rlog batch source"):
        spark.read.format("rlog").option("endpoints", cluster.endpoint).option(
            "partition", "2"
        ).load().collect()
    frame = spark.createDataFrame([(b"never",)], "value binary")
    with pytest.raises(Exception, match="did you mean 'batchSize'"):
        frame.write.format("rlog").option("endpoints", cluster.endpoint).option(
            "batchsise", "10"
        ).mode("append").save()
    assert observe(cluster.endpoints).learned == before  # nothing was appended


def test_replica_down_during_a_read(spark, fresh_cluster):
    log = fresh_cluster
    with Client(log.endpoint) as client:
        positions = client.append([value_of(i) for i in range(3000)])
    wait_learned(log.endpoints, positions[-1])
    parts = plan_partitions(observe(log.endpoints), log.endpoints, positions[0], positions[-1], 3)
    victim = parts[0].replicas[0]
    leader = log.leader()
    log.kill(log.endpoints.index(victim), signal.SIGKILL)
    if leader == log.endpoints.index(victim):
        log.wait_for_leader()
    # Partitions planned while every replica was up, read while one is down: they fail over.
    rows = [
        p for part in parts for batch in read_partition(part) for p in batch.column(0).to_pylist()
    ]
    assert rows == positions
    # Through Spark, with the dead replica still listed among the endpoints.
    df = spark.read.format("rlog").option("endpoints", log.endpoint).option("partitions", 4).load()
    assert sorted(r.position for r in df.select("position").collect()) == positions


def test_markers_encoding_and_skipping(spark, cluster):
    marker = encode_marker("s", 3, 1, 2, 10, key=KEY)
    assert marker.startswith(MARKER_MAGIC)
    fields = decode_marker(marker)
    assert fields is not None and fields.pop("tag")
    assert fields == {
        "v": 2,
        "kind": "data",
        "sink": "s",
        "batch": 3,
        "part": 1,
        "chunk": 2,
        "rows": 10,
    }
    assert decode_marker(b"plain") is None
    with Client(cluster.endpoint) as client:
        positions = client.append([b"a", marker, b"b"])
    wait_learned(cluster.endpoints, positions[-1])
    reader = spark.read.format("rlog").option("endpoints", cluster.endpoint)
    reader = reader.option("from", positions[0]).option("to", positions[-1])
    assert [bytes(r.value) for r in reader.load().collect()] == [b"a", b"b"]
    shown = reader.option("skipMarkers", "false").load().collect()
    assert [bytes(r.value) for r in shown] == [b"a", marker, b"b"]


def test_sink_round_trip(spark, cluster):
    start = observe(cluster.endpoints).learned + 1
    values = [f"row-{i}" for i in range(20_000)]
    df = spark.createDataFrame([(v,) for v in values], "value string").repartition(3)
    df.write.format("rlog").option("endpoints", cluster.endpoint).mode("append").save()
    binary = spark.createDataFrame([(b"\x00bin", 1)], "value binary, other int")
    binary.write.format("rlog").option("endpoints", cluster.endpoint).mode("append").save()
    end = observe(cluster.endpoints).learned
    back = (
        spark.read.format("rlog")
        .option("endpoints", cluster.endpoint)
        .option("from", start)
        .option("to", end)
        .load()
        .collect()
    )
    got = [bytes(r.value) for r in back]
    assert sorted(got) == sorted([v.encode() for v in values] + [b"\x00bin"])
    with pytest.raises(Exception, match="only appends"):
        df.write.format("rlog").option("endpoints", cluster.endpoint).mode("overwrite").save()


def test_sink_replay_skips_chunks_already_appended(cluster):
    """The dedupe without Spark: a replay of (sink, batch, partition) appends nothing twice."""
    import pyarrow as pa

    endpoints = tuple(cluster.endpoints)
    sink = "replay-" + os.urandom(4).hex()
    table = pa.RecordBatch.from_pydict({"value": [b"v%d" % i for i in range(250)]})
    assert find_markers(endpoints, sink, 0, 0, None, 10_000, key=KEY) == set()
    first = write_chunks(endpoints, iter([table]), sink, 0, 0, 100, set(), key=KEY)
    assert (first.rows, first.chunks) == (250, 3)
    write_chunks(endpoints, iter([table]), sink, 0, 1, 100, set(), key=KEY)  # another partition
    # The attempt died after two chunks of partition 0 of batch 1: the replay adds the third.
    write_chunks(endpoints, iter([table.slice(0, 200)]), sink, 1, 0, 100, set(), key=KEY)
    done = find_markers(endpoints, sink, 1, 0, None, 10_000, key=KEY)
    assert done == {0, 1}
    again = write_chunks(endpoints, iter([table]), sink, 1, 0, 100, done, key=KEY)
    assert (again.rows, again.skipped_chunks) == (50, 2)
    assert find_markers(endpoints, sink, 1, 0, None, 10_000, key=KEY) == {0, 1, 2}
    # The scan for batch 1 stops at batch 0's markers (it never needs the whole log).
    assert find_markers(endpoints, sink, 0, 0, None, 10_000, key=KEY) == {0, 1, 2}


def test_markers_forged_by_another_writer_do_not_make_a_task_skip_its_chunks(cluster):
    """The attack on a real log: another writer reads the sink id (in the clear in the
    markers) and appends markers for chunks the task has not appended yet, signed with a
    key of its own, and unsigned as sinks before signing made them. The task's scan finds
    none of them, and every one of its rows is in the log."""
    import pyarrow as pa

    endpoints = tuple(cluster.endpoints)
    sink = "forged-" + os.urandom(4).hex()
    table = pa.RecordBatch.from_pydict(
        {"value": [b"%s-%d" % (sink.encode(), i) for i in range(250)]}
    )
    forged = [encode_marker(sink, 0, 0, chunk, 100, key=b"x" * 32) for chunk in range(3)]
    forged += [
        MARKER_MAGIC
        + json.dumps(
            {"v": 1, "kind": "data", "sink": sink, "batch": 0, "part": 0, "chunk": c, "rows": 100}
        ).encode()
        for c in range(3)
    ]
    with Client(cluster.endpoint) as intruder:
        intruder.append(forged)
    assert find_markers(endpoints, sink, 0, 0, None, 10_000, key=KEY) == set()
    written = write_chunks(endpoints, iter([table]), sink, 0, 0, 100, set(), key=KEY)
    assert (written.rows, written.skipped_chunks) == (250, 0)
    assert find_markers(endpoints, sink, 0, 0, None, 10_000, key=KEY) == {0, 1, 2}
    wait_learned(cluster.endpoints, written.positions[1])
    with Client(cluster.endpoint) as reader:
        ours = [
            e.value for e in reader.read(*written.positions) if e.value.startswith(sink.encode())
        ]
    assert ours == table.column(0).to_pylist()
