"""A streaming replay job run as its own process (so a test can SIGKILL it mid-batch):
rlog -> Parquet with Trigger.AvailableNow. argv: endpoints start max_entries out checkpoint."""

from __future__ import annotations

import os
import sys

os.environ["PYSPARK_PYTHON"] = sys.executable


def main() -> None:
    from pyspark.sql import SparkSession

    from rlog.spark import register

    endpoints, start, max_entries, out, checkpoint = sys.argv[1:6]
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    query = (
        spark.readStream.format("rlog")
        .option("endpoints", endpoints)
        .option("startingPosition", start)
        .option("maxEntriesPerTrigger", max_entries)
        .load()
        .writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
