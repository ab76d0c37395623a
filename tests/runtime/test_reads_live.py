"""Reads against a real 3-replica log (`DevCluster`, real processes, SIGSTOP as the fault):
read-your-writes on stale reads (`min_position`), where a non-stale `Tail` starts, how long
its start waits for a leader that stopped answering, and what `Status` says of a leader
that cannot confirm its leadership."""

from __future__ import annotations

import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from cli_runs import assert_one_line_error, rlog
from live import append_acked, wait_until

from rlog.client import Client
from rlog.client.errors import RlogError, Unavailable
from rlog.client.packing import last_position
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.tools.dev import DevCluster
from rlog.wire import ErrorDetails, Reason

pytestmark = pytest.mark.slow

WAITING_GAUGE = "rlog_reads_waiting_min_position"


@pytest.fixture
def cluster(tmp_path):
    with DevCluster(3, tmp_path, metrics=True, election_timeout=0.5) as c:
        c.wait_for_leader()
        # Every replica answers (a leader needs only two of them up).
        c.wait_for(lambda found: all(s is not None for s in found), 30, "every replica")
        yield c


def others(cluster: DevCluster, leader: int) -> tuple[int, int]:
    rest = [i for i in range(cluster.replicas) if i != leader]
    return rest[0], rest[1]


def waiting_reads(cluster: DevCluster, i: int) -> float:
    port = cluster.metrics_ports[i]
    text = urllib.request.urlopen(f"http://{cluster.host_of(i)}:{port}/metrics", timeout=10)
    for line in text.read().decode().splitlines():
        if line.startswith(WAITING_GAUGE + " "):
            return float(line.split()[1])
    raise AssertionError(f"{WAITING_GAUGE} not exported by replica {i}")


def answers(cluster, i: int) -> bool:
    try:
        cluster.status(i, timeout=2)
    except RlogError:
        return False
    return True


def test_stale_read_with_min_position_waits_until_a_lagging_follower_learns_it(cluster):
    leader = cluster.wait_for_leader()
    follower, other = others(cluster, leader)
    with Client(cluster.endpoints[leader]) as client:
        append_acked(client, [b"before"])
        # Killed, not paused: a paused replica finds the leader's write and learned message
        # for `mine` in its socket on resuming, and learns it at once (seen under load).
        cluster.kill(follower)
        (position,) = append_acked(client, [b"mine"])  # leader and `other` are a quorum
        assert client.last_appended == position
    # Nobody can teach the follower `position` now: it is behind, and stays behind.
    cluster.pause(leader)
    cluster.pause(other)
    cluster.start_replica(follower)
    wait_until(lambda: answers(cluster, follower), 30, "the restarted follower to answer")
    assert cluster.status(follower, timeout=10).learned < position

    result: list[object] = []

    def read() -> None:
        try:
            with Client(cluster.endpoints[follower], timeout=120) as reader:
                result.append(list(reader.read(position, stale=True, min_position=position)))
        except RlogError as error:
            result.append(error)

    reader = threading.Thread(target=read)
    reader.start()
    try:
        # The read has arrived and waits (it cannot have been served: nothing is learned).
        wait_until(lambda: waiting_reads(cluster, follower) == 1, 30, "the read to wait")
        assert not result
    finally:
        cluster.resume(leader)
        cluster.resume(other)
    reader.join(120)
    assert len(result) == 1, "the read did not return"
    entries = result[0]
    assert isinstance(entries, list), entries
    assert [(e.position, e.value) for e in entries][:1] == [(position, b"mine")]
    assert waiting_reads(cluster, follower) == 0


def test_min_position_not_learned_by_the_deadline_is_a_clear_unavailable(cluster):
    leader = cluster.wait_for_leader()
    follower, _ = others(cluster, leader)
    endpoint = cluster.endpoints[follower]
    with Client(cluster.endpoints) as client:
        (position,) = append_acked(client, [b"x"])
    far = position + 10**12  # beyond anything plausible: it waits, then says how far it got
    started = time.monotonic()
    with Client(endpoint, read_timeout=3.0) as client:
        with pytest.raises(Unavailable) as caught:
            list(client.read(stale=True, min_position=far, endpoint=endpoint))
    assert time.monotonic() - started < 60
    error = caught.value
    assert error.code == grpc.StatusCode.UNAVAILABLE
    assert f"not min_position {far}" in str(error)
    assert "has learned up to position" in str(error)
    assert "\n" not in str(error)
    # The CLI: one line, exit 1.
    result = rlog("read", "-e", endpoint, "--stale", "--min-position", str(far), "--timeout", "3")
    assert_one_line_error(result, 1, f"not min_position {far}", "has learned up to position")


