"""The storage format version of a data dir (<data dir>/FORMAT): a fresh dir gets version 4
(records with CRC32C, segment frames with CRC32C), a dir written by rlog before versions
(format 1: tests/fixtures/storage_v1/), before checksums (format 2:
tests/fixtures/storage_v2/) or before CRC32C frames (format 3: tests/fixtures/storage_v3/,
the segment engine's), each written by that code, is read and upgraded, any other version is
refused with nothing in the dir changed."""

from __future__ import annotations

import struct
import tarfile
from pathlib import Path

import pytest
from engines import DISK, run
from format_fixtures import FIXTURES_V3, SUBDIR, snapshot, unpack_v1, unpack_v2

from rlog import packed
from rlog.proto import rlog_pb2 as pb
from rlog.storage import Storage, StorageError, WriteBatch, open_storage
from rlog.storage._common import FORMAT_NAME, FORMAT_VERSION


def written(engine: str) -> str:
    """What FORMAT holds once this code has opened an engine's dir: 4 where the engine's
    writing changed in version 4 (the segment engine's CRC32C frames), 3 elsewhere, so that
    the rlog before version 4 still opens those dirs."""
    return "4\n" if engine == "segment" else "3\n"


def test_version_4_is_the_newest_this_code_reads() -> None:
    assert FORMAT_VERSION == 4


@pytest.mark.parametrize("engine", DISK)
def test_fresh_dir_records_the_version_its_engine_writes(engine: str, tmp_path: Path) -> None:
    store = open_storage(tmp_path / "data", engine)
    store.close()
    assert (tmp_path / "data" / FORMAT_NAME).read_text() == written(engine)
    assert not list((tmp_path / "data").glob("*.tmp"))
    open_storage(tmp_path / "data", engine).close()  # and it opens again


@pytest.mark.parametrize("engine", DISK)
def test_format_1_dir_is_read_and_upgraded(engine: str, tmp_path: Path) -> None:
    data = unpack_v1(engine, tmp_path)
    assert not (data / FORMAT_NAME).exists() and (data / SUBDIR[engine]).is_dir()
    store = open_storage(data, engine)
    try:
        assert (data / FORMAT_NAME).read_text() == written(engine)  # upgraded at open
        meta = store.metadata()
        assert (meta.log_id, meta.promised, meta.replica_id, meta.begin) == ("v1-log", 3, 2, 5)
        assert (store.first_position(), store.last_position()) == (5, 40)
        got = {a.position: a for a in store.scan(0, 2**64 - 1)}
        assert sorted(got) == list(range(5, 41))
        assert got[7] == pb.Action(position=7, type=pb.NOP, performed=3)
        assert got[8] == pb.Action(
            position=8, type=pb.APPEND, performed=2, learned=True, value=b"v1-8"
        )
        assert store.get(40) == got[40] and store.get(4) is None
        # Format-1 records and run records live side by side: a run over part of them.
        r = run(20, 10, b"v2")
        store.apply(WriteBatch(runs=[r]))
        store.apply(WriteBatch(actions=[pb.Action(position=25, value=b"act")]))
    finally:
        store.close()
    store = open_storage(data, engine)
    try:
        values = {a.position: a.value for a in store.scan(0, 2**64 - 1)}
        assert values == {
            **{p: b"v1-%d" % p for p in range(5, 41) if p != 7},
            7: b"",
            **{p: b"v2:%d" % p for p in range(20, 30)},
            25: b"act",
        }
        kinds = [
            (type(x).__name__, x.first if isinstance(x, pb.Run) else x.position)
            for x in store.scan_records(18, 31)
        ]
        assert kinds == [
            ("Action", 18),
            ("Action", 19),
            ("Run", 20),
            ("Action", 25),
            ("Run", 26),
            ("Action", 30),
            ("Action", 31),
        ]
        store.apply(WriteBatch(delete_below=22))
        assert store.first_position() == 22 and store.get(22) == packed.action_at(r, 22)
    finally:
        store.close()


@pytest.mark.parametrize("text", ["5\n", "17", "1\n", "not a version\n", ""])
@pytest.mark.parametrize("engine", DISK)
def test_other_versions_are_refused_and_nothing_changes(
    engine: str, text: str, tmp_path: Path
) -> None:
    data = unpack_v1(engine, tmp_path)
    (data / FORMAT_NAME).write_text(text)
    before = snapshot(data)
    with pytest.raises(StorageError) as refused:
        open_storage(data, engine)
    message = str(refused.value)
    if text.strip().isdigit():
        assert f"has storage format version {int(text)}" in message
    else:
        assert f"{FORMAT_NAME} holds {text.strip()!r}, not a storage format version" in message
    assert "reads storage format version 4 and upgrades versions 3, 2 and 1" in message
    assert snapshot(data) == before  # not even the lock file was created
    assert not (data / "rlog.lock").exists()


