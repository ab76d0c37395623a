"""examples/spark_replay.py run as a subprocess (its own SparkSession and JVM) against a real
3-replica log, in batch and in streaming mode, through ONE endpoint: a follower's address, as
through `kubectl port-forward` or a client Service (nothing else is given to Spark). And the
single-endpoint path of the source and the sink in process: only the given address is
contacted, never the peer addresses the replicas report."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from spark_priority import favour

from rlog.client import Client
from rlog.spark import (
    connections,
    find_markers,
    is_marker,
    observe,
    plan_partitions,
    read_partition,
    wait_learned,
    write_chunks,
)
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.spark

KEY = b"k" * 32  # the markers' key here (rlog.spark.markers.marker_key)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "spark_replay.py"
RLOG = [sys.executable, "-m", "rlog.tools.cli"]


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A log of its own: the example replays the whole log ("earliest")."""
    with DevCluster(3, tmp_path_factory.mktemp("example-log"), election_timeout=0.5) as cluster:
        cluster.wait_for_leader()
        yield cluster


def follower_of(log: DevCluster) -> str:
    leader = log.wait_for_leader()
    return next(e for i, e in enumerate(log.endpoints) if i != leader)


def append(log: DevCluster, values: list[bytes]) -> list[int]:
    with Client(log.endpoint) as client:
        positions: list[int] = []
        for i in range(0, len(values), 2000):
            positions += client.append(values[i : i + 2000])
    wait_learned(log.endpoints, positions[-1])
    return positions


def rlog_read(endpoint: str) -> list[tuple[int, bytes]]:
    """`rlog read --json` of the whole log (a consistent read through `endpoint`)."""
    out = subprocess.run(
        [*RLOG, "read", "--endpoint", endpoint, "--json"],
        capture_output=True,
        check=True,
        text=True,
        timeout=120,
    ).stdout
    rows = [json.loads(line) for line in out.splitlines()]
    return [(r["position"], base64.b64decode(r["value"])) for r in rows]


def run_example(*args: str) -> str:
    result = subprocess.run(
        [sys.executable, str(EXAMPLE), *args],
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        preexec_fn=favour,  # tests/spark/spark_priority.py
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stdout


def parquet_rows(path: Path) -> list[tuple[int, bytes]]:
    table = pq.read_table(path)  # the stream's data dir: every file was committed (no crash)
    positions, values = table.column("position").to_pylist(), table.column("value").to_pylist()
    return sorted(zip(positions, values, strict=True))


# Two JVM starts and runs (465 s for three in `make test` on 7 Dec, beside two e2e workers;
# 57 s alone for four). Slow is not wrong here; the bounds are for a hang.
@pytest.mark.timeout(900)
def test_example_replays_batch_and_stream_through_one_follower(log: DevCluster, tmp_path: Path):
    values = [f"entry-{i:05d}-".encode() + os.urandom(40) for i in range(6000)]
    values[123] = b""  # an empty value is an entry too
    first = append(log, values)
    with Client(log.endpoint) as client:  # markers (a sink's) are in the log, never in replays
        client.append([b"after-marker", b"\x00\xffrlog-spark-marker\x00{}"])
    follower = follower_of(log)
    assert observe([follower]).leader is None  # the source sees one replica, not the leader
    expected = [(p, v) for p, v in rlog_read(follower) if not is_marker(v)]
    appended = set(first)
    assert [v for p, v in expected if p in appended] == values

    # Batch: 3 partitions, every one read through the follower, of the range --from/--to
    # (both ends cut something off; the source's default range is tested in process).
    batch = tmp_path / "batch"
    low, high = first[1], first[-2]
    args = ["--endpoints", follower, "--out", str(batch), "--partitions", "3"]
    out = run_example(*args, "--from", str(low), "--to", str(high))
    in_range = [(p, v) for p, v in expected if low <= p <= high]
    assert f"wrote {len(in_range)} entries" in out
    assert parquet_rows(batch) == in_range

    # Stream, availableNow in triggers of at most 2500 positions.
    stream_out = tmp_path / "stream"
    args = ["--endpoints", follower, "--out", str(stream_out), "--stream", "--max-entries", "2500"]
    out = run_example(*args)
    assert f"added {len(expected)} entries; " in out
    assert parquet_rows(stream_out / "data") == expected
    commits = sorted(int(p.name) for p in (stream_out / "_checkpoint" / "commits").glob("[0-9]*"))
    assert commits == list(range(3))  # 6002 positions (+ the log's own) in 3 triggers

    # The same command again after more entries continues where it left off: not run here
    # (a third JVM, 150 s of this test beside the e2e suites), but by the e2e suite's
    # test_spark_replay.py with this same example through a port-forward, and in process
    # by test_spark_stream.py's test_stream_available_now_with_restart.


def test_single_endpoint_contacts_only_that_address(log: DevCluster):
    """The source's planning and reads, and the sink's appends and marker scan, given one
    follower's address: no channel to any other address is opened (from outside a
    Kubernetes cluster the peers' addresses are DNS names that do not resolve)."""
    follower = follower_of(log)
    others = set(log.endpoints) - {follower}
    positions = append(log, [b"one-endpoint-%d" % i for i in range(3000)])
    connections.close_all()  # (append() waited for every replica to learn the entries)
    endpoints = (follower,)

    view = observe(endpoints)
    parts = plan_partitions(view, endpoints, positions[0], positions[-1], 3)
    assert [p.replicas for p in parts] == [endpoints] * 3
    got = [p for part in parts for b in read_partition(part) for p in b.column(0).to_pylist()]
    assert got == positions

    # The sink through the follower: appends are forwarded to the leader one call at a time
    # (a follower forwards pipelined calls in no guaranteed order), and the replay's scan for
    # markers reads past the follower's learned end through the follower (forwarded).
    table = pa.RecordBatch.from_pydict({"value": [b"s%d" % i for i in range(1000)]})
    message = write_chunks(
        endpoints, iter([table]), "one-ep", 0, 0, 300, set(), in_flight=4, key=KEY
    )
    assert (message.rows, message.chunks, message.in_flight) == (1000, 4, 1)
    assert find_markers(endpoints, "one-ep", 0, 0, None, 100_000, key=KEY) == {0, 1, 2, 3}

    contacted = connections.known_endpoints()
    assert contacted == {follower}
    assert not contacted & others
