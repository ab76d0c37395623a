"""The replicated log as a Spark data source and sink (PySpark's Python Data Source API,
extra `rlog-paxos[spark]`). The user manual is docs/spark.md.

    from rlog.spark import register
    register(spark)                                   # format "rlog"
    df = spark.read.format("rlog").option("endpoints", "h1:7000,h2:7000,h3:7000").load()
    df.select("value").write.format("rlog").option("endpoints", ...).mode("append").save()

Modules: `options` (parsing and checking the options), `markers` (the sink's batch markers),
`source` (planning and reading partitions; the readers), `sink` (appending chunks with
markers; the writers), `datasource` (the DataSource classes and `register`), `connections`
(each process's clients). Everything goes through `rlog.client`.
"""

from rlog.spark.datasource import NAME, RlogDataSource, RlogDataSourceNoPushdown, register
from rlog.spark.markers import MARKER_MAGIC, decode_marker, encode_marker, is_marker
from rlog.spark.sink import (
    RlogCommitMessage,
    RlogStreamWriter,
    RlogWriter,
    find_markers,
    leader_first,
    write_chunks,
)
from rlog.spark.source import (
    ARROW_SCHEMA,
    SCHEMA,
    LogView,
    RlogPartition,
    RlogPushdownReader,
    RlogReader,
    RlogStreamReader,
    observe,
    plan_partitions,
    read_partition,
    split_range,
    wait_learned,
)

__all__ = [
    "ARROW_SCHEMA",
    "MARKER_MAGIC",
    "NAME",
    "SCHEMA",
    "LogView",
    "RlogCommitMessage",
    "RlogDataSource",
    "RlogDataSourceNoPushdown",
    "RlogPartition",
    "RlogPushdownReader",
    "RlogReader",
    "RlogStreamReader",
    "RlogStreamWriter",
    "RlogWriter",
    "decode_marker",
    "encode_marker",
    "find_markers",
    "is_marker",
    "leader_first",
    "observe",
    "plan_partitions",
    "read_partition",
    "register",
    "split_range",
    "wait_learned",
    "write_chunks",
]
