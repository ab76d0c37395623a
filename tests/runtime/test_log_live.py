"""A real 3-replica log: `rlog replica` processes on 127.0.0.x, real disks, real faults
(SIGKILL, SIGSTOP, full restarts). Every acknowledged append is checked on every replica with
the consistency checker."""

from __future__ import annotations

import asyncio
import platform
import signal
import time

import pytest
from live import Writers, append_acked, check

import rlog
from rlog import allocator
from rlog.client import AsyncClient, Client
from rlog.client.errors import RlogError
from rlog.protocol.peer_version import PROTOCOL as PEER_PROTOCOL
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow


@pytest.fixture
def cluster(tmp_path):
    with DevCluster(3, tmp_path, distinct_hosts=True, election_timeout=0.5) as c:
        yield c


def test_eight_clients_twenty_thousand_entries_identical_everywhere(cluster):
    writers = Writers(cluster.endpoints, clients=8, per_call=5)
    asyncio.run(writers.run(limit=20_000))
    assert len(writers.acknowledged) >= 20_000
    report = check(cluster, writers.acknowledged)
    # Identical entries in identical order on every replica.
    first = report.replicas[0].entries
    assert all(view.entries == first for view in report.replicas)
    assert len(first) >= 20_000


def test_leader_sigkill_mid_stream_loses_nothing(cluster):
    writers = Writers(cluster.endpoints, clients=8, per_call=2)

    async def scenario() -> tuple[int, int]:
        task = asyncio.create_task(writers.run())
        await asyncio.sleep(2.0)
        old_leader = cluster.leader()
        assert old_leader is not None
        before = len(writers.acknowledged)
        cluster.kill(old_leader, signal.SIGKILL)
        new_leader = await asyncio.to_thread(cluster.wait_for_leader, 30, [old_leader])
        assert new_leader != old_leader
        target = len(writers.acknowledged) + 500
        deadline = time.monotonic() + 60
        while len(writers.acknowledged) < target and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        writers.stop()
        await task
        return old_leader, before

    old_leader, before = asyncio.run(scenario())
    assert len(writers.acknowledged) >= before + 500, "the new leader must serve appends"
    cluster.start_replica(old_leader)
    check(cluster, writers.acknowledged)


def test_paused_follower_does_not_stop_appends(cluster):
    writers = Writers(cluster.endpoints, clients=4, per_call=2)
    leader = cluster.wait_for_leader()
    follower = next(i for i in range(3) if i != leader)
    # Writers avoid the paused replica as their first endpoint.
    writers.endpoints = [cluster.endpoints[i] for i in range(3) if i != follower]

    async def scenario() -> int:
        task = asyncio.create_task(writers.run())
        await asyncio.sleep(1.0)
        cluster.pause(follower)
        during_start = len(writers.acknowledged)
        # Appends go on while it is paused: wait for 100 more (at most 60 s), not a fixed time.
        for _ in range(600):
            if len(writers.acknowledged) - during_start > 100:
                break
            await asyncio.sleep(0.1)
        during = len(writers.acknowledged) - during_start
        cluster.resume(follower)
        await asyncio.sleep(1.0)
        writers.stop()
        await task
        return during

    acknowledged_while_paused = asyncio.run(scenario())
    assert acknowledged_while_paused > 100
    check(cluster, writers.acknowledged)


def test_restart_all_three_keeps_everything(cluster):
    writers = Writers(cluster.endpoints, clients=4, per_call=10)
    asyncio.run(writers.run(limit=3_000))
    before = check(cluster, writers.acknowledged)
    for i in range(3):
        cluster.kill(i, signal.SIGKILL)
    for i in range(3):
        cluster.start_replica(i)
    cluster.wait_for_leader()
    after = check(cluster, writers.acknowledged)
    assert [v.entries for v in after.replicas] == [v.entries for v in before.replicas]
    # And the log still takes appends after the restart.
    with Client(cluster.endpoints) as client:
        (position,) = append_acked(client, [b"after restart"])
        assert position > max(writers.acknowledged)


def test_append_without_quorum_fails_after_its_timeout(tmp_path):
    with DevCluster(
        3, tmp_path, election_timeout=0.5, replica_args=["--append-timeout", "2"]
    ) as cluster:
        leader = cluster.wait_for_leader()
        # The client re-sends an append of unknown outcome in its session until its own
        # deadline (8 s here), then raises: still well within 20 s.
        with Client(cluster.endpoints[leader], append_timeout=8) as client:
            append_acked(client, [b"with quorum"])
            for i in range(3):
                if i != leader:
                    cluster.kill(i, signal.SIGKILL)
            started = time.monotonic()
            with pytest.raises(RlogError) as failure:
                client.append([b"no quorum"])
            elapsed = time.monotonic() - started
        assert elapsed < 20
        message = str(failure.value)
        assert "quorum" in message or "timed out" in message or "leader" in message, message


