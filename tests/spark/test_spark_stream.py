"""rlog.spark streaming source and sink on real PySpark (local[2]) against real `rlog
replica` processes: availableNow with a restart, SIGKILL mid-batch, sink replay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from spark_priority import favour

from rlog.client import Client
from rlog.spark import observe, wait_learned

pytestmark = pytest.mark.spark

HERE = Path(__file__).parent


def append(endpoint: str, values: list[bytes]) -> list[int]:
    with Client(endpoint) as client:
        positions: list[int] = []
        for i in range(0, len(values), 5000):
            positions += client.append(values[i : i + 5000])
    return positions


def run_stream(
    spark, endpoints: str, start: int, out: Path, checkpoint: Path, max_entries: int, **more: str
):
    query = (
        spark.readStream.format("rlog")
        .option("endpoints", endpoints)
        .option("startingPosition", str(start))
        .option("maxEntriesPerTrigger", str(max_entries))
        .options(**more)
        .load()
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    return query


def parquet_positions(spark, out: Path) -> list[int]:
    return sorted(r.position for r in spark.read.parquet(str(out)).select("position").collect())


def test_stream_available_now_with_restart(spark, cluster, tmp_path):
    tag = uuid.uuid4().hex[:8]
    start = observe(cluster.endpoints).learned + 1
    first = append(cluster.endpoint, [f"{tag}-a{i}".encode() for i in range(3000)])
    wait_learned(cluster.endpoints, first[-1])
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"
    query = run_stream(spark, cluster.endpoint, start, out, checkpoint, 1000)
    assert len([p for p in query.recentProgress if p["numInputRows"]]) >= 3  # 1000 per trigger
    assert parquet_positions(spark, out) == first
    # More entries, then a restart from the checkpoint: only the new ones, each once.
    second = append(cluster.endpoint, [f"{tag}-b{i}".encode() for i in range(2000)])
    wait_learned(cluster.endpoints, second[-1])
    run_stream(spark, cluster.endpoint, start, out, checkpoint, 1000)
    assert parquet_positions(spark, out) == first + second
    values = {bytes(r.value) for r in spark.read.parquet(str(out)).collect()}
    assert values == {f"{tag}-a{i}".encode() for i in range(3000)} | {
        f"{tag}-b{i}".encode() for i in range(2000)
    }
    # Nothing new: a third run from the checkpoint ends without a batch, adding nothing.
    again = run_stream(spark, cluster.endpoint, start, out, checkpoint, 1000)
    assert [p for p in again.recentProgress if p["numInputRows"]] == []
    assert parquet_positions(spark, out) == first + second


# The job's JVM reached its second commit in seconds alone, not within 150 s in `make test`
# (the e2e suites on the same 2 cores): slow is not wrong here, the bounds are for a hang.
@pytest.mark.timeout(900)
def test_stream_sigkill_mid_batch_then_restart_is_exactly_once(spark, cluster, tmp_path):
    start = observe(cluster.endpoints).learned + 1
    positions = append(cluster.endpoint, [b"k%d" % i for i in range(5000)])
    wait_learned(cluster.endpoints, positions[-1])
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"
    job_log = tmp_path / "job.log"
    with job_log.open("wb") as job_stderr:  # the child keeps its own descriptor
        job = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "stream_job.py"),
                cluster.endpoint,
                str(start),
                "500",
                str(out),
                str(checkpoint),
            ],
            start_new_session=True,
            preexec_fn=favour,  # tests/spark/spark_priority.py
            stdout=subprocess.DEVNULL,
            stderr=job_stderr,
            env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        )
    killed_in = None
    deadline = time.monotonic() + 600
    try:
        while time.monotonic() < deadline and job.poll() is None:
            offsets = {int(p.name) for p in (checkpoint / "offsets").glob("[0-9]*")}
            commits = {int(p.name) for p in (checkpoint / "commits").glob("[0-9]*")}
            pending = offsets - commits
            if commits and len(commits) >= 2 and pending:
                os.killpg(job.pid, signal.SIGKILL)  # the driver, its JVM and its workers
                killed_in = max(pending)
                break
            time.sleep(0.005)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    assert killed_in is not None, (
        f"the job was not caught mid-batch: it exited {job.returncode}; "
        f"its stderr ends: {job_log.read_text(errors='replace')[-3000:]}"
    )
    # The pending batch is re-planned from the offset log (the same range); the rest of the
    # log in one larger batch.
    run_stream(spark, cluster.endpoint, start, out, checkpoint, 10_000)
    assert parquet_positions(spark, out) == positions  # every entry exactly once


def test_stream_sink_replay_is_exactly_once(spark, cluster, tmp_path):
    tag = uuid.uuid4().hex[:8]
    source = tmp_path / "in"
    values = [f"{tag}-{i}" for i in range(3000)]
    spark.createDataFrame([(v,) for v in values], "value string").repartition(3).write.parquet(
        str(source)
    )
    checkpoint = tmp_path / "ckpt"
    start = observe(cluster.endpoints).learned + 1

    def run():
        query = (
            spark.readStream.schema("value string")
            .option("maxFilesPerTrigger", 1)
            .parquet(str(source))
            .writeStream.format("rlog")
            .option("endpoints", cluster.endpoint)
            .option("appendsInFlight", "4")  # the replay's dedupe with pipelined appends
            .option("batchSize", "200")  # 5 append calls per task
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None
        return query

    first = run()
    batches = [p["batchId"] for p in first.recentProgress if p["numInputRows"]]
    assert len(batches) == 3
    # A crash after the sink appended batch 2 but before Spark recorded it: the batch re-runs.
    (checkpoint / "commits" / str(batches[-1])).unlink()
    (checkpoint / "commits" / f".{batches[-1]}.crc").unlink(missing_ok=True)
    again = run()
    assert [p["numInputRows"] for p in again.recentProgress if p["numInputRows"]] == [1000]

    end = observe(cluster.endpoints).learned
    wait_learned(cluster.endpoints, end)
    rows = (
        spark.read.format("rlog")
        .option("endpoints", cluster.endpoint)
        .option("from", start)
        .option("to", end)
        .load()
        .collect()
    )
    got = sorted(bytes(r.value).decode() for r in rows if bytes(r.value).startswith(tag.encode()))
    assert got == sorted(values)  # every row exactly once, markers invisible


def test_ending_position_bounds_the_stream(spark, cluster, tmp_path):
    start = observe(cluster.endpoints).learned + 1
    positions = append(cluster.endpoint, [b"e%d" % i for i in range(300)])
    wait_learned(cluster.endpoints, positions[-1])
    out, checkpoint = tmp_path / "out", tmp_path / "ckpt"

    def run() -> None:
        run_stream(
            spark, cluster.endpoint, start, out, checkpoint, 50, endingPosition=str(positions[199])
        )

    run()
    assert parquet_positions(spark, out) == positions[:200]
    # More entries, a restart from the checkpoint: still nothing past the end.
    wait_learned(cluster.endpoints, append(cluster.endpoint, [b"later"])[-1])
    run()
    assert parquet_positions(spark, out) == positions[:200]


def test_min_entries_per_trigger_waits_for_them_or_for_the_delay(spark, cluster):
    """No timing assertion but a lower bound: each step waits for Spark to have processed
    everything the source offered (processAllAvailable)."""
    start = observe(cluster.endpoints).learned + 1

    def query(name: str, delay: str, begin: int):
        return (
            spark.readStream.format("rlog")
            .option("endpoints", cluster.endpoint)
            .option("startingPosition", str(begin))
            .option("minEntriesPerTrigger", "100")
            .option("maxTriggerDelay", delay)
            .load()
            .writeStream.format("memory")
            .queryName(name)
            .trigger(processingTime="100 milliseconds")
            .start()
        )

    def rows(name: str) -> list[int]:
        return sorted(r.position for r in spark.sql(f"SELECT position FROM {name}").collect())

    first = append(cluster.endpoint, [b"m%d" % i for i in range(60)])
    wait_learned(cluster.endpoints, first[-1])
    held = query("held_by_minimum", "1h", start)
    try:
        held.processAllAvailable()
        assert rows("held_by_minimum") == []  # 60 < 100, and the hour has not passed
        second = append(cluster.endpoint, [b"n%d" % i for i in range(60)])
        wait_learned(cluster.endpoints, second[-1])
        held.processAllAvailable()
        assert rows("held_by_minimum") == first + second
    finally:
        held.stop()
    # With a short delay, fewer than the minimum come once it has passed.
    few = append(cluster.endpoint, [b"f%d" % i for i in range(10)])
    wait_learned(cluster.endpoints, few[-1])
    started = time.monotonic()
    delayed = query("after_the_delay", "1s", few[0])
    try:
        deadline = time.monotonic() + 120  # a hang's bound, not a pace
        while not rows("after_the_delay") and time.monotonic() < deadline:
            delayed.processAllAvailable()
            time.sleep(0.2)
        assert rows("after_the_delay") == few
        assert time.monotonic() - started >= 1.0
    finally:
        delayed.stop()
