#!/usr/bin/env python3
"""Throughput of the rlog Spark sink (df.write.format("rlog")) with one append call in flight
per task (the sink before pipelining) and with several (option `appendsInFlight`), back to
back in one local[2] SparkSession against a real 3-replica log (`rlog replica` processes).

    .venv/bin/python bench/spark_sink.py [--rows 1000000] [--in-flight 1,4,4,1]

Each run writes the same cached DataFrame (`--rows` values of 100 B in 2 partitions, so 2
tasks) into the log; the runs go in the order given (the default alternates, so a change of
the machine's load during the session hits both settings). Prints one line per run with the
1-minute load average before and after it and the CPU time each replica process used per
row, and the best rows/s per setting.
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


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    if pid is None:
        return 0.0
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--in-flight", default="1,4,4,1", help="appendsInFlight of each run")
    parser.add_argument("--batch-size", type=int, default=8192, help="rows per append call")
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--dir", default=None, help="work dir (default: a temp dir)")
    args = parser.parse_args()
    settings = [int(x) for x in args.in_flight.split(",")]

    from pyspark.sql import functions as F
    from spark_source import bench_session  # bench/ is on sys.path when run as a script

    from rlog.spark import observe
    from rlog.tools.dev import DevCluster

    work = Path(args.dir or tempfile.mkdtemp(prefix="rlog-spark-sink-"))
    spark = bench_session()
    value = bytes(range(100))
    rows = args.rows
    src = spark.range(0, rows, 1, args.tasks).select(F.lit(value).alias("value")).cache()
    src.count()
    best: dict[int, float] = {}
    with DevCluster(3, work / "log", election_timeout=3.0) as log:
        log.wait_for_leader()

        def write(in_flight: int, frame) -> None:
            (
                frame.write.format("rlog")
                .option("endpoints", log.endpoint)
                .option("appendsInFlight", str(in_flight))
                .option("batchSize", str(args.batch_size))
                .mode("append")
                .save()
            )

        write(1, src.limit(20_000))  # warm up the workers and the replicas' channels
        for in_flight in settings:
            load = os.getloadavg()[0]
            leader = log.leader()
            cpu = [cpu_seconds(log.pid(i)) for i in range(3)]
            before = observe(log.endpoints).learned
            t = time.perf_counter()
            write(in_flight, src)
            seconds = time.perf_counter() - t
            after = observe(log.endpoints).learned
            assert after - before >= rows, (before, after)
            used = [cpu_seconds(log.pid(i)) - c for i, c in enumerate(cpu)]
            per_entry = {
                "leader" if i == leader else f"follower {i}": f"{u / rows * 1e6:.1f}"
                for i, u in enumerate(used)
            }
            rate = rows / seconds
            best[in_flight] = max(best.get(in_flight, 0.0), rate)
            print(
                f"appendsInFlight={in_flight}: {rows} rows in {seconds:6.2f} s = {rate:>9,.0f} "
                f"rows/s  (load {load:.2f} -> {os.getloadavg()[0]:.2f}); replica CPU us/row "
                f"{per_entry}",
                flush=True,
            )
    print()
    print("| appendsInFlight | best rows/s |")
    print("| ---: | ---: |")
    for in_flight, rate in best.items():
        print(f"| {in_flight} | {rate:,.0f} |")
    spark.stop()
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
