"""Disk faults on 3 real replica processes under write load (docs/faults.md): bytes flipped
in a replica's data file while it runs, a disk that fills up (a truncated data file:
tests/runtime/test_storage_lost_live.py).

Each test keeps clients appending throughout and ends with the consistency check: every
acknowledged entry is in the log, identical on every replica. Every read the tests make
while a fault is in place is compared with what was acknowledged: no damaged value is ever
served.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from live import Writers, check, logged
from tmpfs import remount, tiny_tmpfs

from rlog.client import AsyncClient
from rlog.client.errors import (
    DataCorrupt,
    OutcomeUnknown,
    ResourceExhausted,
    RlogError,
    Timeout,
)
from rlog.config import SLOW_SELF_ENV
from rlog.proto import rlog_pb2 as pb
from rlog.tools import consistency
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

DATA_FILES = {"lmdb": "lmdb/data.mdb", "segment": "segments"}


def data_files(cluster: DevCluster, i: int) -> list[Path]:
    where = cluster.data_dir(i) / DATA_FILES[cluster.storage_engine]
    return sorted(where.glob("*.seg")) if where.is_dir() else [where]


def flip_everywhere(paths: list[Path], needle: bytes) -> int:
    """Change one byte of every copy of `needle` in the files, in place (the replica keeps
    them open: LMDB sees it through its map, the segment engine through its next pread)."""
    copies = 0
    for path in paths:
        with open(path, "r+b") as f:
            blob = f.read()
            at = blob.find(needle)
            while at >= 0:
                f.seek(at + len(needle) - 1)
                f.write(bytes([blob[at + len(needle) - 1] ^ 0x01]))
                copies += 1
                at = blob.find(needle, at + 1)
    return copies


async def stale_read_checked(
    endpoint: str, acknowledged: dict[int, bytes], last: int
) -> tuple[set[int], bool]:
    """Read [1, last] from one replica's own entries; every value read must be the
    acknowledged one. (positions read, whether the replica refused with CORRUPT_RECORD)"""
    read: set[int] = set()
    async with AsyncClient([endpoint], timeout=10) as client:
        try:
            async for entry in client.read(1, last, stale=True, endpoint=endpoint):
                if entry.position in acknowledged:
                    assert entry.value == acknowledged[entry.position], (
                        f"position {entry.position}: read {entry.value!r}, "
                        f"acknowledged {acknowledged[entry.position]!r}"
                    )
                read.add(entry.position)
        except DataCorrupt:
            return read, True
        except RlogError:
            return read, False  # e.g. NOT_VOTING while it repairs
    return read, False


@pytest.mark.parametrize("engine", ["lmdb", "segment"])
def test_bytes_flipped_under_a_running_follower_are_never_served_and_repaired(
    engine: str, tmp_path: Path
) -> None:
    with DevCluster(
        3, tmp_path, distinct_hosts=True, election_timeout=0.5, storage_engine=engine
    ) as cluster:
        writers = Writers(cluster.endpoints, clients=4, per_call=5)
        leader = cluster.wait_for_leader()
        victim = next(i for i in range(3) if i != leader)
        outcome: dict[str, object] = {}

        async def scenario() -> None:
            task = asyncio.create_task(writers.run())
            while len(writers.acknowledged) < 2000:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            # Damage three acknowledged values in the victim's files.
            targets = sorted(writers.acknowledged)[100:1500:600]
            flips = sum(
                flip_everywhere(data_files(cluster, victim), writers.acknowledged[p])
                for p in targets
            )
            outcome["flips"] = flips
            last = max(writers.acknowledged)
            refused = 0
            for _ in range(20):
                snapshot = dict(writers.acknowledged)
                _, corrupt = await stale_read_checked(cluster.endpoints[victim], snapshot, last)
                refused += corrupt
                status = await asyncio.to_thread(cluster.status, victim)
                if status.corrupt_records >= 1 and status.status == pb.VOTING and not corrupt:
                    break
                await asyncio.sleep(0.5)
            outcome["refused"] = refused
            await asyncio.to_thread(
                cluster.wait_for,
                lambda found: (
                    found[victim] is not None
                    and found[victim].status == pb.VOTING
                    and found[victim].corrupt_records >= 1
                ),
                60,
                "the damaged replica repaired and VOTING",
            )
            # Repaired: the whole log reads back from it, as acknowledged.
            acked = dict(writers.acknowledged)
            read, corrupt = await stale_read_checked(cluster.endpoints[victim], acked, last)
            outcome["read_after"] = len(read)
            assert not corrupt
            assert {p for p in acked if p <= last} <= read
            # And it restarts on that data dir (the segment engine skips the damaged frame
            # at open and recovers everything again; LMDB no longer holds the damage).
            # (From this thread: a replica started from a worker thread dies with it.)
            cluster.restart(victim)
            await asyncio.to_thread(
                cluster.wait_for,
                lambda found: found[victim] is not None and found[victim].status == pb.VOTING,
                90,
                "the restarted replica VOTING",
            )
            writers.stop()
            await task

        asyncio.run(scenario())
        assert int(outcome["flips"]) >= 3  # type: ignore[call-overload]
        logged(cluster, victim, "is corrupt", "RECOVERING -> VOTING")
        check(cluster, writers.acknowledged)


class PaddedWriters:
    """Appenders of 2 KiB values (to fill a small disk fast) that count DISK_FULL refusals,
    and the appends that ran out of time (a refusal that never came). `stream`: the clients
    append on the `AppendStream`."""

    def __init__(
        self,
        endpoints: list[str],
        clients: int = 4,
        stream: bool = False,
        append_timeout: float = 10,
    ) -> None:
        self.endpoints = endpoints
        self.clients = clients
        self.stream = stream
        self.append_timeout = append_timeout
        self.acknowledged: dict[int, bytes] = {}
        self.disk_full = 0
        self.disk_full_error = ""
        self.timeouts = 0
        self.timeout_error = ""
        self.other_failures = 0
        self.last_error = ""
        self._seq = itertools.count()
        self._stop = asyncio.Event()

    async def _writer(self, i: int) -> None:
        async with AsyncClient(
            self.endpoints, append_timeout=self.append_timeout, stream=self.stream
        ) as client:
            while not self._stop.is_set():
                values = [b"%d-%d-" % (i, next(self._seq)) + b"p" * 2048 for _ in range(4)]
                try:
                    positions = await client.append(values)
                except ResourceExhausted as exc:
                    self.disk_full += 1
                    self.last_error = self.disk_full_error = str(exc)
                    await asyncio.sleep(0.05)
                    continue
                except (OutcomeUnknown, RlogError) as exc:
                    if isinstance(exc, Timeout):
                        self.timeouts += 1
                        self.timeout_error = str(exc)
                    self.other_failures += 1
                    self.last_error = str(exc)
                    await asyncio.sleep(0.05)
                    continue
                for position, value in zip(positions, values, strict=True):
                    self.acknowledged[position] = value

    async def run(self) -> None:
        await asyncio.gather(*(self._writer(i) for i in range(self.clients)))

    def stop(self) -> None:
        self._stop.set()

    async def until_refused(self, count: int = 20, within: float = 120) -> None:
        """Wait for `count` DISK_FULL refusals; fail saying what came instead."""
        deadline = time.monotonic() + within
        while self.disk_full < count and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        assert self.disk_full >= count, (
            f"no DISK_FULL refusal: {self.other_failures} other failures, last: {self.last_error}"
        )

    async def until_resumed(self, more: int = 400, within: float = 60) -> None:
        """Wait for `more` values acknowledged beyond those acknowledged now."""
        target = len(self.acknowledged) + more
        deadline = time.monotonic() + within
        while len(self.acknowledged) < target and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        assert len(self.acknowledged) >= target, "appends did not resume"


def disk_cluster(
    tmp_path: Path, engine: str, min_free_bytes: int, env: dict[str, str] | None = None
) -> DevCluster:
    """3 replicas on distinct loopback hosts (each data dir gets its own tmpfs in the test)
    keeping `min_free_bytes` free (--min-free-bytes), with `env` added to their environment."""
    return DevCluster(
        3,
        tmp_path / "log",
        distinct_hosts=True,
        election_timeout=0.5,
        storage_engine=engine,
        replica_args=["--min-free-bytes", str(min_free_bytes)],
        env={**os.environ, **env} if env else None,
    )


@pytest.mark.parametrize("engine", ["lmdb", "segment"])
def test_full_disks_refuse_appends_keep_reads_and_recover_when_space_returns(
    engine: str, tmp_path: Path
) -> None:
    # 8 MiB of each 16 MiB disk kept for promises and elections (--min-free-bytes).
    cluster = disk_cluster(tmp_path, engine, min_free_bytes=8 << 20)
    disks = []
    try:
        with contextlib.ExitStack() as stack:
            for i in range(3):
                disks.append(stack.enter_context(tiny_tmpfs(cluster.data_dir(i), "16m")))
            with cluster:
                writers = PaddedWriters(cluster.endpoints)
                seen: dict[str, object] = {}

                async def scenario() -> None:
                    task = asyncio.create_task(writers.run())
                    await writers.until_refused()
                    seen["error"] = writers.last_error
                    statuses = await asyncio.to_thread(cluster.statuses)
                    seen["full"] = [s.disk_full for s in statuses if s is not None]
                    # Reads go on: the leader's consistent read and each replica's own.
                    acked = dict(writers.acknowledged)
                    last = max(acked)
                    async with AsyncClient(cluster.endpoints, timeout=20) as client:
                        got = {e.position: e.value async for e in client.read(1, last)}
                    assert all(got[p] == v for p, v in acked.items())
                    for endpoint in cluster.endpoints:
                        _, corrupt = await stale_read_checked(endpoint, acked, last)
                        assert not corrupt
                    seen["acked_when_full"] = len(acked)
                    for disk in disks:
                        remount(disk, "128m")
                    await writers.until_resumed()
                    writers.stop()
                    await task

                asyncio.run(scenario())
                assert "--min-free-bytes" in str(seen["error"]) or "no space left" in str(
                    seen["error"]
                )
                assert any(seen["full"])  # type: ignore[call-overload]
                statuses = cluster.statuses()
                assert not any(s.disk_full for s in statuses if s is not None)
                check(cluster, writers.acknowledged)
    finally:
        cluster.stop()


@pytest.mark.parametrize("engine", ["lmdb", "segment"])
def test_a_leaders_full_disk_answers_stream_appends_disk_full(engine: str, tmp_path: Path) -> None:
    # No space kept (--min-free-bytes 0): the leader's writes run into the file system's own
    # ENOSPC. Only the leader's disk stays small: the followers keep a quorum (promises,
    # elections), so the leader stays and refuses. Every append on the stream must be
    # answered, DISK_FULL or its positions; one never answered would end with the client's
    # deadline (60 s), a Timeout, counted apart.
    cluster = disk_cluster(tmp_path, engine, min_free_bytes=0)
    disks = []
    try:
        with contextlib.ExitStack() as stack:
            for i in range(3):
                disks.append(stack.enter_context(tiny_tmpfs(cluster.data_dir(i), "16m")))
            with cluster:
                leader = cluster.wait_for_leader()
                for i in range(3):
                    if i != leader:
                        remount(disks[i], "256m")
                writers = PaddedWriters(cluster.endpoints, stream=True, append_timeout=60)
                seen: dict[str, object] = {}

                async def scenario() -> None:
                    task = asyncio.create_task(writers.run())
                    await writers.until_refused()
                    seen["leader"] = await asyncio.to_thread(cluster.leader)
                    seen["full"] = (await asyncio.to_thread(cluster.status, leader)).disk_full
                    remount(disks[leader], "256m")
                    await writers.until_resumed()
                    writers.stop()
                    await task  # every append sent has its answer (or its deadline)

                asyncio.run(scenario())
                assert seen["leader"] == leader and seen["full"]
                assert writers.timeouts == 0, (
                    f"{writers.timeouts} stream appends never answered: {writers.timeout_error}"
                )
                assert "no space left" in writers.disk_full_error
                # Nothing acknowledged is lost: every acknowledged value reads back from each
                # replica's own disk, identical on all three. The leader's too: it learns the
                # positions chosen while its own writes failed by pulling them from the
                # followers once space returns (without that its learned mark stayed below
                # them for good, 3 runs in about 20, and its consistent reads refused).
                report = consistency.check_sync(cluster.endpoints, writers.acknowledged, 60)
                assert report.ok, str(report)

                async def read_through_the_leader(last: int) -> dict[int, bytes]:
                    async with AsyncClient(cluster.endpoints, timeout=30) as client:
                        return {e.position: e.value async for e in client.read(1, last)}

                acked = writers.acknowledged
                got = asyncio.run(read_through_the_leader(max(acked)))
                assert all(got.get(p) == v for p, v in acked.items())
    finally:
        cluster.stop()


def fill(disk: Path) -> Path:
    """Take every free byte of the file system at `disk` with one file (removed to give the
    space back)."""
    filler = disk / "filler"
    chunk = b"\0" * (1 << 20)
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(chunk)
        except OSError:
            pass  # ENOSPC: the MiB chunks ran out, take the last bytes smaller
        for size in (1 << 16, 1 << 12, 1):
            try:
                while True:
                    f.write(chunk[:size])
            except OSError:
                pass
    assert os.statvfs(disk).f_bavail == 0
    return filler


# seconds: the leader's messages to itself, late (RLOG_TEST_SLOW_SELF). Both appends must be
# chosen by the followers within it: 1 s was too short on a saturated CI host (7 Dec: the
# second append came after the leader's own first write, so the interleaving did not happen).
SLOW_SELF = 3.0


# Attempts at the interleaving below: each checks every acknowledged value and the log's
# consistency whatever happened; the interleaving itself must happen in one of them. On a
# saturated CI host (7 Dec, two e2e workers beside the unit suite) the leader once held both
# batches while it reported its disk full: its own first write failed at 3 s, and within
# 0.1 s it had learned both batches (found some space: where from is not known yet), so the
# pull this test is about was never needed. That run proved the values, not the pull.
INTERLEAVING_ATTEMPTS = 3


@pytest.mark.parametrize("engine", ["lmdb", "segment"])
def test_a_leader_whose_own_write_failed_learns_the_chosen_batch_from_the_followers(
    engine: str, tmp_path: Path
) -> None:
    """A batch chosen by the followers while the leader could not store it: the leader
    learns it anyway once space returns, by pulling it from the followers.

    The leader's messages to itself come SLOW_SELF late (RLOG_TEST_SLOW_SELF, a slow own
    disk), which makes the interleaving reproducible: two appends are admitted and chosen by
    the followers; then the leader's own write of the first fails on its full disk, and its
    own write of the second is refused outright (its disk is known full by then), so its
    acceptor never holds that batch, and the learned message that follows carries no value
    it may store. Without the pull its learned mark stays below those positions for good
    and its consistent reads of them are refused."""
    tries = []
    for attempt in range(INTERLEAVING_ATTEMPTS):
        happened, seen = _own_write_fails_under_chosen_batches(engine, tmp_path / f"try-{attempt}")
        tries.append(seen)
        if happened:
            return
    pytest.fail(f"the leader learned the second batch while full in every attempt: {tries}")


def _own_write_fails_under_chosen_batches(engine: str, tmp_path: Path) -> tuple[bool, Any]:
    """One attempt: asserts every acknowledged value and the log's consistency; returns
    whether the interleaving happened, and what the leader had while full."""
    cluster = disk_cluster(tmp_path, engine, min_free_bytes=0, env={SLOW_SELF_ENV: str(SLOW_SELF)})
    try:
        with contextlib.ExitStack() as stack:
            disks = [stack.enter_context(tiny_tmpfs(cluster.data_dir(i), "64m")) for i in range(3)]
            with cluster:
                leader = cluster.wait_for_leader()
                seen: dict[str, Any] = {}

                def leader_has(predicate: Callable[[pb.StatusResponse], bool]) -> Callable:
                    return lambda found: found[leader] is not None and predicate(found[leader])

                async def scenario() -> dict[int, bytes]:
                    acknowledged: dict[int, bytes] = {}

                    async def append(values: list[bytes]) -> None:
                        positions = await client.append(values)
                        acknowledged.update(zip(positions, values, strict=True))

                    async with AsyncClient(cluster.endpoints, timeout=30) as client:
                        await append([b"before-%d" % i for i in range(8)])
                        last = max(acknowledged)
                        await asyncio.to_thread(
                            cluster.wait_for,
                            leader_has(lambda st: st.learned >= last),
                            30,
                            "the leader storing the first batch",
                        )
                        filler = fill(disks[leader])
                        # Both chosen by the followers before the leader's own writes start.
                        await append([b"first-%d-" % i + b"x" * (16 << 10) for i in range(8)])
                        await append([b"second-%d-" % i + b"x" * (16 << 10) for i in range(8)])
                        await asyncio.to_thread(
                            cluster.wait_for,
                            leader_has(lambda st: st.disk_full),
                            30,
                            "the leader's own write failing",
                        )
                        # the second own write comes SLOW_SELF after the second append: let
                        # it be refused before space returns
                        await asyncio.sleep(SLOW_SELF)
                        st = await asyncio.to_thread(cluster.status, leader)
                        seen["leader learned, end while full"] = (st.learned, st.end)
                        seen["acknowledged end"] = max(acknowledged)
                        filler.unlink()
                        await asyncio.to_thread(
                            cluster.wait_for,
                            leader_has(lambda st: not st.disk_full),
                            30,
                            "the leader writing again",
                        )
                        await append([b"after-%d" % i for i in range(8)])
                        seen["leader"] = await asyncio.to_thread(cluster.leader)
                        last = max(acknowledged)
                        got = {e.position: e.value async for e in client.read(1, last)}
                    assert all(got.get(p) == v for p, v in acknowledged.items()), (
                        "the leader's consistent read lacks acknowledged values"
                    )
                    return acknowledged

                acknowledged = asyncio.run(scenario())
                assert seen["leader"] == leader, seen  # it kept leading throughout
                report = consistency.check_sync(cluster.endpoints, acknowledged, 60)
                assert report.ok, str(report)
                # did the interleaving happen: the second batch not learned on the leader?
                learned_while_full, _ = seen["leader learned, end while full"]
                return learned_while_full < seen["acknowledged end"], seen
    finally:
        cluster.stop()
