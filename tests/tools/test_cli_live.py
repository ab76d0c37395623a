"""The CLI and the client library against a real 3-replica log (`DevCluster`: real `rlog
replica` processes on loopback). Skipped until `rlog.runtime.server` exists."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import time

import pytest

pytest.importorskip("rlog.runtime.server")

from cli_runs import RLOG, assert_one_line_error, rlog

from rlog import packed
from rlog.client import AsyncClient, Client
from rlog.client.errors import (
    EntryTooLarge,
    InvalidArgument,
    OutcomeUnknown,
    PastEnd,
    Truncated,
    Unavailable,
)
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster

MAX_ENTRY = 64 * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DevCluster(
        3, tmp_path_factory.mktemp("cluster"), max_entry_size=MAX_ENTRY, election_timeout=0.5
    ) as c:
        yield c


def ok(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 0, result.stderr.decode()
    assert result.stderr == b"" or b"Traceback" not in result.stderr
    return result.stdout.decode()


def test_append_read_round_trip(cluster):
    out = ok(rlog("append", "--endpoint", cluster.endpoint, "alpha", "beta", "\u03b3"))
    positions = [int(line) for line in out.split()]
    assert len(positions) == 3
    assert positions == list(range(positions[0], positions[0] + 3))
    assert positions[0] >= 1  # position 0 holds the NOP of the first election
    first, last = positions[0], positions[-1]
    out = ok(rlog("read", "-e", cluster.endpoint, "--from", str(first), "--to", str(last)))
    assert out.splitlines() == [f"{first}\talpha", f"{first + 1}\tbeta", f"{last}\t\u03b3"]


def test_read_json_shape(cluster):
    values = [b"\x00\xffbinary", b"", b"text"]
    args = [base64.b64encode(v).decode() for v in values]
    out = ok(rlog("append", "-e", cluster.endpoint, "--base64", *args))
    positions = [int(line) for line in out.split()]
    out = ok(rlog("read", "-e", cluster.endpoint, "--json", "--from", str(positions[0])))
    rows = [json.loads(line) for line in out.splitlines()]
    assert [set(row) for row in rows] == [{"position", "value"}] * len(rows)
    got = {row["position"]: base64.b64decode(row["value"]) for row in rows}
    assert [got[p] for p in positions] == values
    assert [row["position"] for row in rows] == sorted(row["position"] for row in rows)


def test_read_plain_escapes_undecodable(cluster):
    with Client(cluster.endpoint) as client:
        (position,) = client.append([b"ok\xfe"])
    p = str(position)
    out = ok(rlog("read", "-e", cluster.addresses[0], "--from", p, "--to", p))
    assert out == f"{position}\tok\\xfe\n"


def test_append_stdin(cluster):
    lines = [f"line {i}" for i in range(2500)]
    data = ("\n".join(lines) + "\n").encode()
    out = ok(rlog("append", "-e", cluster.endpoint, "--stdin", stdin=data))
    positions = [int(p) for p in out.split()]
    assert len(positions) == len(lines)
    assert positions == list(range(positions[0], positions[0] + len(lines)))
    with Client(cluster.endpoint) as client:
        got = [e.value.decode() for e in client.read(positions[0], positions[-1])]
    assert got == lines


def test_status_json(cluster):
    out = ok(rlog("status", "-e", cluster.addresses[1], "--json"))
    status = json.loads(out)
    for key in ("id", "status", "role", "leader", "begin", "end", "learned", "promised"):
        assert key in status
    assert status["id"] == 1
    assert status["status"] == "VOTING"
    assert status["role"] in ("leader", "follower")
    assert status["leader"] in cluster.addresses
    assert status["begin"] <= status["learned"] <= status["end"]
    plain = ok(rlog("status", "-e", cluster.addresses[1]))
    assert "status:" in plain and "VOTING" in plain


def test_status_all(cluster):
    out = ok(rlog("status", "--all", "--json", "-e", cluster.endpoint))
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["endpoint"] for r in rows] == cluster.addresses
    assert sum(r["role"] == "leader" for r in rows) == 1


def test_read_past_end(cluster):
    result = rlog("read", "-e", cluster.endpoint, "--to", str(10**12))
    assert_one_line_error(result, 1, "past the end")


def test_value_over_the_limit(cluster):
    result = rlog("append", "-e", cluster.endpoint, "--stdin", stdin=b"x" * (MAX_ENTRY + 1) + b"\n")
    assert_one_line_error(result, 1, "exceeds the maximum entry size")


def test_truncate_then_read_below_begin(cluster):
    out = ok(rlog("append", "-e", cluster.endpoint, "t1", "t2", "t3"))
    positions = [int(p) for p in out.split()]
    out = ok(rlog("truncate", "-e", cluster.endpoint, "--to", str(positions[1])))
    truncate_position = int(out.strip())
    assert truncate_position > positions[-1]
    result = rlog("read", "-e", cluster.endpoint, "--from", str(positions[0]))
    assert_one_line_error(result, 1, "truncated")
    out = ok(rlog("read", "-e", cluster.endpoint, "--from", str(positions[1])))
    assert out.splitlines()[:2] == [f"{positions[1]}\tt2", f"{positions[2]}\tt3"]


def test_client_errors_are_typed(cluster):
    with Client(cluster.endpoint) as client:
        status = client.status()
        with pytest.raises(PastEnd) as past:
            list(client.read(to=status.end + 10**6))
        assert past.value.end is not None
        with pytest.raises(EntryTooLarge):
            client.append([b"y" * (MAX_ENTRY + 1)])
        with pytest.raises(InvalidArgument):
            list(client.read(from_=status.learned, to=max(status.learned - 1, status.begin)))
        if status.begin > 0:
            with pytest.raises(Truncated) as truncated:
                list(client.read(from_=status.begin - 1))
            assert truncated.value.begin == status.begin


async def test_async_client(cluster):
    async with AsyncClient(cluster.endpoint) as client:
        positions = await client.append(["a", b"b"])
        assert positions[1] == positions[0] + 1
        one = await client.append_one("c")
        assert one == positions[1] + 1
        got = [e async for e in client.read(positions[0], one)]
        assert [(e.position, e.value) for e in got] == [
            (positions[0], b"a"),
            (positions[1], b"b"),
            (one, b"c"),
        ]
        stale = [e async for e in client.read(positions[0], stale=True)]
        assert all(e.position >= positions[0] for e in stale)
        tail = client.tail(one)
        first = await tail.__anext__()
        assert first.position == one and first.value == b"c"
        await tail.aclose()


def run_positions(columns):
    """The positions the batches of runs hold, in order."""
    return [p for runs in columns for r in runs for p in range(r.first, packed.run_last(r) + 1)]


def test_read_columns_and_reads_of_one_given_endpoint(cluster):
    dead = "127.0.0.1:1"  # connection refused
    values = [b"c%d" % i for i in range(50)] + [b""]
    with Client([dead, *cluster.endpoints]) as client:
        positions = client.append(values)
        first, last = positions[0], positions[-1]
        cluster.wait_for(
            lambda found: all(s is not None and s.learned >= last for s in found), what="learned"
        )
        # Columns: the batches the server sends, each a list of packed runs, no Entry objects.
        columns = list(client.read_columns(first, last))
        assert columns and all(runs and all(packed.run_count(r) for r in runs) for runs in columns)
        assert run_positions(columns) == positions
        got = [v for runs in columns for r in runs for v in packed.values_of(r.data, r.offsets)]
        assert got == values
        # One given endpoint: each replica's own learned entries (a stale read), the same.
        for endpoint in cluster.endpoints:
            got = [(e.position, e.value) for e in client.read(first, last, True, 0, endpoint)]
            assert got == list(zip(positions, values, strict=True))
            stale = client.read_columns(first, last, stale=True, endpoint=endpoint)
            assert run_positions(stale) == positions
        # A given endpoint that is down: its error, never another endpoint's answer.
        with pytest.raises(Unavailable) as down:
            list(client.read(first, last, stale=True, endpoint=dead))
        assert down.value.endpoint == dead
    with Client([dead, *cluster.endpoints]) as fresh:  # without `endpoint`: moves on past it
        assert [e.position for e in fresh.read(first, last, stale=True)] == positions


def test_failover_past_a_dead_endpoint(cluster):
    victim = next(i for i in range(3) if i != cluster.leader())
    cluster.kill(victim)
    try:
        order = [cluster.addresses[victim]] + [
            a for i, a in enumerate(cluster.addresses) if i != victim
        ]
        with Client(order) as client:
            position = client.append_one("after a crash")
            assert client.current_endpoint != cluster.addresses[victim]
            assert [e.value for e in client.read(position, position)] == [b"after a crash"]
        out = ok(rlog("append", "-e", ",".join(order), "via cli"))
        assert int(out) > position
    finally:
        cluster.start_replica(victim)
    cluster.wait_for(
        lambda s: s[victim] is not None and s[victim].status == pb.VOTING, what="restart"
    )


def test_restart_keeps_address_and_wipe_recovers(cluster):
    with Client(cluster.endpoint) as client:
        client.append([b"before wipe"])
        learned = client.status().learned
    victim = next(i for i in range(3) if i != cluster.leader())
    address = cluster.addresses[victim]
    cluster.restart(victim)
    assert cluster.addresses[victim] == address
    cluster.wipe(victim)
    assert not any(cluster.data_dir(victim).iterdir())
    cluster.start_replica(victim)
    cluster.wait_for(
        lambda s: (
            s[victim] is not None and s[victim].status == pb.VOTING and s[victim].learned >= learned
        ),
        timeout=60,
        what=f"replica {victim} to recover",
    )


def test_bench_json(cluster):
    out = ok(rlog("bench", "-e", cluster.endpoint, "--count", "20", "--json"))
    result = json.loads(out)
    assert result["mode"] == "serial" and result["entries"] == 20
    assert result["lane"] is True  # the default client's
    result = json.loads(
        ok(rlog("bench", "-e", cluster.endpoint, "--count", "5", "--json", "--no-lane"))
    )
    assert result["entries"] == 5 and result["lane"] is False
    for key in ("appends_per_s", "entries_per_s", "mb_per_s", "latency_ms"):
        assert key in result
    out = ok(
        rlog(
            "bench",
            "-e",
            cluster.endpoint,
            "--mode",
            "concurrent",
            "--count",
            "64",
            "--concurrency",
            "4",
            "--batch",
            "4",
            "--json",
        )
    )
    result = json.loads(out)
    assert result["entries"] == 64 and result["appends"] == 16
    assert set(result["latency_ms"]) >= {"p50", "p90", "p99", "max"}


def test_rlog_dev_stops_its_replicas(tmp_path):
    process = subprocess.Popen(
        [RLOG, "dev", "--dir", str(tmp_path), "--election-timeout", "0.5"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        lines = []
        deadline = time.monotonic() + 90
        assert process.stdout is not None
        while time.monotonic() < deadline:
            line = process.stdout.readline().decode()
            assert line, process.stderr.read().decode() if process.stderr else ""
            lines.append(line)
            if line.startswith("try:"):
                break
        assert any(line.startswith("leader: replica") for line in lines), lines
        addresses = json.loads((tmp_path / "cluster.json").read_text())["addresses"]
        ok(rlog("append", "-e", addresses[0], "hi"))
        with Client(addresses[0]) as client:  # lanes by default, clear of the replicas' ports
            assert client.status().lane_offset == 100
        os.kill(process.pid, signal.SIGTERM)
        assert process.wait(timeout=30) == 0
        # No replica is left: every address refuses connections.
        for address in addresses:
            assert_one_line_error(rlog("status", "-e", address), 1, "connection refused")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_no_quorum_is_one_line_and_never_retried(tmp_path):
    with DevCluster(
        3, tmp_path, election_timeout=0.5, replica_args=["--append-timeout", "2"]
    ) as cluster:
        leader = cluster.wait_for_leader()
        for i in range(3):
            if i != leader:
                cluster.kill(i)
        # Without a session (exactly_once=False) an append of unknown outcome is never
        # re-sent: the error comes from the leader, the append went nowhere else.
        with Client(cluster.endpoints, append_timeout=30, exactly_once=False) as client:
            with pytest.raises((OutcomeUnknown, Unavailable)) as info:
                client.append([b"no quorum"])
            assert info.value.endpoint == cluster.addresses[leader]
        # In a session it is re-sent (harmless there) until the deadline, then one line.
        result = rlog(
            "append", "-e", cluster.addresses[leader], "--timeout", "5", "still no quorum"
        )
        assert_one_line_error(result, 1)


async def test_stream_appends(cluster):
    dead = "127.0.0.1:1"  # connection refused: the stream moves on to the next endpoint
    async with AsyncClient([dead, *cluster.endpoints], stream=True) as client:
        values = [f"s{i}".encode() for i in range(300)]
        outcomes = await asyncio.gather(
            *(client.append([v, v + b"'"]) for v in values), return_exceptions=True
        )
        # A leader change under load may leave some outcomes unknown; nothing else fails.
        assert all(isinstance(o, list | OutcomeUnknown) for o in outcomes), outcomes
        acked = [(v, o) for v, o in zip(values, outcomes, strict=True) if isinstance(o, list)]
        assert len(acked) >= len(values) // 2
        positions = [p for _, pair in acked for p in pair]
        assert len(set(positions)) == len(positions)
        assert all(b == a + 1 for _, (a, b) in acked)
        assert client.current_endpoint != dead
        with pytest.raises(EntryTooLarge):
            await client.append([b"z" * (MAX_ENTRY + 1)])
        got = {e.position: e.value async for e in client.read(min(positions), max(positions))}
        for value, (a, b) in acked:
            assert got[a] == value and got[b] == value + b"'"
        # The stream survives an error of one of its appends.
        assert await client.append_one("after") > max(positions)


def test_bench_stream(cluster):
    out = ok(
        rlog(
            "bench",
            "-e",
            cluster.endpoint,
            "--mode",
            "concurrent",
            "--stream",
            "--count",
            "40",
            "--concurrency",
            "8",
            "--json",
        )
    )
    result = json.loads(out)
    assert result["entries"] == 40 and result["stream"] is True and result["lane"] is False
