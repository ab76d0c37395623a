"""Record checksums (storage format 3) and full disks, engine by engine, on real files.

A stored record whose bytes changed after it was written (a flipped byte in the engine's own
file, a record under the wrong key) is never returned: every read path raises CorruptRecord
naming its position, the other records still read, and `drop_records` removes it so the
replica can fetch it again. A write that finds no space fails with DiskFull, writes nothing,
leaves reads working, and the next write succeeds once there is room (docs/faults.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from engines import DISK, run
from tmpfs import remount, tiny_tmpfs

from rlog.proto import rlog_pb2 as pb
from rlog.runtime.repair import set_aside
from rlog.storage import StorageError, WriteBatch, open_storage
from rlog.storage.base import CorruptRecord, DiskFull, StorageLost
from rlog.storage.lmdb_engine import LmdbStorage
from rlog.storage.records import Plan, RecordStorage, decode, encode, encode_metadata
from rlog.storage.segment_format import MARK_NAME

MARK = b"MARKED-VALUE-0123456789"
FILE_ENGINES = {"lmdb": "lmdb/data.mdb", "segment": "segments"}


def _store(engine: str, path: Path) -> RecordStorage:
    store = open_storage(path, engine)
    assert isinstance(store, RecordStorage)
    return store


def _fill(store: RecordStorage) -> None:
    """Runs at 1..10 and 21..30, a marked action at 15, metadata."""
    store.apply(
        WriteBatch(
            runs=[run(1, 10, b"a"), run(21, 10, b"b")],
            actions=[pb.Action(position=15, type=pb.APPEND, value=MARK)],
            metadata=pb.Metadata(status=pb.VOTING, promised=7, log_id="sums"),
        )
    )


def _data_files(engine: str, data: Path) -> list[Path]:
    where = data / FILE_ENGINES[engine]
    return sorted(where.glob("*.seg")) if where.is_dir() else [where]


def _flip_mark(engine: str, data: Path) -> int:
    """Change one byte of every copy of MARK in the engine's files; how many copies."""
    copies = 0
    for path in _data_files(engine, data):
        blob = bytearray(path.read_bytes())
        at = blob.find(MARK)
        while at >= 0:
            blob[at + 3] ^= 0x20
            copies += 1
            at = blob.find(MARK, at + 1)
        path.write_bytes(bytes(blob))
    return copies


def test_the_codec_checks_every_byte_and_the_key() -> None:
    for record in (pb.Action(position=9, value=b"xyz", performed=3), run(40, 5, b"q")):
        key = 9 if isinstance(record, pb.Action) else 40
        raw = encode(record)
        assert decode(key, raw) == record
        for i in range(len(raw)):
            bad = bytearray(raw)
            bad[i] ^= 0x01
            with pytest.raises(CorruptRecord) as caught:
                decode(key, bytes(bad))
            assert caught.value.key == key
        with pytest.raises(CorruptRecord, match="CRC32C mismatch"):
            decode(key + 1, raw)  # the same bytes under another key
        with pytest.raises(CorruptRecord):
            decode(key, raw[:3])


@pytest.mark.parametrize("engine", DISK)
def test_a_corrupt_record_in_storage_is_never_returned(engine: str, tmp_path: Path) -> None:
    """Every engine: a record replaced by damaged bytes under its key (written through the
    engine's own write primitive) fails every read path; the others still read."""
    store = _store(engine, tmp_path / "data")
    try:
        _fill(store)
        good = encode(pb.Action(position=15, type=pb.APPEND, value=MARK))
        bad = bytearray(good)
        bad[-2] ^= 0xFF
        store._write(Plan(deletes=[], puts=[(15, (b"", bytes(bad)))]))
        for read in (
            lambda: store.get(15),
            lambda: list(store.scan(11, 20)),
            lambda: list(store.scan_records(0, 100)),
        ):
            with pytest.raises(CorruptRecord, match="position 15 is corrupt"):
                read()
        assert store.get(14) is None and store.get(5) is not None
        assert [a.position for a in store.scan(21, 30)] == list(range(21, 31))
        # A write over the corrupt record (it must read it to split it) refuses too ...
        with pytest.raises(CorruptRecord):
            store.apply(WriteBatch(runs=[run(14, 3, b"c")]))
        # ... unless it drops it first: the repair.
        store.apply(WriteBatch(drop_records=[15], runs=[run(14, 3, b"c")]))
        assert [a.value for a in store.scan(14, 16)] == [b"c:14", b"c:15", b"c:16"]
        assert store.metadata().promised == 7
    finally:
        store.close()