def test_min_position_reads_your_writes_and_below_begin_is_a_plain_read(cluster):
    leader = cluster.wait_for_leader()
    follower, _ = others(cluster, leader)
    endpoint = cluster.endpoints[follower]
    with Client(cluster.endpoints) as client:
        positions = append_acked(client, [b"a", b"b", b"c", b"d"])
        truncation = client.truncate(positions[2])
        # Read-your-writes on a follower: its stale read waits for this client's last append.
        own = list(
            client.read(
                positions[2], stale=True, min_position=client.last_appended, endpoint=endpoint
            )
        )
        assert [(e.position, e.value) for e in own] == [(positions[2], b"c"), (positions[3], b"d")]
        # Once the follower has learned the truncation, a min_position below the log's begin
        # is satisfied at once: the same as a plain stale read.
        list(client.read(stale=True, min_position=truncation, endpoint=endpoint))
        below = list(client.read(stale=True, min_position=1, endpoint=endpoint))
        plain = list(client.read(stale=True, endpoint=endpoint))
        assert below == plain
        assert [e.value for e in below] == [b"c", b"d"]


def test_non_stale_tail_needs_a_confirmed_leader_and_stale_tail_does_not(cluster):
    leader = cluster.wait_for_leader()
    follower, other = others(cluster, leader)
    with Client(cluster.endpoints) as client:
        positions = append_acked(client, [b"t1", b"t2"])
        # Healthy: a non-stale tail through a follower starts with what was acknowledged,
        # then follows new appends.
        with Client(cluster.endpoints[follower]) as tailer:
            tail = tailer.tail(positions[0])
            assert [next(tail).value, next(tail).value] == [b"t1", b"t2"]
            append_acked(client, [b"t3"])
            assert next(tail).value == b"t3"
            tail.close()
    wait_until(
        lambda: cluster.status(follower).learned >= positions[1] + 1, 30, "the follower to learn"
    )
    # The follower is cut off from every other replica: a stale tail still serves what it
    # learned; a non-stale one cannot confirm anything and fails instead of serving it.
    promised = cluster.status(follower).promised
    cluster.pause(leader)
    cluster.pause(other)
    try:
        # Wait until the follower has stood for election (a candidate promises itself first
        # and forgets the leader): it now knows it has no leader, and a non-stale tail fails
        # within its wait for one (3 election timeouts + 1 s). Asked before, it forwards the
        # tail's start to the paused leader, a call that ends only at the read's start limit
        # (Forwarding.read_start_limit: 16 s here).
        wait_until(
            lambda: cluster.status(follower, timeout=2).promised > promised,
            30,
            "the cut-off follower to stand for election",
        )
        with Client(cluster.endpoints[follower]) as tailer:
            stale = tailer.tail(positions[0], stale=True)
            assert [next(stale).value, next(stale).value] == [b"t1", b"t2"]
            stale.close()
            with pytest.raises(Unavailable):
                next(tailer.tail(positions[0]))
    finally:
        cluster.resume(leader)
        cluster.resume(other)


