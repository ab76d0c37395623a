#!/usr/bin/env python3
"""Throughput of rlog.spark: the batch source reading N entries of 100 B from a real
3-replica log (`rlog replica` processes) into the `noop` sink and into Parquet, next to
Spark's own JVM-only baseline in the same session (`spark.range(N)` with a 100 B binary
column, into the same sinks); and the sink (df.write.format("rlog")).

    .venv/bin/python bench/spark_source.py [--entries 1000000] [--repeat 2] [--sink-rows 200000]
                                           [--engine auto|lmdb|segment]

Prints one line per measurement and a Markdown table (docs/performance.md).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def timed(fn, repeat: int) -> list[float]:
    """Seconds of each of `repeat` runs of `fn`, in order."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def best(fn, repeat: int) -> float:
    return min(timed(fn, repeat))


def bench_session():  # type: ignore[no-untyped-def]
    """The benchmarks' SparkSession: local[2] (this VM's cores), no UI, rlog registered."""
    from pyspark.sql import SparkSession

    from rlog.spark import register

    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def register_memory_source(spark, rows: int, parts: int, value: bytes) -> None:  # type: ignore[no-untyped-def]
    """Format "memsrc": a Python data source yielding `rows` rows of (position, value) from
    memory as ready-made Arrow batches of 40,000 rows (about what one rlog Read response
    holds), in `parts` partitions: the cost of Spark taking Arrow batches from any Python
    data source, without rlog."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class MemoryReader(DataSourceReader):
        def partitions(self):  # type: ignore[no-untyped-def]
            return [InputPartition(i) for i in range(parts)]

        def read(self, partition):  # type: ignore[no-untyped-def]
            import pyarrow as pa

            size = 40_000
            batch = pa.RecordBatch.from_arrays(
                [pa.array(range(size), pa.int64()), pa.array([value] * size, pa.binary())],
                names=["position", "value"],
            )
            left = rows // parts + (1 if partition.value < rows % parts else 0)
            while left > 0:
                yield batch.slice(0, min(left, size))
                left -= size

    class MemorySource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "memsrc"

        def schema(self) -> str:
            return "position bigint, value binary"

        def reader(self, schema):  # type: ignore[no-untyped-def]
            return MemoryReader()

    spark.dataSource.register(MemorySource)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--sink-rows", type=int, default=200_000)
    parser.add_argument(
        "--sink-repeat", type=int, default=None, help="warm sink runs (default: --repeat)"
    )
    parser.add_argument(
        "--partitions", default="3", help="read partitions; a list (3,6) times the source for each"
    )
    parser.add_argument("--dir", default=None, help="work dir (default: a temp dir)")
    parser.add_argument("--engine", default="auto", help="the replicas' storage engine")
    parser.add_argument(
        "--memory-source",
        action="store_true",
        help="also time a Python data source of the same rows from memory into noop",
    )
    args = parser.parse_args()

    from pyspark.sql import functions as F

    from rlog.client import Client
    from rlog.client.errors import OutcomeUnknown
    from rlog.packed import run_count
    from rlog.spark import observe, wait_learned
    from rlog.spark.source import READ_MAX_BATCH
    from rlog.tools.dev import DevCluster

    work = Path(args.dir or tempfile.mkdtemp(prefix="rlog-spark-bench-"))
    spark = bench_session()
    n = args.entries
    counts = [int(c) for c in str(args.partitions).split(",")]
    results: list[tuple[str, float, int]] = []

    def record(what: str, seconds: float, rows: int) -> None:
        results.append((what, seconds, rows))
        print(f"{what:55s} {rows:>9d} rows {seconds:7.2f} s {rows / seconds:>12,.0f} rows/s")

    with DevCluster(3, work / "log", election_timeout=3.0, storage_engine=args.engine) as log:
        log.wait_for_leader()
        value = bytes(range(100))
        t = time.perf_counter()
        with Client(log.endpoint) as client:
            last = 0
            for start in range(0, n, 16384):
                for _ in range(5):  # a leader change under load: retry (a duplicate is harmless)
                    try:
                        last = client.append([value] * min(16384, n - start))[-1]
                        break
                    except OutcomeUnknown:
                        time.sleep(1)
        wait_learned(log.endpoints, last)
        print(f"loaded {n} entries of 100 B in {time.perf_counter() - t:.1f} s")
        view = observe(log.endpoints)

        # One raw stale Read stream from a follower, no Spark: the replica's serving rate.
        follower = next(e for e, _ in view.replicas if e != view.leader)
        t = time.perf_counter()
        with Client(follower) as reader:
            columns = reader.read_columns(view.begin, view.learned, True, READ_MAX_BATCH)
            got = sum(run_count(run) for runs in columns for run in runs)
        record("raw Read stream, 1 follower (no Spark)", time.perf_counter() - t, got)

        def rlog_df(parts: int):
            return (
                spark.read.format("rlog")
                .option("endpoints", log.endpoint)
                .option("partitions", str(parts))
                .load()
            )

        def jvm_df():
            return spark.range(0, n, 1, counts[0]).select(
                F.col("id").alias("position"), F.lit(value).alias("value")
            )

        n = rlog_df(counts[0]).count()  # also warms up the workers
        parquet = work / "out.parquet"
        makers = [("JVM spark.range + 100 B binary", jvm_df)] + [
            (f"rlog source, {c} partitions", lambda c=c: rlog_df(c)) for c in counts
        ]
        if args.memory_source:
            register_memory_source(spark, n, counts[0], value)
            spark.read.format("memsrc").load().count()  # warm up
            seconds = best(
                lambda: (
                    spark.read.format("memsrc").load().write.format("noop").mode("overwrite").save()
                ),
                args.repeat,
            )
            record(f"in-memory Python data source, {counts[0]} partitions -> noop", seconds, n)
        for name, make in makers:
            times = timed(
                lambda make=make: make().write.format("noop").mode("overwrite").save(), args.repeat
            )
            record(f"{name} -> noop", min(times), n)
            # A query's first run in the session pays the JIT warming up: on its own line too,
            # so that the best of --repeat never hides what a one-off query meets.
            record(f"{name} -> noop, first run", times[0], n)
            seconds = best(
                lambda make=make: make().write.mode("overwrite").parquet(str(parquet)), args.repeat
            )
            record(f"{name} -> parquet", seconds, n)
        assert spark.read.parquet(str(parquet)).count() == n

        rows = args.sink_rows
        src = spark.range(0, rows, 1, 2).select(F.lit(value).alias("value")).cache()
        src.count()

        def sink() -> None:
            src.write.format("rlog").option("endpoints", log.endpoint).mode("append").save()

        # The first write of a session also starts the Python workers of the write path
        # (planning, tasks, commit; seconds on this VM): timed on its own, then the sink is
        # timed warm, best of --repeat, as the source is.
        before = observe(log.endpoints).learned
        t = time.perf_counter()
        sink()
        record("first write of the session (cold workers)", time.perf_counter() - t, rows)
        sink_repeat = args.repeat if args.sink_repeat is None else args.sink_repeat
        record("sink: df.write.format('rlog') (2 tasks)", best(sink, sink_repeat), rows)
        after = observe(log.endpoints).learned
        assert after - before >= rows * (1 + sink_repeat)
        del view

    by = {what: rows / s for what, s, rows in results}
    print()
    print("| path | rows/s | ratio to JVM baseline |")
    print("| --- | ---: | ---: |")
    for sink in ("noop", "parquet"):
        jvm = by[f"JVM spark.range + 100 B binary -> {sink}"]
        print(f"| JVM baseline -> {sink} | {jvm:,.0f} | 1 |")
        for c in counts:
            ours = by[f"rlog source, {c} partitions -> {sink}"]
            print(
                f"| rlog source (3 replicas, {c} partitions) -> {sink} | {ours:,.0f} | "
                f"{ours / jvm:.2f} |"
            )
    raw = by["raw Read stream, 1 follower (no Spark)"]
    print(f"| one raw stale Read stream from a follower (no Spark) | {raw:,.0f} | |")
    sink_key = "sink: df.write.format('rlog') (2 tasks)"
    print(f"| rlog sink (append through the leader, warm) | {by[sink_key]:,.0f} | |")
    cold = by["first write of the session (cold workers)"]
    print(f"| rlog sink, the session's first write (cold workers) | {cold:,.0f} | |")
    spark.stop()
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
