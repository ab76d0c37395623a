#!/usr/bin/env python3
"""Replay an rlog log into Parquet with Spark, as a batch job or as a stream.

    # a local log: `rlog dev --replicas 3 --dir /tmp/rlog-dev` prints "replica i: H:P ..."
    python examples/spark_replay.py --endpoints 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002 \\
        --out /tmp/replay
    # the same, incrementally: a run reads what is new since the last one and adds it to
    # OUT/data (exactly once; the offsets are in the checkpoint, default OUT/_checkpoint)
    python examples/spark_replay.py --endpoints ... --out /tmp/replay-stream --stream \\
        [--checkpoint /tmp/replay-ckpt] [--max-entries 100000]
    # a ReplicatedLog on Kubernetes, through a port-forward of its client Service ...
    kubectl port-forward svc/orders 7000:7000 &
    python examples/spark_replay.py --endpoints 127.0.0.1:7000 --out /tmp/orders --partitions 3
    # ... or from a pod in the cluster, through the Service itself
    python examples/spark_replay.py --endpoints orders.default.svc:7000 --out s3a://bucket/orders
    # ... or as a Spark on Kubernetes job, driver and executors in pods
    # (examples/spark_k8s/spark-submit.sh, docs/spark.md "On Kubernetes")
    spark-submit --master k8s://https://API:6443 --deploy-mode cluster ... \\
        local:///opt/rlog/examples/spark_replay.py --endpoints orders.default.svc:7000 \\
        --out /out/orders

Needs `pip install 'rlog-paxos[spark]'` and Java 17. Batch mode writes the entries of [--from,
--to] (default: the whole log as learned when the job starts) to OUT, replacing it. Stream
mode runs `readStream.format("rlog")` with `Trigger.AvailableNow` into OUT/data, then stops.

With one address (a Service or a port-forward) every partition is read through that address
and nothing else is contacted (the replicas' peer addresses, cluster DNS names, need not be
reachable): pass --partitions to read several ranges in parallel through it. With the
replicas' own addresses the partitions are spread over the VOTING replicas. The options and
guarantees of format "rlog" are in docs/spark.md.
"""

from __future__ import annotations

import argparse
import os
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoints", required=True, help="H:P,H:P,... or a client Service")
    parser.add_argument("--out", required=True, help="Parquet output directory")
    parser.add_argument("--from", dest="from_", type=int, help="first position (batch)")
    parser.add_argument("--to", type=int, help="last position (batch; default: learned end)")
    parser.add_argument("--partitions", type=int, help="read partitions (default: one per replica)")
    parser.add_argument("--stream", action="store_true", help="availableNow stream, incremental")
    parser.add_argument("--checkpoint", help="streaming checkpoint dir (default: OUT/_checkpoint)")
    parser.add_argument("--starting-position", default="earliest", help="earliest|latest|N")
    parser.add_argument("--max-entries", type=int, help="maxEntriesPerTrigger (stream)")
    parser.add_argument(
        "--master",
        default=os.environ.get("SPARK_MASTER"),
        help="default: spark-submit's --master when run by it, else local[2]",
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from rlog.spark import register

    builder = SparkSession.builder
    if args.master:
        builder = builder.master(args.master)
    if "PYSPARK_GATEWAY_PORT" not in os.environ:  # not started by spark-submit (its --name)
        builder = builder.appName("rlog-replay").master(args.master or "local[2]")
    spark = (
        builder.config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.python.filterPushdown.enabled", "true")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)

    if not args.stream:
        reader = spark.read.format("rlog").option("endpoints", args.endpoints)
        for key, value in (("from", args.from_), ("to", args.to), ("partitions", args.partitions)):
            if value is not None:
                reader = reader.option(key, str(value))
        df = reader.load()
        df.write.mode("overwrite").parquet(args.out)
        print(f"wrote {spark.read.parquet(args.out).count()} entries to {args.out}")
        return 0

    from rlog.spark import SCHEMA

    data = os.path.join(args.out, "data")

    def entries_in_data() -> int:  # what the file sink committed (its _spark_metadata log)
        try:
            return spark.read.schema(SCHEMA).parquet(data).count()
        except Exception:  # no output yet
            return 0

    before = entries_in_data()
    reader = (
        spark.readStream.format("rlog")
        .option("endpoints", args.endpoints)
        .option("startingPosition", args.starting_position)
    )
    if args.max_entries:
        reader = reader.option("maxEntriesPerTrigger", str(args.max_entries))
    if args.partitions:
        reader = reader.option("partitions", str(args.partitions))
    checkpoint = args.checkpoint or os.path.join(args.out, "_checkpoint")
    query = (
        reader.load()
        .writeStream.format("parquet")
        .option("path", data)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()  # raises if the query failed
    total = entries_in_data()
    print(f"added {total - before} entries; {data} holds {total} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
