"""Storage lost or damaged under a stopped follower, on real replica processes and files
(docs/faults.md, "Lost or cut segments"): a middle segment deleted, the newest segment cut
short, an index snapshot deleted or corrupted, the metadata damaged, the mark emptied; with
LMDB, data.mdb truncated. Clients append
throughout; the follower must come back VOTING by itself, its damaged files kept aside,
and every acknowledged append be readable, identical on every replica.

Without the fix, a deleted middle segment stops the replica at open ("is missing but holds
N live records") and it never comes back; a newest segment cut short comes back VOTING at
once, with no `storage_condition`, having forgotten accepts it acknowledged.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from live import Writers, check, logged

from rlog.config import SEGMENT_BYTES_ENV
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.repair import DAMAGED_PREFIX, REFUSING, STORAGE_LOST, set_aside
from rlog.storage import open_storage
from rlog.storage.base import StorageLost
from rlog.storage.segment_format import MARK_NAME
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

SEGMENT = 16 << 10  # bytes: a few thousand appends fill dozens of segments


def _segments(where: Path) -> list[Path]:
    return sorted(where.glob("*.seg"))


def delete_middle_segment(where: Path) -> str:
    segments = _segments(where)
    assert len(segments) >= 5, segments
    victim = segments[len(segments) // 2]
    victim.unlink()
    return victim.name


def cut_newest_segment(where: Path) -> str:
    newest = _segments(where)[-1]
    os.truncate(newest, newest.stat().st_size // 2)
    return newest.name


def delete_newest_segment(where: Path) -> str:
    newest = _segments(where)[-1]
    newest.unlink()
    return newest.name


def delete_snapshot(where: Path) -> str:
    (snapshot,) = where.glob("*.idx")
    snapshot.unlink()
    return snapshot.name


def corrupt_snapshot(where: Path) -> str:
    (snapshot,) = where.glob("*.idx")
    raw = bytearray(snapshot.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    snapshot.write_bytes(bytes(raw))
    return snapshot.name


def corrupt_mark(where: Path) -> str:
    mark = where / MARK_NAME
    raw = bytearray(mark.read_bytes())
    raw[12] ^= 0xFF
    mark.write_bytes(bytes(raw))
    return mark.name


def empty_mark(where: Path) -> str:
    """The mark as an older version left it when it stopped between creating the mark and
    its first write: empty."""
    os.truncate(where / MARK_NAME, 0)
    return MARK_NAME


def truncate_data_mdb(where: Path) -> str:
    """LMDB's data file cut to half: below the pages its meta page says are in use."""
    data = where / "data.mdb"
    os.truncate(data, data.stat().st_size // 2)
    return data.name


def newest_segment_has_frames(where: Path) -> bool:
    """More than the checkpoint frame that starts the newest segment (a replica stopped just
    after a roll has that frame only)."""
    return _segments(where)[-1].stat().st_size > 200


def corrupt_newest_metadata(where: Path) -> str:
    """Flip a byte of the metadata in the checkpoint frame that starts the newest segment
    (frames follow it, so it is damage, not a torn write)."""
    newest = _segments(where)[-1]
    raw = bytearray(newest.read_bytes())
    assert newest_segment_has_frames(where), "the newest segment holds one frame only"
    raw[12] ^= 0xFF  # inside the first frame's metadata
    newest.write_bytes(bytes(raw))
    return newest.name


def run_damaged_follower(
    tmp_path: Path,
    replicas: int,
    damage: Callable[[Path], str],
    condition: str,
    engine: str = "segment",
    damageable: Callable[[Path], bool] = lambda where: True,
) -> None:
    """Append through the others while one follower is stopped, damaged, restarted and
    comes back VOTING; its Status showing `condition` once back; then the consistency check.
    A follower stopped before its files allow the damage (`damageable`) is started again
    and stopped once more after it took more appends."""
    env = {**os.environ, SEGMENT_BYTES_ENV: str(SEGMENT)}
    with DevCluster(
        replicas,
        tmp_path,
        distinct_hosts=True,
        election_timeout=0.5,
        storage_engine=engine,
        env=env,
    ) as cluster:
        writers = Writers(cluster.endpoints, clients=4, per_call=5)
        leader = cluster.wait_for_leader()
        victim = next(i for i in range(replicas) if i != leader)
        writers.endpoints = [cluster.endpoints[i] for i in range(replicas) if i != victim]
        sub = "segments" if engine == "segment" else engine
        where = cluster.data_dir(victim) / sub

        async def voting_again(what: str) -> None:
            await asyncio.to_thread(
                cluster.wait_for,
                lambda found: found[victim] is not None and found[victim].status == pb.VOTING,
                90,
                what,
            )

        async def scenario() -> str:
            task = asyncio.create_task(writers.run())
            while len(writers.acknowledged) < 3000:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            cluster.stop_replica(victim)
            while not damageable(where):
                cluster.start_replica(victim)
                await voting_again("the follower VOTING before it is stopped again")
                await asyncio.sleep(0.5)  # appends it takes
                cluster.stop_replica(victim)
            await asyncio.sleep(0.5)  # appends the victim never sees
            what = damage(where)
            cluster.start_replica(victim)
            await voting_again("the damaged replica VOTING again")
            await asyncio.sleep(1)
            writers.stop()
            await task
            return what

        what = asyncio.run(scenario())
        status = cluster.status(victim)
        assert status.storage_condition == condition, (what, status)
        if condition == STORAGE_LOST:
            assert "storage lost" in status.storage_fault and what in status.storage_fault
            logged(cluster, victim, "storage lost", "RECOVERING -> VOTING")
            (aside,) = cluster.data_dir(victim).glob(f"{DAMAGED_PREFIX}*")
            kept = {p.name for p in (aside / sub).iterdir()}
            assert what in kept or (what.endswith(".seg") and len(kept) > 3), kept
        else:
            assert not list(cluster.data_dir(victim).glob(f"{DAMAGED_PREFIX}*"))
        report = check(cluster, writers.acknowledged)
        entries = [view.entries for view in report.replicas]
        assert entries[victim] == entries[leader]


@pytest.mark.parametrize("replicas", [3, 5])
def test_a_deleted_middle_segment_is_set_aside_and_recovered(tmp_path: Path, replicas: int) -> None:
    run_damaged_follower(tmp_path, replicas, delete_middle_segment, STORAGE_LOST)


def test_a_newest_segment_cut_short_is_set_aside_and_recovered(tmp_path: Path) -> None:
    run_damaged_follower(tmp_path, 3, cut_newest_segment, STORAGE_LOST)


def test_a_deleted_newest_segment_is_set_aside_and_recovered(tmp_path: Path) -> None:
    run_damaged_follower(tmp_path, 3, delete_newest_segment, STORAGE_LOST)


def test_a_corrupt_synced_mark_is_set_aside_and_recovered(tmp_path: Path) -> None:
    run_damaged_follower(tmp_path, 3, corrupt_mark, STORAGE_LOST)


def test_an_empty_synced_mark_is_no_mark_and_nothing_is_set_aside(tmp_path: Path) -> None:
    run_damaged_follower(tmp_path, 3, empty_mark, "")


def test_a_truncated_lmdb_file_is_set_aside_and_recovered(tmp_path: Path) -> None:
    """Before, the replica exited at open ("data.mdb is truncated") and stayed down until
    its data dir was removed by hand."""
    run_damaged_follower(tmp_path, 3, truncate_data_mdb, STORAGE_LOST, engine="lmdb")


@pytest.mark.parametrize("damage", [delete_snapshot, corrupt_snapshot])
def test_a_lost_index_snapshot_costs_a_full_replay(
    tmp_path: Path, damage: Callable[[Path], str]
) -> None:
    run_damaged_follower(tmp_path, 3, damage, "")


def test_corrupt_metadata_is_skipped_and_every_position_recovered(tmp_path: Path) -> None:
    run_damaged_follower(
        tmp_path,
        3,
        corrupt_newest_metadata,
        "corrupt-repaired",
        damageable=newest_segment_has_frames,
    )


def test_with_no_quorum_to_vouch_a_lost_replica_refuses_to_vote_until_one_answers(
    tmp_path: Path,
) -> None:
    """The others down: the replica whose storage was lost waits RECOVERING, then says it
    refuses to vote ("refusing"); once a quorum of VOTING replicas answers it recovers."""
    env = {**os.environ, SEGMENT_BYTES_ENV: str(SEGMENT)}
    with DevCluster(
        3, tmp_path, election_timeout=0.5, storage_engine="segment", env=env
    ) as cluster:
        writers = Writers(cluster.endpoints, clients=4, per_call=5)
        asyncio.run(writers.run(limit=4000))
        for i in range(3):
            cluster.stop_replica(i)
        what = delete_middle_segment(cluster.data_dir(0) / "segments")
        cluster.start_replica(0)
        cluster.wait_for(
            lambda found: found[0] is not None and found[0].storage_condition == REFUSING,
            60,
            "the lost replica refusing",
        )
        status = cluster.status(0)
        assert status.status == pb.RECOVERING and what in status.storage_fault
        assert "refusing to vote" in status.storage_fault
        cluster.start_replica(1)
        cluster.start_replica(2)
        cluster.wait_for(
            lambda found: all(s is not None and s.status == pb.VOTING for s in found),
            90,
            "every replica VOTING",
        )
        assert cluster.status(0).storage_condition == STORAGE_LOST
        check(cluster, writers.acknowledged)


def test_storage_set_aside_by_a_start_that_stopped_early_is_still_lost(tmp_path: Path) -> None:
    """A start that set the storage aside and stopped before it stamped the fresh store
    RECOVERING (its disk full at open, in the consistency suite) left a fresh store beside
    `damaged-*`: the next start must take it as lost (RECOVERING, storage-lost, through a
    quorum), not as a fresh EMPTY replica (which may take part in auto-initialization)."""
    with DevCluster(3, tmp_path, election_timeout=0.5, storage_engine="segment") as cluster:
        writers = Writers(cluster.endpoints, clients=4, per_call=5)
        asyncio.run(writers.run(limit=1000))
        leader = cluster.wait_for_leader()
        victim = next(i for i in range(3) if i != leader)
        cluster.stop_replica(victim)
        data = cluster.data_dir(victim)
        aside = set_aside(data, StorageLost("test: a segment is missing"))
        open_storage(data, "segment").close()  # the fresh store, never stamped
        cluster.start_replica(victim)
        cluster.wait_for(
            lambda found: found[victim] is not None and found[victim].status == pb.VOTING,
            60,
            "the victim VOTING again",
        )
        status = cluster.status(victim)
        assert status.storage_condition == STORAGE_LOST, status
        assert str(aside.where) in status.storage_fault and "earlier start" in status.storage_fault
        check(cluster, writers.acknowledged)
