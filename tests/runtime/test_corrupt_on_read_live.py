"""A corrupt record met on read, not at open (docs/faults.md, "A corrupt record"), on real
replica processes and files: a byte flipped in a synced frame of an older segment of a
stopped follower, one its index snapshot covers (so the segment is not replayed at open and
the damage is met when the record is read: first by the admission state's scan at start).

The follower must hand the record to the repair, recover it from its peers and come back
VOTING; restarted, it must not find the record corrupt again: it comes up VOTING at once,
with no second repair, and serves the peers' copy.

Without the fix, the admission scan at start died with the error ("Task exception was never
retrieved"): the record was neither dropped nor repaired, and every later start met it again.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from live import Writers, check

from rlog.client import AsyncClient
from rlog.config import SEGMENT_BYTES_ENV
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.repair import CORRUPT_REPAIRED
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

SEGMENT = 16 << 10  # bytes: a few thousand appends fill dozens of segments
PER_CALL = 5  # values per append call: stored as one record (a run)


def flip_in_covered_segment(where: Path, acknowledged: dict[int, bytes]) -> int:
    """Flip the last byte of an acknowledged value stored in a segment older than the index
    snapshot (not replayed at open); the value's position."""
    (snapshot,) = where.glob("*.idx")
    covered = int(snapshot.name.split(".")[0], 16)
    segments = [p for p in sorted(where.glob("*.seg")) if int(p.name.split(".")[0], 16) < covered]
    assert segments, snapshot.name
    segment = segments[len(segments) // 2]
    blob = bytearray(segment.read_bytes())
    for position, value in sorted(acknowledged.items()):
        at = blob.find(value)
        # Values are `w<writer>-<n>`: "w1-13" is also the start of "w1-130", so a match
        # followed by a digit may be another value's (whose record the flip would damage).
        whole = at >= 0 and not blob[at + len(value) : at + len(value) + 1].isdigit()
        if whole and blob.find(value, at + 1) < 0:
            blob[at + len(value) - 1] ^= 0x01
            segment.write_bytes(bytes(blob))
            return position
    raise AssertionError(f"no acknowledged value found in {segment.name}")


async def read_one(endpoint: str, position: int) -> bytes:
    async with AsyncClient([endpoint], timeout=10) as client:
        async for entry in client.read(position, position, stale=True, endpoint=endpoint):
            return bytes(entry.value)
    raise AssertionError(f"position {position} not read")


def test_a_record_corrupt_on_read_is_repaired_once_and_not_found_again(tmp_path: Path) -> None:
    env = {**os.environ, SEGMENT_BYTES_ENV: str(SEGMENT)}
    with DevCluster(
        3, tmp_path, distinct_hosts=True, election_timeout=0.5, storage_engine="segment", env=env
    ) as cluster:
        writers = Writers(cluster.endpoints, clients=4, per_call=PER_CALL)
        asyncio.run(writers.run(limit=3000))
        leader = cluster.wait_for_leader()
        victim = next(i for i in range(3) if i != leader)
        cluster.stop_replica(victim)
        position = flip_in_covered_segment(
            cluster.data_dir(victim) / "segments", writers.acknowledged
        )

        cluster.start_replica(victim)
        log = cluster.log_file(victim)
        # Done: the repair's catch-up ended (its log line) and the replica votes again.
        cluster.wait_for(
            lambda found: (
                found[victim] is not None
                and found[victim].corrupt_records >= 1
                and found[victim].status == pb.VOTING
                and "RECOVERING -> VOTING" in log.read_text()
            ),
            60,
            "the damaged follower repaired and VOTING again",
        )
        status = cluster.status(victim)
        assert status.storage_condition == CORRUPT_REPAIRED, status
        first_run = log.read_text()
        assert "Task exception was never retrieved" not in first_run
        # The flipped record was the one dropped: a run of one call's values (`per_call`)
        # is stored under its first position, at most per_call - 1 before the value's.
        dropped = [
            int(p) for p in re.findall(r"stored record at position (\d+) is corrupt", first_run)
        ]
        assert any(position - PER_CALL < p <= position for p in dropped), (position, dropped)

        # Restarted: nothing is found corrupt again, no second repair.
        cluster.stop_replica(victim)
        cluster.start_replica(victim)
        cluster.wait_for(
            lambda found: found[victim] is not None and found[victim].status == pb.VOTING,
            60,
            "the repaired follower VOTING after a restart",
        )
        value = asyncio.run(read_one(cluster.endpoints[victim], position))
        assert value == writers.acknowledged[position]
        status = cluster.status(victim)
        assert status.corrupt_records == 0 and status.storage_condition == "", status
        second_run = log.read_text()[len(first_run) :]
        assert "status VOTING" in second_run, second_run
        assert "is corrupt" not in second_run and "RECOVERING" not in second_run, second_run
        report = check(cluster, writers.acknowledged)
        entries = [view.entries for view in report.replicas]
        assert entries[victim] == entries[leader]
