"""Format "rlog" for PySpark's Python Data Source API: the DataSource classes and `register`
(docs/spark.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader
from pyspark.sql.types import StructType

from rlog.spark.options import filter_pushdown
from rlog.spark.sink import RlogStreamWriter, RlogWriter
from rlog.spark.source import SCHEMA, RlogPushdownReader, RlogReader, RlogStreamReader

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "rlog"


class RlogDataSource(DataSource):
    """Format "rlog": batch and streaming source and sink. Filter pushdown of position ranges
    is on when the option `filterPushdown` is true (the default of the class `register` picks
    when the session enables Python filter pushdown)."""

    pushdown_default = True

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        if filter_pushdown(self.options, self.pushdown_default):
            return RlogPushdownReader(self.options)
        return RlogReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RlogStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> RlogWriter:
        return RlogWriter(self.options, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> RlogStreamWriter:
        return RlogStreamWriter(self.options, overwrite)


class RlogDataSourceNoPushdown(RlogDataSource):
    """Format "rlog" for sessions without `spark.sql.python.filterPushdown.enabled`."""

    pushdown_default = False


def register(spark: SparkSession) -> None:
    """Register format "rlog" with the session: with filter pushdown of position ranges if
    the session enables Python filter pushdown, else without (Spark refuses a reader that
    pushes filters when the conf is off)."""
    enabled = str(spark.conf.get("spark.sql.python.filterPushdown.enabled", "false"))
    source = RlogDataSource if enabled.lower() == "true" else RlogDataSourceNoPushdown
    spark.dataSource.register(source)