def test_a_tail_forwarded_to_a_stopped_leader_fails_by_the_start_limit_and_the_client_moves_on(
    tmp_path,
):
    """A follower forwards a non-stale tail's start to the leader; a leader that stopped
    answering (SIGSTOP: its connections stay open) fails it with LEADER_UNAVAILABLE by the
    read's start limit, not when gRPC's keepalive gives up (about a minute), so a client
    with more endpoints moves on to one that follows the new leader."""
    # 3 s: the tail must reach the follower while it still hears the stopped leader (up to 2
    # election timeouts); 1 s left a loaded host too little room
    election_timeout, append_timeout = 3.0, 2.0
    # Forwarding.read_start_limit: the leader's own limits to start a read, and 5 s.
    start_limit = 2 * election_timeout + append_timeout + 5
    within = start_limit + 10  # the call's own deadline, well below a keepalive's minute
    with DevCluster(
        3,
        tmp_path,
        election_timeout=election_timeout,
        replica_args=["--append-timeout", str(append_timeout)],
    ) as cluster:
        leader = cluster.wait_for_leader()
        follower, other = others(cluster, leader)
        with Client(cluster.endpoints) as writer:
            positions = append_acked(writer, [b"f1", b"f2"])
        start = pb.TailRequest(**{"from": positions[0]})
        # The old leader last, though the client would move on from it too (its
        # `start_timeout`: the next test): here the point is the follower's refusal.
        order = [cluster.endpoints[i] for i in (follower, other, leader)]
        with (
            grpc.insecure_channel(cluster.endpoints[follower]) as channel,
            Client(order) as client,
            ThreadPoolExecutor(1) as pool,
        ):
            follower_log = pbg.LogStub(channel)
            # Healthy: both tails start through the follower (whose channel to the leader
            # is then connected, as a busy replica's is).
            healthy = follower_log.Tail(start, timeout=30)
            first = next(healthy)
            healthy.cancel()
            assert last_position(first) is not None
            warm = client.tail(positions[0])
            assert next(warm).value == b"f1"
            warm.close()
            cluster.pause(leader)
            try:
                # Asked at once, while the follower still hears the leader (2 election
                # timeouts): it forwards both starts to the stopped leader.
                moved_on = pool.submit(lambda: next(client.tail(positions[0])).value)
                with pytest.raises(grpc.RpcError) as refused:
                    next(follower_log.Tail(start, timeout=within))
                code, details = refused.value.code(), refused.value.details()
                assert code == grpc.StatusCode.UNAVAILABLE, (code, details)
                why = ErrorDetails.from_metadata(refused.value.trailing_metadata())
                assert why is not None and why.reason == Reason.LEADER_UNAVAILABLE, details
                assert f"did not start the forwarded read within {start_limit:g} s" in details
                # The client took the same refusal as "try another replica": the next one
                # follows the leader elected meanwhile.
                assert moved_on.result(timeout=within) == b"f1"
                # A new leader: the follower's tail starts there.
                new_leader = cluster.wait_for_leader(exclude=[leader])
                restarted = follower_log.Tail(start, timeout=30)
                assert last_position(next(restarted)) == last_position(first)
                restarted.cancel()
            finally:
                cluster.resume(leader)
            # The old leader answers again: once it follows the new one, a tail through it
            # works too (until then it refuses it as not the leader, which is retryable).
            wait_until(
                lambda: cluster.status(leader, timeout=2).leader == cluster.endpoints[new_leader],
                30,
                "the old leader to follow the new one",
            )
            with Client(cluster.endpoints[leader]) as resumed:
                tail = resumed.tail(positions[0])
                assert [next(tail).value, next(tail).value] == [b"f1", b"f2"]
                tail.close()


def test_a_tail_whose_first_endpoint_stopped_starts_from_the_next_within_its_start_timeout(
    tmp_path,
):
    """A client's tail whose first endpoint stopped answering on an open connection
    (SIGSTOP: the connection stays, nothing comes back) gets no first answer and no answer
    to the status probe within `start_timeout` each, and starts from the next endpoint,
    not when gRPC's keepalive gives up (tens of seconds)."""
    start_timeout = 1.0
    within = 2 * start_timeout + 8  # the first answer, the probe, and room for a loaded host
    with DevCluster(3, tmp_path) as cluster:
        leader = cluster.wait_for_leader()
        order = [cluster.endpoints[i] for i in (leader, *others(cluster, leader))]
        with (
            Client(order, start_timeout=start_timeout) as client,
            ThreadPoolExecutor(1) as pool,
        ):
            positions = append_acked(client, [b"s1", b"s2"])
            # The client's connection to the leader is open (and was used just now).
            warm = client.tail(positions[0])
            assert next(warm).value == b"s1"
            warm.close()
            assert client.current_endpoint == cluster.endpoints[leader]
            cluster.pause(leader)
            try:
                cluster.wait_for_leader(exclude=[leader])
                tail = client.tail(positions[0])
                started = pool.submit(lambda: next(tail).value)
                assert started.result(timeout=within) == b"s1"
                assert client.current_endpoint != cluster.endpoints[leader]
                assert next(tail).value == b"s2"
                tail.close()
            finally:
                cluster.resume(leader)


