"""Conditional and exactly-once appends on a real 3-replica log (`DevCluster`): conditions
and epochs through the client, the CLI and a follower; retries of one session append
through a leader kill and a restart of every replica get the original positions; every bad
request gets its typed error and leaves the log unchanged. Readers never see the SESSION
and EPOCH entries."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor

import grpc
import pytest
from faultproxy import FaultProxy
from live import raw_append, wait_until

from rlog.client import AsyncClient, Client
from rlog.client.errors import (
    ConditionFailed,
    EpochFromFuture,
    InvalidArgument,
    SequenceForgotten,
    SessionExpired,
    Truncated,
    Unavailable,
    UnknownSession,
)
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

WINDOW = 40  # positions a session lasts (small, to see one expire)


@pytest.fixture
def cluster(tmp_path):
    with DevCluster(
        3,
        tmp_path,
        election_timeout=0.5,
        replica_args=["--session-window", str(WINDOW)],
    ) as c:
        # Every replica answers before a test talks to one alone: a connection refused
        # while one was starting would otherwise fail a single-endpoint client's first call
        # (gRPC shares the failed connection between channels until it reconnects).
        c.wait_for(all, what="every replica answering")
        yield c


def values_of(client: Client) -> list[bytes]:
    return [e.value for e in client.read()]


def raw_append_retrying(endpoint: str, request: pb.AppendRequest) -> list[int]:
    """Like `raw_append`, re-sent while no leader answers (an election after a kill)."""
    for _ in range(100):
        try:
            return raw_append(endpoint, request)
        except (UnknownSession, SessionExpired, ConditionFailed, InvalidArgument):
            raise
        except Exception:
            time.sleep(0.2)
    raise AssertionError("no leader answered")


def follower(cluster: DevCluster) -> int:
    leader = cluster.wait_for_leader()
    return (leader + 1) % 3


def test_if_next_and_epochs_hold_or_change_nothing(cluster):
    leader = cluster.wait_for_leader()
    for endpoint in (cluster.endpoints[leader], cluster.endpoints[follower(cluster)]):
        with Client(endpoint, exactly_once=False) as client:
            (position,) = client.append(b"first")
            with pytest.raises(ConditionFailed) as failed:
                client.append([b"a", b"b"], if_next=position)
            assert failed.value.next_position == position + 1
            assert failed.value.code == grpc.StatusCode.FAILED_PRECONDITION
            assert client.append([b"a", b"b"], if_next=position + 1) == [
                position + 1,
                position + 2,
            ]
            epoch = client.take_epoch()
            assert client.append(b"fenced-in", epoch=epoch, if_next=position + 4)
            assert client.take_epoch() == epoch + 1
            before = values_of(client)
            with pytest.raises(ConditionFailed) as fenced:
                client.append(b"stale writer", epoch=epoch)
            assert fenced.value.epoch == epoch + 1
            with pytest.raises(EpochFromFuture) as future:
                client.append(b"from the future", epoch=epoch + 5)
            assert future.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert values_of(client) == before  # nothing appended, no EPOCH entry visible
            assert b"fenced-in" in before
    with Client(cluster.endpoints, exactly_once=False, stream=True) as client:
        status = client.status(cluster.endpoints[cluster.wait_for_leader()])
        with pytest.raises(ConditionFailed) as streamed:
            client.append(b"x", if_next=1)
        assert streamed.value.next_position is not None and streamed.value.next_position > 1
        end = client.append(b"y")[0]
        assert end >= status.end
        client.truncate(end)
        with pytest.raises(Truncated) as truncated:
            client.append(b"z", if_next=end - 1)
        assert truncated.value.begin == end
        # The epoch survives the truncation of the EPOCH entries.
        with pytest.raises(ConditionFailed):
            client.append(b"stale writer", epoch=1)
        assert client.append(b"current writer", epoch=client.take_epoch())


def test_the_cli_appends_only_if_the_condition_holds(cluster):
    cluster.wait_for_leader()

    def rlog(*args: str) -> subprocess.CompletedProcess[bytes]:
        command = [sys.executable, "-m", "rlog.tools.cli", *args, "-e", cluster.endpoint]
        return subprocess.run(command, capture_output=True, timeout=60)

    (position,) = rlog("append", "one").stdout.split()
    next_position = int(position) + 1
    refused = rlog("append", "--if-next", str(next_position + 7), "two")
    assert refused.returncode == 1
    assert f"the next position is {next_position}" in refused.stderr.decode()
    assert len(refused.stderr.decode().strip().splitlines()) == 1
    done = rlog("append", "--if-next", str(next_position), "two", "three")
    assert done.stdout.split() == [str(next_position).encode(), str(next_position + 1).encode()]
    epoch = int(rlog("epoch", "take").stdout)
    assert rlog("append", "--epoch", str(epoch), "four").returncode == 0
    rlog("epoch", "take")
    fenced = rlog("append", "--epoch", str(epoch), "five")
    assert fenced.returncode == 1 and "fenced" in fenced.stderr.decode()


def test_a_retried_session_append_keeps_its_positions_through_a_kill_and_a_restart(cluster):
    leader = cluster.wait_for_leader()
    with Client(cluster.endpoints) as client:
        session, window, secret = client.open_session()
        assert window == WINDOW
        request = pb.AppendRequest(
            values=[b"once-a", b"once-b"], session=session, sequence=1, session_secret=secret
        )
        original = raw_append(cluster.endpoints[leader], request)
        assert len(original) == 2
        assert raw_append(cluster.endpoints[(leader + 1) % 3], request) == original
        cluster.kill(leader)
        survivor = cluster.endpoints[(leader + 2) % 3]
        assert raw_append_retrying(survivor, request) == original
        cluster.start_replica(leader)
        for i in range(3):
            cluster.restart(i)
        cluster.wait_for_leader()
        assert raw_append_retrying(cluster.endpoints[leader], request) == original
        assert values_of(client).count(b"once-a") == 1
        second = pb.AppendRequest(
            values=[b"twice"], session=session, sequence=2, session_secret=secret
        )
        (position,) = raw_append_retrying(cluster.endpoints[leader], second)
        assert position > original[-1]
        assert values_of(client).count(b"twice") == 1


def test_bad_session_requests_get_their_error_and_change_nothing(cluster):
    endpoint = cluster.endpoints[cluster.wait_for_leader()]
    with Client(cluster.endpoints, exactly_once=False) as client:
        session, _, secret = client.open_session()
        (plain,) = client.append(b"plain")
        before = values_of(client)
        cases = [
            (pb.AppendRequest(values=[b"u"], session=plain, sequence=1), UnknownSession),
            (pb.AppendRequest(values=[b"u"], session=plain + 1000, sequence=1), UnknownSession),
            (
                pb.AppendRequest(values=[b"z"], session=session, sequence=0, session_secret=secret),
                InvalidArgument,
            ),
        ]
        for request, error in cases:
            with pytest.raises(error):
                raw_append(endpoint, request)
        raw_append(
            endpoint,
            pb.AppendRequest(values=[b"s3"], session=session, sequence=3, session_secret=secret),
        )
        raw_append(
            endpoint,
            pb.AppendRequest(
                values=[b"s4"], session=session, sequence=4, acked_below=4, session_secret=secret
            ),
        )
        with pytest.raises(SequenceForgotten):
            raw_append(
                endpoint,
                pb.AppendRequest(
                    values=[b"s2"], session=session, sequence=2, session_secret=secret
                ),
            )
        assert values_of(client) == [*before, b"s3", b"s4"]
        # Past the window the session expires: its appends are refused, never re-applied.
        client.append([b"filler"] * WINDOW)
        with pytest.raises(SessionExpired) as expired:
            raw_append(
                endpoint,
                pb.AppendRequest(
                    values=[b"s3"], session=session, sequence=3, session_secret=secret
                ),
            )
        assert expired.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert values_of(client).count(b"s3") == 1


def test_the_client_opens_sessions_and_renews_them(cluster):
    """An exactly-once client keeps appending past several windows (it opens a new session
    when half of one is used), and its reads never show SESSION entries."""
    cluster.wait_for_leader()
    with Client(cluster.endpoints) as client:
        written = [f"v{i}".encode() for i in range(3 * WINDOW)]
        for value in written:
            client.append(value)
        assert values_of(client) == written


def test_a_call_waits_for_an_endpoint_to_accept_a_connection_again(tmp_path):
    """Every connection of a client cut while each replica is up but drops new connections
    for a moment: gRPC holds each channel in reconnect back-off and fails calls at once
    meanwhile. The client waits (`connect_wait`) for a connection and the append (then a
    read) goes through; with `connect_wait=0` it fails `Unavailable` naming every endpoint,
    nothing appended. (Cutting proxies made a 6-writer test fail this way in about 1 run in 7.)
    The refusals last until the test ends them, after the patient call was seen waiting: a
    timed window could close before a slow host's hasty call reached it."""
    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        cluster.wait_for_leader()
        proxies = [FaultProxy(a, 0.0, seed=i).start() for i, a in enumerate(cluster.endpoints)]
        addresses = [p.address for p in proxies]

        def refuse_everything() -> None:
            for proxy in proxies:
                proxy.refuse()
                proxy.cut_all()

        def seen_waiting(call: Future[object]) -> None:
            """The patient call is refused a connection at least once more and still waits;
            then the proxies forward again."""
            refused = sum(p.refused for p in proxies)
            wait_until(lambda: sum(p.refused for p in proxies) > refused, 30, "a refused dial")
            assert not call.done()
            for proxy in proxies:
                proxy.accept()

        try:
            with (
                Client(addresses, connect_wait=30) as patient,
                Client(addresses, connect_wait=0) as hasty,
                ThreadPoolExecutor(1) as pool,
            ):
                patient.append(b"before")
                hasty.append(b"before too")
                refuse_everything()
                with pytest.raises(Unavailable) as refused:
                    hasty.append(b"never")
                assert all(f"cannot reach {a}" in str(refused.value) for a in addresses)
                appended = pool.submit(patient.append, b"after")
                seen_waiting(appended)
                (position,) = appended.result(60)
                # Reads too (a stream per endpoint, resumed by the client).
                refuse_everything()
                with pytest.raises(Unavailable):
                    list(hasty.read())
                read = pool.submit(lambda: [e.value for e in patient.read()])
                seen_waiting(read)
                assert read.result(60)[-1] == b"after"
            with Client(cluster.endpoints) as client:
                entries = list(client.read())
            assert [e.value for e in entries] == [b"before", b"before too", b"after"]
            assert entries[-1].position == position
        finally:
            for proxy in proxies:
                proxy.stop()