@pytest.mark.parametrize("engine", ["lmdb", "segment"])
def test_a_flipped_byte_in_the_data_file(engine: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = _store(engine, data)
    _fill(store)
    store.close()
    assert _flip_mark(engine, data) >= 1
    if engine == "segment":
        # The segment's frame CRC sees it first, at open. Damage to the LAST frame of the
        # newest segment looks like a torn write, but the synced mark says the frame was
        # synced: acknowledged data is lost, the dir is refused as such (docs/faults.md).
        with pytest.raises(StorageLost, match="short of the"):
            _store(engine, data)
        # A dir without the mark (written before it) cuts it off as before: nothing of it
        # is served.
        (data / "segments" / MARK_NAME).unlink()
        store = _store(engine, data)
        assert store.get(15) is None and store.get(3) is None
        store.close()
        # Damage with a good frame after it is not a torn write: the frame is skipped and
        # reported (the replica then re-learns everything from its peers).
        data2 = tmp_path / "data2"
        store = _store(engine, data2)
        _fill(store)
        store.apply(WriteBatch(actions=[pb.Action(position=40, value=b"after")]))
        store.close()
        _flip_mark(engine, data2)
        store = _store(engine, data2)
        try:
            assert store.damage() and "fails its CRC" in store.damage()[0]
            assert store.get(15) is None and store.get(40) is not None
        finally:
            store.close()
        return
    store = _store(engine, data)
    try:
        with pytest.raises(CorruptRecord, match="position 15"):
            store.get(15)
        assert store.get(3) is not None and store.metadata().log_id == "sums"
    finally:
        store.close()


def test_a_flipped_byte_in_an_open_lmdb_is_seen_by_the_next_read(tmp_path: Path) -> None:
    """LMDB reads through a shared map of its file: damage written to the file while the
    store is open reaches the next read, which must refuse it."""
    data = tmp_path / "data"
    store = _store("lmdb", data)
    try:
        _fill(store)
        assert store.get(15) is not None
        assert _flip_mark("lmdb", data) >= 1
        with pytest.raises(CorruptRecord):
            store.get(15)
    finally:
        store.close()


@pytest.mark.parametrize("engine", DISK)
def test_corrupt_metadata_refuses_with_the_data_dir_named(engine: str, tmp_path: Path) -> None:
    store = _store(engine, tmp_path / "data")
    try:
        store.apply(WriteBatch(metadata=pb.Metadata(status=pb.VOTING, log_id="L" * 40)))
        raw = bytearray(encode_metadata(store.metadata()))
        raw[-5] ^= 0x01
        store._write(Plan(metadata=bytes(raw)))
        with pytest.raises(StorageError, match="stored metadata is corrupt"):
            store.metadata()
    finally:
        store.close()


def test_a_truncated_lmdb_file_is_storage_lost(tmp_path: Path) -> None:
    """Storage lost, as a segment cut short is: the replica sets it aside and rejoins
    through a quorum (tests/runtime/test_storage_lost_live.py)."""
    data = tmp_path / "data"
    store = _store("lmdb", data)
    for i in range(20):
        store.apply(WriteBatch(runs=[run(1 + 100 * i, 100, b"x" * 50)]))
    store.close()
    path = data / "lmdb" / "data.mdb"
    size = path.stat().st_size
    os.truncate(path, size // 2)
    with pytest.raises(StorageLost, match="truncated"):
        open_storage(data, "lmdb")


@pytest.mark.parametrize("cut", [100, 4096])
def test_an_lmdb_file_cut_inside_its_meta_pages_is_storage_lost(tmp_path: Path, cut: int) -> None:
    """Cut so short that LMDB finds no valid meta pages ("not an LMDB file"): lost too, and
    the data dir is left to be set aside (the lock released, the environment closed)."""
    data = tmp_path / "data"
    store = _store("lmdb", data)
    for i in range(20):
        store.apply(WriteBatch(runs=[run(1 + 100 * i, 100, b"x" * 50)]))
    store.close()
    os.truncate(data / "lmdb" / "data.mdb", cut)
    with pytest.raises(StorageLost, match=r"data\.mdb is damaged"):
        open_storage(data, "lmdb")
    set_aside(data, StorageLost("test"))
    fresh = open_storage(data, "lmdb")
    try:
        assert fresh.metadata().status == pb.EMPTY and fresh.last_position() is None
    finally:
        fresh.close()


def test_an_lmdb_file_cut_to_its_meta_pages_is_refused_not_a_crash(tmp_path: Path) -> None:
    """Cut so short that the tree's pages are gone: the size check must come before anything
    reads the tree (opening the named databases did, and the process died of SIGBUS). In a
    child process, so that a crash fails the test instead of killing the run."""
    data = tmp_path / "data"
    store = _store("lmdb", data)
    for i in range(20):
        store.apply(WriteBatch(runs=[run(1 + 100 * i, 100, b"x" * 50)]))
    store.close()
    path = data / "lmdb" / "data.mdb"
    os.truncate(path, 2 * os.sysconf("SC_PAGE_SIZE"))  # the two meta pages only
    opened = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; from rlog.storage import StorageError, open_storage\n"
            "try:\n    open_storage(sys.argv[1], 'lmdb')\n"
            "except StorageError as exc:\n    print(exc)\n",
            str(data),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert opened.returncode == 0, (opened.returncode, opened.stderr)
    assert "is truncated" in opened.stdout, opened.stdout


def test_lmdb_map_full_fails_the_batch_and_reads_go_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store = LmdbStorage(data, map_size=1 << 20, max_map_size=1 << 20)
    written = 0
    try:
        with pytest.raises(DiskFull, match="LMDB map full"):
            for i in range(1000):
                store.apply(WriteBatch(runs=[run(1 + 10 * i, 10, b"v" * 1000)]))
                written = 10 * (i + 1)
        assert written > 0
        assert store.last_position() == written  # nothing of the failed batch
        assert len(list(store.scan(1, written))) == written
        with pytest.raises(DiskFull):  # even a truncation needs free pages to write
            store.apply(WriteBatch(delete_below=written // 2))
    finally:
        store.close()
    store = LmdbStorage(data, map_size=1 << 20, max_map_size=4 << 20)  # a larger limit
    try:
        store.apply(WriteBatch(runs=[run(written + 1, 10, b"n")]))
        assert [a.position for a in store.scan(1, 2**64 - 1)] == list(range(1, written + 11))
    finally:
        store.close()


@pytest.mark.parametrize("engine", ["lmdb", "segment"])
def test_enospc_fails_the_batch_reads_go_on_and_space_returns(engine: str, tmp_path: Path) -> None:
    with tiny_tmpfs(tmp_path / "disk", "1m") as disk:
        store = _store(engine, disk / "data")
        written = 0
        try:
            with pytest.raises(DiskFull, match="no space left"):
                for i in range(10_000):
                    store.apply(WriteBatch(runs=[run(1 + 10 * i, 10, b"v" * 1000)]))
                    written = 10 * (i + 1)
            assert written > 0
            assert store.last_position() == written
            assert [a.position for a in store.scan(1, written)] == list(range(1, written + 1))
            with pytest.raises(DiskFull):  # still full: fails again, still nothing half done
                store.apply(WriteBatch(runs=[run(written + 1, 10, b"v" * 1000)]))
            remount(disk, "8m")
            store.apply(WriteBatch(runs=[run(written + 1, 10, b"v" * 1000)]))
            assert store.last_position() == written + 10
        finally:
            store.close()
        store = _store(engine, disk / "data")  # and all of it is there after a reopen
        try:
            assert [a.position for a in store.scan(1, 2**64 - 1)] == list(range(1, written + 11))
        finally:
            store.close()
