"""Damage found at open is repaired once (docs/faults.md, "A corrupt record"): a segment frame
that fails its CRC is skipped and the replica turned RECOVERING (`open_core`); once that is
on record the frame is blanked in place, so the next open finds neither the damage nor a
reason to recover again. On real files, through the replica's own open path.

Without the blanking, the damaged frame stayed in its segment: every open reported it again
and sent the replica back to RECOVERING, even after it had recovered from its peers; after a
power cut of every replica, two such replicas left one VOTING of three, and no leader.
"""

from __future__ import annotations

from pathlib import Path

from engines import run

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.repair import CORRUPT_REPAIRED, StorageFaults, open_core
from rlog.storage import WriteBatch, open_storage
from rlog.storage.segment_format import FRAME_HEADER, frame_header

MARK = b"MARKED-VALUE-0123456789"


def _frames(segment: Path) -> list[tuple[int, int]]:
    """(start, end) of every frame of a segment."""
    data = segment.read_bytes()
    found, off = [], 0
    while off + FRAME_HEADER.size <= len(data):
        end = off + FRAME_HEADER.size + frame_header(data, off)[0]
        found.append((off, end))
        off = end
    return found


def _open(data: Path) -> tuple[ReplicaCore, StorageFaults]:
    store = open_storage(data, "segment")
    faults = StorageFaults(ReplicaMetrics(0))
    return open_core(store, faults), faults


def test_a_damaged_frame_repaired_at_open_is_not_found_again(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = open_storage(data, "segment")
    meta = pb.Metadata(status=pb.VOTING, promised=7, log_id="repair", learned_below=41)
    store.apply(WriteBatch(runs=[run(1, 10, b"a")], metadata=meta))
    store.apply(WriteBatch(actions=[pb.Action(position=11, type=pb.APPEND, value=MARK)]))
    store.apply(WriteBatch(runs=[run(12, 29, b"b")]))
    store.close()
    (segment,) = sorted((data / "segments").glob("*.seg"))
    blob = bytearray(segment.read_bytes())
    at = blob.find(MARK)
    blob[at + 3] ^= 0x20  # a bit flip inside a synced frame with frames after it
    segment.write_bytes(bytes(blob))
    frames = _frames(segment)
    assert len(frames) == 4  # the checkpoint, three batches

    core, faults = _open(data)
    try:
        assert faults.condition == CORRUPT_REPAIRED and "fails its CRC" in faults.fault
        assert core.status == pb.RECOVERING and core.storage.get(11) is None
    finally:
        core.storage.close()
    # The frames keep their extents; the repair's own batch (RECOVERING, nothing learned)
    # follows them.
    assert _frames(segment)[:4] == frames and len(_frames(segment)) == 5

    # Reopened (as after the replica recovered, or after a power cut): no damage, so no new
    # reason to recover; what the repair stored (RECOVERING, nothing learned) is kept.
    core, faults = _open(data)
    try:
        assert core.storage.damage() == []
        assert MARK[:3] not in segment.read_bytes()[at : at + len(MARK)]  # blanked
        assert faults.condition == "" and faults.fault == ""
        assert core.status == pb.RECOVERING and core.storage.metadata().learned_below <= 1
        assert [a.value for a in core.storage.scan(10, 12)] == [b"a:10", b"b:12"]
        # Recovered (the peers' copy of position 11 written, VOTING again) ...
        meta = core.storage.metadata()
        meta.status, meta.learned_below = pb.VOTING, 41
        core.storage.apply(
            WriteBatch(actions=[pb.Action(position=11, type=pb.APPEND, value=MARK)], metadata=meta)
        )
    finally:
        core.storage.close()
    # ... it stays VOTING at the next open: the repaired frame counts as no new damage.
    core, faults = _open(data)
    try:
        assert faults.condition == "" and core.status == pb.VOTING
        assert core.storage.get(11) is not None and core.storage.get(11).value == MARK
    finally:
        core.storage.close()