def test_replicas_expose_prometheus_metrics(tmp_path):
    import urllib.request

    with DevCluster(3, tmp_path, metrics=True, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        with Client(cluster.endpoints) as client:
            append_acked(client, [b"m"] * 10)
        # A leader needs two replicas; on a loaded machine (parallel tests) the third was still
        # starting, its metrics port refusing. A replica serves metrics before it answers.
        cluster.wait_for(lambda found: all(s is not None for s in found), 30, "every replica")
        scraped = {}
        for i, port in enumerate(cluster.metrics_ports):
            assert port is not None
            url = f"http://{cluster.host_of(i)}:{port}/metrics"
            scraped[i] = urllib.request.urlopen(url, timeout=10).read().decode()
    names = (
        "rlog_replica_status",
        "rlog_replica_is_leader",
        "rlog_log_begin_position",
        "rlog_log_end_position",
        "rlog_log_learned_position",
        "rlog_replica_promised",
        "rlog_coordinator_proposal",
        "rlog_appends_total",
        "rlog_append_bytes_total",
        "rlog_append_latency_seconds_bucket",
        "rlog_fsync_latency_seconds_bucket",
        "rlog_write_batch_entries_bucket",
        "rlog_elections_total",
        "rlog_rejects_total",
        "rlog_catchup_remaining_positions",
        "rlog_initialization_permit",
        # the process, as the default registry would have it (the replica's is its own)
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "python_info",
    )
    build = (
        f'rlog_build_info{{component="replica",peer_protocol="{PEER_PROTOCOL}",'
        f'python="{platform.python_version()}",version="{rlog.__version__}"}} 1.0'
    )
    for text in scraped.values():
        missing = [name for name in names if name not in text]
        assert not missing, missing
        assert build in text
        assert 'rlog_replica_status{status="VOTING"} 1.0' in text
        assert 'rlog_storage_condition{condition="healthy"} 1.0' in text
        assert 'rlog_storage_condition{condition="disk-full"} 0.0' in text
    assert "rlog_replica_is_leader 1.0" in scraped[leader]
    appended = next(
        float(line.split()[1])
        for line in scraped[leader].splitlines()
        if line.startswith("rlog_appends_total ")
    )
    assert appended >= 10  # a retried unknown outcome may have appended twice
    # the C heap: a replica holds megabytes of it in use (modules, buffers)
    if allocator.heap() is not None:
        for text in scraped.values():
            heap = {
                line.split('"')[1]: float(line.split()[1])
                for line in text.splitlines()
                if line.startswith("rlog_heap_bytes{")
            }
            assert heap.keys() == {"in_use", "free"}, heap
            assert heap["in_use"] > 1 << 20 and heap["free"] >= 0, heap


def test_the_storage_condition_metric_says_disk_full_under_min_free_bytes(tmp_path):
    """The condition metric is read at the scrape (not set at each state change): a disk
    with less free than --min-free-bytes shows as disk-full, as Status says."""
    import urllib.request

    more_than_free = str(1 << 62)
    with DevCluster(
        3, tmp_path, metrics=True, replica_args=["--min-free-bytes", more_than_free]
    ) as cluster:
        cluster.wait_for(
            lambda found: found[0] is not None and found[0].storage_condition == "disk-full",
            what="replica 0's Status to say disk-full",
        )
        port = cluster.metrics_ports[0]
        url = f"http://{cluster.host_of(0)}:{port}/metrics"
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    assert 'rlog_storage_condition{condition="disk-full"} 1.0' in text
    assert 'rlog_storage_condition{condition="healthy"} 0.0' in text


def test_coalesced_stream_appends_split_positions_and_isolate_a_bad_value(tmp_path):
    from rlog.client.errors import EntryTooLarge

    with DevCluster(3, tmp_path, max_entry_size=1024, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()

        async def scenario() -> tuple[dict[int, bytes], list[BaseException]]:
            acknowledged: dict[int, bytes] = {}
            errors: list[BaseException] = []
            async with AsyncClient(cluster.endpoints[leader], stream=True) as client:

                async def writer(w: int) -> None:
                    for n in range(50):
                        value = b"x" * 2000 if (w, n) == (7, 25) else f"{w}-{n}".encode()
                        try:
                            (position,) = await client.append([value])
                        except EntryTooLarge as error:
                            errors.append(error)
                            continue
                        assert position not in acknowledged
                        acknowledged[position] = value

                await asyncio.gather(*(writer(w) for w in range(64)))
            return acknowledged, errors

        acknowledged, errors = asyncio.run(scenario())
        assert len(errors) == 1 and "exceeds the maximum entry size" in str(errors[0])
        assert len(acknowledged) == 64 * 50 - 1
        check(cluster, acknowledged)


def test_big_entries_are_read_and_caught_up_in_bounded_messages(tmp_path):
    """30 entries of 3 MiB (90 MiB, over gRPC's 64 MiB message limit if sent at once): a
    read and a wiped replica's catch-up must split them into bounded messages."""
    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        acknowledged: dict[int, bytes] = {}
        with Client(cluster.endpoints[leader], append_timeout=60) as client:
            for call in range(6):
                values = [bytes([call * 5 + k]) * (3 << 20) for k in range(5)]
                acknowledged.update(zip(append_acked(client, values), values, strict=True))
            read = {e.position: e.value for e in client.read(from_=min(acknowledged))}
        assert read == acknowledged
        victim = next(i for i in range(3) if i != leader)
        cluster.wipe(victim)
        cluster.start_replica(victim)
        check(cluster, acknowledged)
