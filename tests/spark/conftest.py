"""Spark tests: a session-scoped local[2] SparkSession (workers run this venv's Python) and a
session-scoped real 3-replica log."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from spark_priority import favoured

from rlog.tools.dev import DevCluster

try:  # without the `spark` extra, these tests are not collected at all
    import pyarrow  # noqa: F401
    import pyspark  # noqa: F401
except ImportError:
    collect_ignore_glob = ["test_*.py"]

# Workers must run the venv's interpreter (which has rlog installed), never system Python.
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "spark: PySpark data source tests (rlog.spark)")


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from pyspark.sql import SparkSession

    from rlog.spark import register

    warehouse = tmp_path_factory.mktemp("warehouse")
    with favoured():  # the JVM and its Python workers (tests/spark/spark_priority.py)
        session = (
            SparkSession.builder.master("local[2]")
            .appName("rlog-spark-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.driver.memory", "1g")
            .config("spark.sql.warehouse.dir", str(warehouse))
            .config("spark.sql.python.filterPushdown.enabled", "true")
            .config("spark.sql.streaming.stopTimeout", "10s")
            .getOrCreate()
        )
    session.sparkContext.setLogLevel("ERROR")
    register(session)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """One 3-replica log shared by the read-only tests (each test uses its own positions)."""
    with DevCluster(3, tmp_path_factory.mktemp("rlog"), election_timeout=0.5) as log:
        log.wait_for_leader()
        yield log


@pytest.fixture()
def fresh_cluster(tmp_path: Path) -> Iterator[DevCluster]:
    """A log of its own, for tests that kill replicas."""
    with DevCluster(3, tmp_path / "rlog", election_timeout=0.5) as log:
        log.wait_for_leader()
        yield log
