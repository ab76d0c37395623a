"""Replica statuses, auto-initialization and recovery on real replica processes and disks."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from live import CAPPED, Writers, append_acked, check, copying, logged, names, wait_all_voting

from rlog.client import Client
from rlog.client.errors import LogIdMismatch, RlogError, Unavailable
from rlog.initialize import initialize
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster, free_port

pytestmark = pytest.mark.slow


def statuses(cluster: DevCluster) -> list[str]:
    return names(cluster.statuses(timeout=2))


def wait_answering(cluster: DevCluster, replicas: range, timeout: float = 60) -> None:
    """Wait until these replicas answer Status at all: a process still importing its
    modules on a loaded machine reads DOWN, which says nothing about the rule under test."""
    cluster.wait_for(
        lambda found: all(found[i] is not None for i in replicas),
        timeout,
        f"replicas {list(replicas)} answering",
    )


@pytest.mark.parametrize("replicas", [3, 5])
def test_auto_initialization_with_replicas_started_up_to_5s_apart(tmp_path, replicas):
    cluster = DevCluster(
        replicas, tmp_path, initialize=False, auto_initialize=True, election_timeout=0.5
    )
    try:
        cluster.prepare()
        cluster.start_replica(0)
        wait_answering(cluster, range(1))
        gap = 5.0 / (replicas - 1)
        for i in range(1, replicas):
            time.sleep(gap)
            assert statuses(cluster)[0] in ("EMPTY", "STARTING"), "must wait for every replica"
            cluster.start_replica(i)
        wait_all_voting(cluster)
        cluster.wait_for_leader()
        with Client(cluster.endpoints) as client:
            assert append_acked(client, [b"first"])[0] >= 1  # position 0: the election's NOP
    finally:
        cluster.stop()


def test_without_a_permit_the_log_stays_empty_until_initialized(tmp_path):
    cluster = DevCluster(3, tmp_path, initialize=False, auto_initialize=False, election_timeout=0.5)
    try:
        cluster.start(wait=False)
        wait_answering(cluster, range(3))
        time.sleep(3)
        assert statuses(cluster) == ["EMPTY"] * 3
        status = cluster.status(0)
        assert "no initialization permit" in status.reason
        with Client(cluster.endpoints[0], append_timeout=10) as client:
            with pytest.raises(Unavailable) as failure:
                client.append([b"nowhere"])
        assert "EMPTY" in str(failure.value)
        # The operator's way out: initialize a quorum offline; the rest recovers.
        for i in (0, 1):
            cluster.stop_replica(i)
            initialize(cluster.data_dir(i), cluster.storage_engine)
            cluster.start_replica(i)
        wait_all_voting(cluster)
        cluster.wait_for_leader()
        with Client(cluster.endpoints) as client:
            (position,) = append_acked(client, [b"now"])
        check(cluster, {position: b"now"})
    finally:
        cluster.stop()


def test_wiped_replica_under_write_load_recovers_identical(tmp_path):
    with DevCluster(3, tmp_path, distinct_hosts=True, election_timeout=0.5) as cluster:
        writers = Writers(cluster.endpoints, clients=4, per_call=5)
        leader = cluster.wait_for_leader()
        victim = next(i for i in range(3) if i != leader)
        writers.endpoints = [cluster.endpoints[i] for i in range(3) if i != victim]

        async def scenario() -> None:
            task = asyncio.create_task(writers.run())
            await asyncio.sleep(2)
            cluster.wipe(victim)
            cluster.start_replica(victim)
            await asyncio.to_thread(
                cluster.wait_for,
                lambda found: names(found)[victim] == "VOTING",
                60,
                "the wiped replica VOTING again",
            )
            await asyncio.sleep(1)
            writers.stop()
            await task

        asyncio.run(scenario())
        logged(cluster, victim, "catching up", "RECOVERING -> VOTING")
        report = check(cluster, writers.acknowledged)
        entries = [view.entries for view in report.replicas]
        assert entries[victim] == entries[leader]


def test_two_of_five_wiped_at_once_recover_concurrently(tmp_path):
    with DevCluster(5, tmp_path, election_timeout=0.5) as cluster:
        with Client(cluster.endpoints) as client:
            acknowledged = {}
            for n in range(20):
                values = [f"v{n}-{k}".encode() for k in range(100)]
                acknowledged.update(zip(append_acked(client, values), values, strict=True))
        leader = cluster.wait_for_leader()
        victims = [i for i in range(5) if i != leader][:2]
        for i in victims:
            cluster.wipe(i)
        for i in victims:
            cluster.start_replica(i)
        wait_all_voting(cluster)
        check(cluster, acknowledged)


def test_catch_up_across_a_truncation_keeps_begin_after_restart(tmp_path):
    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        with Client(cluster.endpoints) as client:
            positions = append_acked(client, [f"e{n}".encode() for n in range(200)])
            client.truncate(positions[150])
        cluster.wipe(2)
        cluster.start_replica(2)
        wait_all_voting(cluster)
        assert cluster.status(2).begin >= positions[150]
        cluster.restart(2)
        wait_all_voting(cluster)
        assert cluster.status(2).begin >= positions[150]
        acknowledged = {p: f"e{n}".encode() for n, p in enumerate(positions) if n >= 150}
        check(cluster, acknowledged)


def test_sigkill_during_catch_up_then_it_resumes(tmp_path):
    # The copy is capped at 16 MiB/s (~41 MB: over 2 s), so the kill lands mid-copy on any host.
    with DevCluster(3, tmp_path, election_timeout=0.5, replica_args=CAPPED) as cluster:
        acknowledged = {}
        value = b"x" * 2048
        with Client(cluster.endpoints) as client:
            for _ in range(20):
                positions = append_acked(client, [value] * 1000)
                acknowledged.update(dict.fromkeys(positions, value))
        leader = cluster.wait_for_leader()
        victim = next(i for i in range(3) if i != leader)
        cluster.wipe(victim)
        cluster.start_replica(victim)
        cluster.wait_for(copying(victim, before=0.5), 60, "catch-up progress in status")
        cluster.kill(victim, signal.SIGKILL)
        log = cluster.log_file(victim).read_text()
        assert log.count("catching up") == 1 and "RECOVERING -> VOTING" not in log, log
        cluster.start_replica(victim)
        wait_all_voting(cluster, timeout=120)
        log = logged(cluster, victim, "RECOVERING -> VOTING")
        assert log.count("catching up") == 2, log  # it resumed: a second catch-up
        assert log.index("catching up [") < log.rindex("RECOVERING -> VOTING")
        check(cluster, acknowledged)


def _refusing_status(command: list[str], address: str, log_path: Path) -> pb.StatusResponse:
    """Start a replica on a data dir it must refuse; its Status once it answers (it stays
    up, refusing), checked not to turn VOTING for a few seconds."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        found = None
        with Client([address], timeout=2) as client:
            while time.monotonic() < deadline:
                try:
                    found = client.status()
                    break
                except RlogError:
                    time.sleep(0.2)
            assert found is not None, "the refusing replica never answered Status"
            time.sleep(3)
            assert client.status().status != pb.VOTING
        assert process.poll() is None, "the refusing replica exited"
        return found
    finally:
        process.terminate()
        process.wait(30)


