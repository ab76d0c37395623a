"""The mark of an unfinished restore (rlog.storage.restoring, docs/backup.md) on real data
dirs: a marked dir is never fresh, never initialized, never opened by a replica; a restore
run again discards only what a restore writes; a running peer makes the dir fresh again.
And the manifest's chain check lists every break (`rlog archive verify`)."""

from __future__ import annotations

import asyncio

import pytest

from rlog.archive.format import ArchiveError, Manifest, SegmentInfo
from rlog.initialize import initialize, is_fresh
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.process import open_when_free
from rlog.storage import DataDirLocked, WriteBatch, open_storage
from rlog.storage.restoring import (
    RESTORING_NAME,
    RestoreUnfinished,
    abandon_restore,
    clear_restoring,
    mark_restoring,
    restoring,
)


def partly_restored(tmp_path):
    """A data dir marked, holding a learned record and nothing else of a restore."""
    data = tmp_path / "data"
    mark_restoring(data, "a test restore")
    storage = open_storage(data)
    storage.apply(WriteBatch(actions=[pb.Action(position=0, type=pb.NOP, learned=True)]))
    storage.close()
    return data


def test_a_marked_dir_is_never_fresh_initialized_or_served(tmp_path):
    data = partly_restored(tmp_path)
    assert restoring(data) and (data / RESTORING_NAME).read_text() == "a test restore\n"
    assert not is_fresh(data)
    with pytest.raises(RestoreUnfinished, match=f"{data / RESTORING_NAME}.*run the restore again"):
        initialize(data)
    with pytest.raises(RestoreUnfinished, match="never served"):
        asyncio.run(open_when_free(data, "auto", 1.0))


def test_marking_again_discards_only_what_a_restore_writes(tmp_path):
    data = partly_restored(tmp_path)
    (data / "lost+found").mkdir()  # a volume's root: not ours to delete
    mark_restoring(data, "the restore run again")
    assert sorted(p.name for p in data.iterdir()) == ["RESTORING", "lost+found", "rlog.lock"]
    clear_restoring(data)
    assert is_fresh(data)


def test_a_running_peer_makes_a_marked_dir_fresh(tmp_path):
    data = partly_restored(tmp_path)
    abandon_restore(data)
    assert not restoring(data) and is_fresh(data)


def test_no_mark_under_a_live_process(tmp_path):
    data = tmp_path / "data"
    storage = open_storage(data)  # a replica holds the dir
    try:
        with pytest.raises(DataDirLocked):
            mark_restoring(data, "a restore beside a live replica")
    finally:
        storage.close()


def test_chain_problems_lists_every_break():
    def segment(first: int, last: int) -> SegmentInfo:
        return SegmentInfo(SegmentInfo.key_for(first, last), first, last, 1, 10, "0" * 64, 0.0)

    manifest = Manifest("log", 0, 40, [segment(0, 9), segment(20, 29), segment(25, 40)])
    problems = manifest.chain_problems()
    assert len(problems) == 2  # a gap at 10..19, an overlap at 25..29
    assert "expected one starting at 10" in problems[0]
    assert "expected one starting at 30" in problems[1]
    with pytest.raises(ArchiveError, match="the manifest at M is inconsistent"):
        manifest.check("M")
    assert Manifest("log", 0, 40, [segment(0, 40)]).chain_problems() == []
