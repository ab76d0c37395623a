"""A failing disk (docs/faults.md, "A failing disk"): a replica whose writes and syncs fail
with EIO, under load, on real replica processes. The errors come from a test-only shim
(tests/eio_shim/sitecustomize.py) that fails `os.write`/`writev`/`pwrite`/`fdatasync`/`fsync`
on the replica's data dir while a control file exists.

The same with EROFS (a file system the kernel remounted read-only after an error), for a
follower. The replica must leave the quorum (not VOTING, Status `storage_condition` "disk-failing"
with the reason, a log line), release what it held (a leader steps down: another one takes
over and the writes go on), and come back VOTING by itself once the disk works again;
nothing acknowledged is lost. Without the fix the replica stays VOTING with nothing said,
and stays broken after the errors stop.
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path

import pytest
from live import Writers, check

from rlog.proto import rlog_pb2 as pb
from rlog.runtime.repair import DISK_FAILING
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

SHIM = Path(__file__).parents[1] / "eio_shim"


@pytest.mark.parametrize(
    ("role", "error"), [("follower", "EIO"), ("leader", "EIO"), ("follower", "EROFS")]
)
def test_a_failing_disk_leaves_the_quorum_and_rejoins_once_it_works(
    tmp_path: Path, role: str, error: str
) -> None:
    env = {
        **os.environ,
        "RLOG_TEST_EIO": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH")) if p),
    }
    with DevCluster(
        3, tmp_path, distinct_hosts=True, election_timeout=0.5, storage_engine="segment", env=env
    ) as cluster:
        leader = cluster.wait_for_leader()
        victim = leader if role == "leader" else next(i for i in range(3) if i != leader)
        others = [i for i in range(3) if i != victim]
        writers = Writers([cluster.endpoints[i] for i in others], clients=4, per_call=5)
        control = Path(f"{cluster.data_dir(victim)}.eio")

        def failing(found: list[pb.StatusResponse | None]) -> bool:
            status = found[victim]
            return (
                status is not None
                and status.storage_condition == DISK_FAILING
                and status.status != pb.VOTING
                and status.role != "leader"
            )

        async def scenario() -> None:
            task = asyncio.create_task(writers.run())
            while len(writers.acknowledged) < 2000:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            control.write_text(error)  # noqa: ASYNC240
            await asyncio.to_thread(cluster.wait_for, failing, 30, "the victim disk-failing")
            status = cluster.status(victim)
            strerror = os.strerror(getattr(errno, error))
            assert "disk failing" in status.storage_fault and strerror in status.storage_fault
            # The others keep serving (a new leader if the victim led).
            await asyncio.to_thread(cluster.wait_for_leader, 30, [victim])
            acked = len(writers.acknowledged)
            while len(writers.acknowledged) < acked + 1000:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            assert failing(cluster.statuses(timeout=2)), "the victim rejoined on a failing disk"
            control.unlink()  # noqa: ASYNC240
            await asyncio.to_thread(
                cluster.wait_for,
                lambda found: (
                    found[victim] is not None
                    and found[victim].status == pb.VOTING
                    and found[victim].storage_condition == ""
                ),
                60,
                "the victim VOTING again, its disk healthy",
            )
            await asyncio.sleep(1)
            writers.stop()
            await task

        try:
            asyncio.run(scenario())
        finally:
            control.unlink(missing_ok=True)
        log = cluster.log_file(victim).read_text()
        assert "disk failing, leaving the quorum" in log and "takes writes again" in log
        report = check(cluster, writers.acknowledged)
        entries = [view.entries for view in report.replicas]
        assert entries[victim] == entries[others[0]]


@pytest.mark.parametrize("error", ["EIO", "EROFS"])
def test_a_replica_started_on_a_disk_that_cannot_be_written_waits_for_it(
    tmp_path: Path, error: str
) -> None:
    """A stopped follower restarted while its disk fails (EIO) or is read-only (EROFS):
    it stays up, saying why in its log, and once the disk works again it opens its store
    and comes back VOTING with every acknowledged append. Without the fix it exited at
    once ("data dir ... is not writable") and stayed down until restarted by someone."""
    env = {
        **os.environ,
        "RLOG_TEST_EIO": "1",
        "PYTHONPATH": os.pathsep.join(p for p in (str(SHIM), os.environ.get("PYTHONPATH")) if p),
    }
    with DevCluster(
        3, tmp_path, distinct_hosts=True, election_timeout=0.5, storage_engine="segment", env=env
    ) as cluster:
        leader = cluster.wait_for_leader()
        victim = next(i for i in range(3) if i != leader)
        writers = Writers([cluster.endpoints[i] for i in range(3) if i != victim], clients=4)
        control = Path(f"{cluster.data_dir(victim)}.eio")
        asyncio.run(writers.run(limit=1000))
        cluster.stop_replica(victim)
        control.write_text(error)
        try:
            cluster.start_replica(victim)
            said = "the disk cannot be written; trying again"
            deadline = time.monotonic() + 30
            while said not in cluster.log_file(victim).read_text():
                assert cluster.running(victim), cluster.log_tail(victim, 15)
                assert time.monotonic() < deadline, cluster.log_tail(victim, 15)
                time.sleep(0.1)
            assert os.strerror(getattr(errno, error)) in cluster.log_tail(victim, 5)
            assert cluster.running(victim)
            asyncio.run(writers.run(limit=2000))  # the log goes on without it
        finally:
            control.unlink(missing_ok=True)
        cluster.wait_for(
            lambda found: found[victim] is not None and found[victim].status == pb.VOTING,
            60,
            "the victim VOTING once its disk works",
        )
        report = check(cluster, writers.acknowledged)
        entries = [view.entries for view in report.replicas]
        assert entries[victim] == entries[leader]
