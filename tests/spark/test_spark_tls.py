"""rlog.spark passes the TLS options through (docs/security.md): a batch write and read on
real PySpark against a log with mutual TLS and roles (`DevCluster(tls=True)`)."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("cryptography")

from rlog.spark import observe, wait_learned
from rlog.spark.connections import close_all, use_credentials
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    with DevCluster(3, tmp_path_factory.mktemp("tls"), election_timeout=0.5, tls=True) as log:
        log.wait_for_leader()
        yield log
    use_credentials(None)
    close_all()


def options(log: DevCluster, who: str) -> dict[str, str]:
    tls = log.tls_dir
    return {
        "endpoints": log.endpoint,
        "ca": str(tls / "ca.pem"),
        "cert": (tls / f"{who}.pem").read_text(),  # the PEM itself, as a secret would be
        "key": str(tls / f"{who}-key.pem"),
    }


def test_write_and_read_with_client_certificates(spark, secured):
    tag = os.urandom(4).hex()
    rows = [(f"{tag}-{i:04d}",) for i in range(500)]
    df = spark.createDataFrame(rows, "value string").coalesce(2)
    df.write.format("rlog").options(**options(secured, "writer")).mode("append").save()
    use_credentials(secured.credentials("reader"))
    end = observe(secured.endpoints).learned
    wait_learned(secured.endpoints, end)
    read = spark.read.format("rlog").options(**options(secured, "reader")).load()
    values = [r.value.decode() for r in read.collect() if r.value.startswith(tag.encode())]
    assert sorted(values) == sorted(v for (v,) in rows)


def test_a_reader_cannot_write(spark, secured):
    df = spark.createDataFrame([("denied",)], "value string")
    with pytest.raises(Exception, match="needs a role allowing append calls"):
        df.write.format("rlog").options(**options(secured, "reader")).mode("append").save()