def test_an_idle_tail_outlives_its_start_timeout(tmp_path):
    """A tail from the end of the log answers nothing until an entry is appended; its replica
    answers the status probe, so the client leaves the tail running however long it stays
    idle past `start_timeout` (only the start of a stopped endpoint's stream is cut)."""
    # Not tiny: the probe must be answered within it, and a replica of a loaded host (the
    # unit suite runs beside the e2e suites in `make test`) missed 0.2 s.
    start_timeout = 2.0
    with DevCluster(1, tmp_path) as cluster:
        cluster.wait_for_leader()
        with (
            Client(cluster.endpoints, start_timeout=start_timeout) as client,
            ThreadPoolExecutor(1) as pool,
        ):
            [last] = append_acked(client, [b"before"])
            tail = client.tail(last + 1)
            first = pool.submit(lambda: next(tail).value)
            # Idle: the time is the point here (past the first answer's bound and the probe),
            # there is no condition to wait for.
            time.sleep(2.5 * start_timeout)
            assert not first.done(), first.exception()
            append_acked(client, [b"after"])
            assert first.result(timeout=30) == b"after"
            tail.close()


def test_an_isolated_leader_never_reports_a_confirmed_leadership(tmp_path):
    # A longer election timeout: the leader stays leader (unconfirmed) while it is asked.
    with DevCluster(3, tmp_path, election_timeout=2.0) as cluster:
        leader = cluster.wait_for_leader()
        healthy = cluster.status(leader, timeout=10)
        assert (healthy.role, healthy.leader_confirmed) == ("leader", True)
        assert healthy.leader == cluster.endpoints[leader]
        for i in others(cluster, leader):
            cluster.pause(i)
        try:
            # Answered (not an error) although no quorum answers; never "leader".
            isolated = cluster.status(leader, timeout=10)
            assert not isolated.leader_confirmed
            assert isolated.role == "follower", isolated.role
            assert isolated.leader == ""
        finally:
            for i in others(cluster, leader):
                cluster.resume(i)


def test_many_tail_readers_share_chunks_and_each_gets_every_entry(cluster):
    """16 Tail readers on one replica follow appends of small and large values (one larger
    than a Tail response, which goes whole): each receives exactly the appended entries, in
    order, though they share the chunks read for one another (rlog.runtime.shared_chunks).
    A reader that starts below a truncation gets TRUNCATED even where a chunk was kept."""
    import asyncio

    from rlog.client import AsyncClient
    from rlog.client.errors import Truncated

    readers, target = 16, 0
    values = [b"small-%d" % i for i in range(300)] + [b"L" * (600 << 10)]
    values += [b"after-%d-" % i + b"x" * 2000 for i in range(500)]

    async def scenario() -> None:
        async with AsyncClient(cluster.endpoints) as writer:
            first = (await writer.append([b"start"]))[0]

            async def read(n: int) -> list[tuple[int, bytes]]:
                got: list[tuple[int, bytes]] = []
                async with AsyncClient(cluster.endpoints[target]) as tailer:
                    async for entry in tailer.tail(first + 1, stale=True):
                        got.append((entry.position, entry.value))
                        if len(got) == n:
                            return got
                return got

            tasks = [asyncio.create_task(read(len(values))) for _ in range(readers)]
            positions: list[int] = []
            for i in range(0, len(values), 50):
                positions += await writer.append(values[i : i + 50])
            results = await asyncio.wait_for(asyncio.gather(*tasks), 120)
            expected = list(zip(positions, values, strict=True))
            for got in results:
                assert got == expected
            # Truncate past the start: a new reader from there is refused, not served a
            # chunk kept from before the truncation.
            await writer.truncate(positions[10])
            for _ in range(600):  # a stale tail serves the replica's own view: wait for it
                if (await writer.status(cluster.endpoints[target])).begin >= positions[10]:
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError("the truncation never reached the tailed replica")
            async with AsyncClient(cluster.endpoints[target]) as late:
                with pytest.raises(Truncated):
                    async for _ in late.tail(first + 1, stale=True):
                        break

    asyncio.run(scenario())
    url = f"http://{cluster.host_of(target)}:{cluster.metrics_ports[target]}/metrics"
    with urllib.request.urlopen(url, timeout=10) as page:
        text = page.read().decode()
    counts = {
        source: float(line.split()[-1])
        for line in text.splitlines()
        for source in ("read", "shared")
        if line.startswith(f'rlog_tail_chunks_total{{source="{source}"}}')
    }
    # Most responses were shared: 16 readers, far fewer reads from storage.
    assert counts["shared"] > counts["read"] > 0, counts