@pytest.mark.parametrize("engine", DISK)
def test_newer_version_written_over_a_v4_dir_is_refused(engine: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = open_storage(data, engine)
    store.apply(WriteBatch(runs=[run(1, 8)]))
    store.close()
    (data / FORMAT_NAME).write_text("5\n")
    before = snapshot(data)
    with pytest.raises(
        StorageError,
        match=rf"data dir {data} has storage format version 5; this rlog reads storage format "
        r"version 4 and upgrades versions 3, 2 and 1 \(a dir without FORMAT\)",
    ):
        open_storage(data, engine)
    assert snapshot(data) == before
    for text in ("3\n", "4\n"):  # a version this code reads: opened, never lowered
        (data / FORMAT_NAME).write_text(text)
        store = open_storage(data, engine)
        assert store.last_position() == 8
        store.close()
        assert (data / FORMAT_NAME).read_text() == max(text, written(engine))


@pytest.mark.parametrize("engine", DISK)
def test_format_2_dir_without_checksums_is_read_and_upgraded(engine: str, tmp_path: Path) -> None:
    data = unpack_v2(engine, tmp_path)
    assert (data / FORMAT_NAME).read_text().strip() == "2"
    store = open_storage(data, engine)
    try:
        assert (data / FORMAT_NAME).read_text() == written(engine)  # upgraded at open
        meta = store.metadata()
        assert (meta.log_id, meta.promised, meta.replica_id, meta.begin) == ("v2-log", 4, 1, 5)
        assert (store.first_position(), store.last_position()) == (5, 40)
        got = {a.position: a for a in store.scan(0, 2**64 - 1)}
        assert sorted(got) == list(range(5, 41))
        assert got[7] == pb.Action(position=7, type=pb.NOP, performed=4)
        assert got[8].value == b"v2-8" and got[8].learned and got[8].performed == 3
        assert got[35].value == b"v2-35"
        # New records (with a CRC) next to the old ones (without): a run over part of both.
        store.apply(WriteBatch(runs=[run(28, 6, b"v3")], metadata=meta))
    finally:
        store.close()
    store = open_storage(data, engine)
    try:
        values = {a.position: a.value for a in store.scan(0, 2**64 - 1)}
        assert values == {
            **{p: b"v2-%d" % p for p in range(5, 41) if p != 7},
            7: b"",
            **{p: b"v3:%d" % p for p in range(28, 34)},
        }
        assert store.metadata().promised == 4
    finally:
        store.close()


def _frame_flags(segment: Path) -> list[bool]:
    """For each frame of a segment file, whether it is flagged as CRC32C (bit 31 of its
    length; rlog/storage/segment_engine.py)."""
    raw, flags, off = segment.read_bytes(), [], 0
    while off + 8 <= len(raw):
        (length,) = struct.unpack_from(">I", raw, off)
        flags.append(bool(length >> 31))
        off += 8 + (length & 0x7FFFFFFF)
    assert off == len(raw)
    return flags


def test_format_3_segments_with_zlib_frames_are_read_and_upgraded(tmp_path: Path) -> None:
    with tarfile.open(FIXTURES_V3 / "segment.tar.gz") as tar:
        tar.extractall(tmp_path, filter="data")
    data = tmp_path / "data"
    assert (data / FORMAT_NAME).read_text() == "3\n"
    segments = sorted((data / "segments").glob("*.seg"))
    assert len(segments) > 1 and list((data / "segments").glob("*.idx"))
    assert not any(flag for seg in segments for flag in _frame_flags(seg))  # all zlib CRC-32
    expected = {p: b"v3-%d" % p for p in range(5, 201)}
    expected[7] = b""

    def values(store: Storage) -> dict[int, bytes]:
        return {a.position: a.value for a in store.scan(0, 2**64 - 1)}

    store = open_storage(data, "auto")
    try:
        assert (data / FORMAT_NAME).read_text() == "4\n"  # upgraded at open
        meta = store.metadata()
        assert (meta.log_id, meta.promised, meta.replica_id, meta.begin) == ("v3-log", 5, 2, 5)
        assert values(store) == expected
        # New frames (CRC32C) after the old ones in the newest segment: a run over part of
        # an old run, and a truncation.
        store.apply(WriteBatch(runs=[run(195, 10, b"v4")], metadata=meta))
        store.apply(WriteBatch(delete_below=9))
    finally:
        store.close()
    newest = sorted((data / "segments").glob("*.seg"))[-1]
    flags = _frame_flags(newest)
    assert flags[-1] and not flags[0]  # both kinds of frame in one segment
    for p in range(5, 9):
        del expected[p]
    expected.update({p: b"v4:%d" % p for p in range(195, 205)})
    for snapshot_kept in (True, False):  # opened from the snapshot, then by a full replay
        if not snapshot_kept:
            for idx in (data / "segments").glob("*.idx"):
                idx.unlink()
        store = open_storage(data, "auto")
        try:
            assert values(store) == expected and store.damage() == []
        finally:
            store.close()