def test_a_data_dir_of_another_log_or_replica_is_refused(tmp_path):
    """The replica stays up, answers Status with `storage_condition` "refusing" and the
    reason, never votes, and leaves the data dir as it was (runtime/repair.py)."""
    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        cluster.wait_for_leader()
        cluster.stop_replica(0)
        port = free_port()
        base = [
            sys.executable,
            "-m",
            "rlog.tools.cli",
            "replica",
            "--peers",
            cluster.endpoint,
            "--data-dir",
            str(cluster.data_dir(0)),
        ]
        other_log = _refusing_status(
            [*base, "--id", "0", "--log-id", "another-log"],
            cluster.endpoints[0],
            tmp_path / "other-log.log",
        )
        other_id = _refusing_status(
            [*base, "--id", "1", "--log-id", cluster.log_id, "--listen", f"127.0.0.1:{port}"],
            f"127.0.0.1:{port}",
            tmp_path / "other-id.log",
        )
        for found, text, log in (
            (other_log, "belongs to log", "other-log.log"),
            (other_id, "belongs to replica", "other-id.log"),
        ):
            assert found.storage_condition == "refusing", found
            assert text in found.storage_fault and text in found.reason, found
            assert found.status != pb.VOTING
            written = (tmp_path / log).read_text()
            assert text in written and "Traceback" not in written
        # The data dir was left as it was: its own replica comes back on it.
        cluster.start_replica(0)
        wait_all_voting(cluster)


def test_append_to_a_lone_replica_fails_clearly(tmp_path):
    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        with Client(cluster.endpoints[leader], append_timeout=30) as client:
            for i in range(3):
                if i != leader:
                    cluster.kill(i, signal.SIGKILL)
            with pytest.raises(RlogError):
                client.append([b"x"])


def test_the_permit_granted_at_run_time_initializes_the_log(tmp_path):
    cluster = DevCluster(
        3,
        tmp_path,
        initialize=False,
        auto_initialize=False,
        election_timeout=0.5,
        log_id="orders-uid",
    )
    try:
        cluster.start(wait=False)
        wait_answering(cluster, range(3))
        time.sleep(2)
        assert statuses(cluster) == ["EMPTY"] * 3
        with Client(cluster.endpoints) as client:
            for endpoint in cluster.endpoints:
                with pytest.raises(LogIdMismatch):
                    client.grant_permit("another-log", endpoint=endpoint)
            time.sleep(1.5)
            assert statuses(cluster) == ["EMPTY"] * 3  # a wrong identity grants nothing
            for endpoint in cluster.endpoints:
                assert client.grant_permit("orders-uid", endpoint=endpoint).permit
        wait_all_voting(cluster)
        cluster.wait_for_leader()
        with Client(cluster.endpoints) as client:
            for endpoint in cluster.endpoints:
                assert not client.revoke_permit("orders-uid", endpoint=endpoint).permit
            (position,) = append_acked(client, [b"initialized by permit"])
        check(cluster, {position: b"initialized by permit"})
    finally:
        cluster.stop()


def test_a_lagging_follower_catches_up_and_serves_stale_reads_across_a_truncation(tmp_path):
    from rlog.client.errors import Truncated

    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        follower = next(i for i in range(3) if i != leader)
        with Client(cluster.endpoints[leader]) as client:
            early = append_acked(client, [f"early-{n}".encode() for n in range(100)])
            cluster.pause(follower)  # misses the next writes and the truncation
            late = append_acked(client, [f"late-{n}".encode() for n in range(100)])
            truncated_at = client.truncate(late[50])
        cluster.resume(follower)
        with Client(cluster.endpoints[follower]) as stale:

            def caught_up(found: list[pb.StatusResponse | None]) -> bool:
                status = found[follower]
                return status is not None and status.learned >= truncated_at

            cluster.wait_for(caught_up, 30, "the follower to catch up")
            assert stale.status().begin >= late[50]
            entries = list(stale.read(from_=late[50], to=late[-1], stale=True))
            assert [e.value for e in entries] == [f"late-{n}".encode() for n in range(50, 100)]
            with pytest.raises(Truncated):
                list(stale.read(from_=early[0], stale=True))