def test_appends_cut_mid_flight_are_retried_and_never_duplicated(tmp_path):
    """Clients behind proxies that cut connections at random (requests or answers lost on
    real sockets): every append cut after it reached a replica has an unknown outcome and is
    re-sent in its session; the log holds every acknowledged value once, at the positions
    acknowledged, and no value twice."""
    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        cluster.wait_for_leader()
        proxies = [FaultProxy(a, 0.05, seed=i).start() for i, a in enumerate(cluster.endpoints)]
        try:
            acknowledged: dict[int, bytes] = {}
            retried = 0

            async def writer(i: int) -> None:
                nonlocal retried
                order = [p.address for p in proxies[i % 3 :] + proxies[: i % 3]]
                async with AsyncClient(order, append_timeout=60) as client:
                    for n in range(150):
                        values = [f"w{i}-{n}-{k}".encode() for k in range(3)]
                        positions = await client.append(values)
                        for position, value in zip(positions, values, strict=True):
                            assert position not in acknowledged
                            acknowledged[position] = value
                    retried += client.retried_appends

            async def writers() -> None:
                await asyncio.gather(*(writer(i) for i in range(6)))

            asyncio.run(writers())
            assert sum(p.cuts for p in proxies) > 0
            assert retried > 0
        finally:
            for proxy in proxies:
                proxy.stop()
        with Client(cluster.endpoints) as client:
            entries = list(client.read())
        values = [e.value for e in entries]
        assert len(values) == len(set(values)) == 6 * 150 * 3
        assert {e.position: e.value for e in entries} == acknowledged
