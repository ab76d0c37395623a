"""Storage engines against the one interface: real disk, real processes, real SIGKILL."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from engines import (
    ALL,
    DISK,
    DISK_ENGINES,
    OPEN_SCRIPT,
    RUN_ENGINES,
    action,
    available,
    positions,
    run,
)

from rlog import packed
from rlog.proto import rlog_pb2 as pb
from rlog.storage import Storage, StorageError, WriteBatch, open_storage
from rlog.storage.base import CorruptRecord, StorageLost
from rlog.storage.segment_format import MARK_NAME


@pytest.fixture(params=ALL)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_(engine: str, tmp_path: Path) -> Iterator[Callable[[], Storage]]:
    """open_() opens (or reopens) the engine on one data dir; all are closed at teardown."""
    opened: list[Storage] = []
    memory: list[Storage] = []

    def _open() -> Storage:
        if engine == "memory":  # nothing to reopen: the same object stands for the dir
            if not memory:
                memory.append(open_storage(tmp_path / "data", engine))
            return memory[0]
        store = open_storage(tmp_path / "data", engine)
        opened.append(store)
        return store

    yield _open
    for store in opened + memory:
        store.close()


def reopen(engine: str, store: Storage, open_) -> Storage:  # type: ignore[no-untyped-def]
    if engine == "memory":
        return store
    store.close()
    return open_()


def before_and_after_reopen(engine: str, store: Storage, open_) -> Iterator[Storage]:  # type: ignore[no-untyped-def]
    """Yield the open store, then the same data dir reopened (lazily, after the first check)."""
    yield store
    yield reopen(engine, store, open_)


def test_fresh_dir_is_empty(open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    assert store.metadata() == pb.Metadata()
    assert store.metadata().status == pb.EMPTY
    assert store.get(0) is None and store.get(1) is None
    assert store.first_position() is None and store.last_position() is None
    assert positions(store) == []


def test_round_trip_actions_and_metadata(engine: str, open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    meta = pb.Metadata(status=pb.VOTING, promised=7, log_id="log-1", replica_id=2, begin=1)
    acts = [
        action(1, b"x" * 1000, promised=5, performed=5, learned=True),
        pb.Action(position=2, type=pb.TRUNCATE, truncate_to=1, performed=6),
        pb.Action(position=3, type=pb.NOP, tombstone=True, learned=True),
        pb.Action(position=4, promised=9),  # promise-only record
    ]
    store.apply(WriteBatch(metadata=meta, actions=acts))
    for s in before_and_after_reopen(engine, store, open_):
        assert s.metadata() == meta
        for a in acts:
            assert s.get(a.position) == a
        assert list(s.scan(0, 10)) == acts
        assert s.get(5) is None


def test_overwrite(engine: str, open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    store.apply(WriteBatch(actions=[action(5, b"old", performed=1)]))
    store.apply(WriteBatch(metadata=pb.Metadata(promised=1)))
    store.apply(WriteBatch(actions=[action(5, b"new", performed=2, learned=True)]))
    store.apply(WriteBatch(metadata=pb.Metadata(promised=2, status=pb.VOTING)))
    # Within one batch the later action for a position wins.
    store.apply(WriteBatch(actions=[action(6, b"a"), action(6, b"b")]))
    store = reopen(engine, store, open_)
    assert store.get(5) == action(5, b"new", performed=2, learned=True)
    assert store.get(6) == action(6, b"b")
    assert store.metadata() == pb.Metadata(promised=2, status=pb.VOTING)
    assert positions(store) == [5, 6]


def test_metadata_only_batch_keeps_actions(open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    store.apply(WriteBatch(actions=[action(1), action(2)]))
    store.apply(WriteBatch(metadata=pb.Metadata(promised=3)))
    store.apply(WriteBatch())  # an empty batch is a no-op
    assert positions(store) == [1, 2]
    assert store.metadata().promised == 3


def test_scan_ranges(open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    store.apply(WriteBatch(actions=[action(p) for p in (2, 4, 6, 8, 10)]))
    assert positions(store, 0, 1) == []
    assert positions(store, 11, 100) == []
    assert positions(store, 5, 5) == []
    assert positions(store, 7, 3) == []  # first > last
    assert positions(store, 4, 4) == [4]
    assert positions(store, 3, 8) == [4, 6, 8]
    assert positions(store, 4, 8) == [4, 6, 8]
    assert positions(store, 0, 2**64 - 1) == [2, 4, 6, 8, 10]
    assert positions(store, 9, 2**70) == [10]


def test_scan_many_entries_in_order(engine: str, open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    rng = random.Random(1)
    ps = rng.sample(range(10_000), 3000)
    for i in range(0, len(ps), 500):
        store.apply(WriteBatch(actions=[action(p, p.to_bytes(4, "big")) for p in ps[i : i + 500]]))
    store = reopen(engine, store, open_)
    want = sorted(ps)
    got = list(store.scan(0, 10_000))
    assert [a.position for a in got] == want
    assert all(a.value == a.position.to_bytes(4, "big") for a in got)
    assert positions(store, 1000, 7000) == [p for p in want if 1000 <= p <= 7000]
    assert store.first_position() == want[0] and store.last_position() == want[-1]


def test_scan_is_a_lazy_iterator_that_tolerates_early_stop(open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    store.apply(WriteBatch(actions=[action(p) for p in range(3000)]))
    it = store.scan(0, 3000)
    assert next(it).position == 0
    del it  # abandoned mid-way: must not block later writes
    store.apply(WriteBatch(actions=[action(3000)]))
    assert store.last_position() == 3000


def test_first_and_last_position(open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    store.apply(WriteBatch(metadata=pb.Metadata(promised=1)))
    assert store.first_position() is None and store.last_position() is None
    store.apply(WriteBatch(actions=[action(7)]))
    assert (store.first_position(), store.last_position()) == (7, 7)
    store.apply(WriteBatch(actions=[action(3), action(12)]))
    assert (store.first_position(), store.last_position()) == (3, 12)


@pytest.mark.parametrize(
    "big", [2**31 - 1, 2**31, 2**32 - 1, 2**32, 10**10, 2**63, 2**64 - 2, 2**64 - 1]
)
def test_large_positions(engine: str, open_, big: int) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    small = [0, 1, 255, 256, 65536]
    store.apply(WriteBatch(actions=[action(p, str(p).encode()) for p in [big, *small]]))
    store = reopen(engine, store, open_)
    assert store.get(big) == action(big, str(big).encode())
    assert positions(store) == sorted({*small, big})  # numeric, not lexicographic, order
    assert store.last_position() == big
    assert store.first_position() == 0
    assert positions(store, big, big) == [big]
    assert positions(store, big - 1, 2**64 - 1) == [big]
    store.apply(WriteBatch(delete_below=big))
    assert positions(store) == [big]
    assert store.first_position() == big


def test_delete_below(engine: str, open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    store.apply(WriteBatch(actions=[action(p) for p in range(1, 21)]))
    store.apply(WriteBatch(delete_below=8))
    assert positions(store) == list(range(8, 21))
    assert store.get(7) is None and store.get(8) is not None
    assert store.first_position() == 8
    # Scans that start inside the deleted prefix.
    assert positions(store, 0, 9) == [8, 9]
    assert positions(store, 1, 7) == []
    store.apply(WriteBatch(delete_below=5))  # lower than before: nothing more goes
    assert store.first_position() == 8
    store = reopen(engine, store, open_)
    assert positions(store) == list(range(8, 21))
    store.apply(WriteBatch(delete_below=100))  # everything
    assert positions(store) == []
    assert store.first_position() is None and store.last_position() is None
    store.apply(WriteBatch(actions=[action(101)]))
    assert positions(store) == [101]


def test_delete_below_with_puts_and_metadata_in_one_batch(engine: str, open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    store.apply(WriteBatch(actions=[action(p, b"old") for p in range(1, 11)]))
    meta = pb.Metadata(status=pb.VOTING, begin=6)
    store.apply(
        WriteBatch(
            metadata=meta,
            actions=[action(3, b"new"), action(6, b"new"), action(11, b"new")],
            delete_below=6,
        )
    )
    for s in before_and_after_reopen(engine, store, open_):
        assert positions(s) == [6, 7, 8, 9, 10, 11]
        assert s.get(3) is None  # a put below the cut in the same batch is deleted too
        assert s.get(6) == action(6, b"new") and s.get(7) == action(7, b"old")
        assert s.metadata() == meta


def test_delete_large_prefix(engine: str, open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    for start in range(0, 20_000, 5000):
        store.apply(WriteBatch(actions=[action(p, b"v" * 16) for p in range(start, start + 5000)]))
    store.apply(WriteBatch(delete_below=19_990))
    store = reopen(engine, store, open_)
    assert store.first_position() == 19_990
    assert positions(store) == list(range(19_990, 20_000))


@pytest.mark.parametrize("engine", DISK)  # the memory engine keeps nothing, by design
def test_reopen_keeps_everything(engine: str, open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    meta = pb.Metadata(status=pb.VOTING, promised=42, log_id="L", replica_id=1, begin=3)
    store.apply(WriteBatch(metadata=meta, actions=[action(p, os.urandom(100)) for p in range(50)]))
    store.apply(WriteBatch(delete_below=3, sync=False))
    before = list(store.scan(0, 100))
    store.close()
    store.close()  # idempotent
    for _ in range(2):
        store = open_()
        assert store.metadata() == meta
        assert list(store.scan(0, 100)) == before
        store.close()


def test_unsynced_batches_are_visible_and_survive_clean_close(engine: str, open_) -> None:  # type: ignore[no-untyped-def]
    store = open_()
    store.apply(WriteBatch(actions=[action(1)], sync=False))
    assert store.get(1) == action(1)
    store = reopen(engine, store, open_)
    assert store.get(1) == action(1)


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", DISK)
def test_missing_parent_is_a_storage_error(engine: str, tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=r"parent directory .* does not exist"):
        open_storage(tmp_path / "no" / "such" / "data", engine)
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("engine", DISK)
def test_data_dir_that_is_a_file_is_a_storage_error(engine: str, tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a dir")
    with pytest.raises(StorageError, match="not a directory"):
        open_storage(tmp_path / "data", engine)


def test_unknown_engine() -> None:
    with pytest.raises(StorageError, match="unknown storage engine"):
        open_storage("/nonexistent", "nosuchdb")


def open_in_unprivileged_child(target: Path, engine: str) -> str:
    """Open `target` in a forked child that, when we are root, first drops to `nobody`
    (root ignores permission bits); returns the child's one-line outcome."""
    open_storage(Path(tempfile.gettempdir()) / "never" / "x", "memory")  # import before fork
    if engine != "memory":
        import importlib

        importlib.import_module(f"rlog.storage.{engine}_engine")
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never returns into pytest
        code = 0
        try:
            os.close(rfd)
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            try:
                open_storage(target, engine).close()
                out = "opened"
            except StorageError as exc:
                out = f"StorageError: {exc}"
            os.write(wfd, out.encode())
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as r:
        out = r.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return out


@pytest.mark.parametrize("engine", DISK)
def test_unwritable_dir_is_a_storage_error(engine: str) -> None:
    base = Path(tempfile.mkdtemp(prefix="rlog-ro-"))
    try:
        base.chmod(0o755)
        data = base / "data"
        data.mkdir()
        data.chmod(0o555)
        parent = base / "parent"  # the data dir does not exist and cannot be created
        parent.mkdir()
        parent.chmod(0o555)
        for target in (data, parent / "data"):
            out = open_in_unprivileged_child(target, engine)
            assert out == f"StorageError: data dir {target} is not writable: Permission denied"
    finally:
        for d in (base / "data", base / "parent"):
            d.chmod(0o755)
        subprocess.run(["rm", "-rf", str(base)], check=True)


@pytest.mark.parametrize("engine", DISK)
def test_dir_locked_by_another_process(engine: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    holder = subprocess.Popen(
        [sys.executable, "-c", OPEN_SCRIPT, str(data), engine],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "opened"
        with pytest.raises(
            StorageError, match=rf"locked by another live process \(pid {holder.pid}\)"
        ):
            open_storage(data, engine)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        assert holder.wait(timeout=60) == 0
    open_storage(data, engine).close()  # free again once the holder is gone


@pytest.mark.parametrize("engine", DISK)
def test_dir_opened_twice_in_one_process(engine: str, tmp_path: Path) -> None:
    store = open_storage(tmp_path / "data", engine)
    try:
        with pytest.raises(StorageError, match="locked"):
            open_storage(tmp_path / "data", engine)
    finally:
        store.close()
    open_storage(tmp_path / "data", engine).close()


def test_dir_of_another_engine_is_refused(tmp_path: Path) -> None:
    engines = [e for e in DISK_ENGINES if available(e)]
    if len(engines) < 2:
        pytest.skip("needs two disk engines")
    store = open_storage(tmp_path / "data", engines[0])
    store.apply(WriteBatch(actions=[action(1)]))
    store.close()
    with pytest.raises(StorageError, match=f"holds a '{engines[0]}' store"):
        open_storage(tmp_path / "data", engines[1])


def test_lmdb_map_grows_when_full(tmp_path: Path) -> None:
    from rlog.storage.lmdb_engine import LmdbStorage

    store = LmdbStorage(tmp_path / "data", map_size=1 << 20)  # 1 MiB: full after a few batches
    try:
        for b in range(16):
            store.apply(WriteBatch(actions=[action(b * 64 + i, b"v" * 1024) for i in range(64)]))
        assert store.last_position() == 16 * 64 - 1
        assert len(positions(store)) == 16 * 64
    finally:
        store.close()


# -- crash atomicity: SIGKILL a writer in the middle of synced batches -------------------------

PER_BATCH = 32
KEEP = 20  # each batch truncates all but the last KEEP batches

WRITER = textwrap.dedent(
    f"""
    import os, sys
    from rlog import packed
    from rlog.proto import rlog_pb2 as pb
    from rlog.storage import WriteBatch, open_storage
    store = open_storage(sys.argv[1], sys.argv[2])
    as_runs = sys.argv[3] == "runs"
    meta = store.metadata()
    i = meta.promised + 1 if meta.log_id else 0
    value = os.urandom(4096)
    data, offsets = packed.pack([value] * {PER_BATCH})
    while True:
        cut = (i - {KEEP} + 1) * {PER_BATCH} if i >= {KEEP} else None
        batch = WriteBatch(metadata=pb.Metadata(promised=i, log_id="L"), delete_below=cut)
        if as_runs:  # the batch's positions as two runs, one record each
            run = packed.make_run(i * {PER_BATCH}, pb.Action(performed=i), data, offsets)
            half = i * {PER_BATCH} + {PER_BATCH} // 2
            batch.runs = [packed.clip(run, run.first, half - 1), packed.clip(run, half, half + 99)]
        else:
            batch.actions = [
                pb.Action(position=i * {PER_BATCH} + k, performed=i, value=value)
                for k in range({PER_BATCH})
            ]
        store.apply(batch)
        os.write(1, b"%d\\n" % i)
        i += 1
    """
)


def check_consistent(store: Storage, acked: int) -> int:
    """Every batch wholly there or wholly absent, every acked batch there; returns the last."""
    meta = store.metadata()
    assert meta.log_id == "L"
    last = meta.promised
    assert acked <= last <= acked + 1, (acked, last)  # at most the one in flight is extra
    want: list[int] = []
    for i in range(max(0, last - KEEP + 1), last + 1):
        want.extend(range(i * PER_BATCH, (i + 1) * PER_BATCH))
    got = [(a.position, a.performed) for a in store.scan(0, 2**64 - 1)]
    assert [p for p, _ in got] == want
    assert all(performed == p // PER_BATCH for p, performed in got)
    return last


@pytest.mark.parametrize("kind", ["actions", "runs"])
@pytest.mark.parametrize("engine", DISK)
def test_sigkill_mid_batch_leaves_whole_batches(engine: str, kind: str, tmp_path: Path) -> None:
    data = tmp_path / "data"
    rng = random.Random(engine + kind)
    acked = -1
    for _ in range(4):
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(data), engine, kind],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        assert proc.stdout is not None
        # Wait for a few acks of this incarnation, then kill at a random moment.
        seen = 0
        deadline = time.monotonic() + 60
        while seen < 5 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            acked = int(line)
            seen += 1
        time.sleep(rng.uniform(0.0, 0.05))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read() if proc.stderr else ""
        assert seen == 5, proc.stderr.read() if proc.stderr else ""
        # Acks printed before the kill may still be in the pipe.
        for line in proc.stdout.read().split():
            acked = int(line)
        proc.stdout.close()
        assert proc.stderr is not None
        proc.stderr.close()
        store = open_storage(data, engine)
        try:
            acked = check_consistent(store, acked)
        finally:
            store.close()


# -- segment engine specifics: rollover, reclaim, torn tail ------------------------------------


def test_segment_rollover_reclaims_dead_segments(tmp_path: Path) -> None:
    from rlog.storage.segment_engine import SegmentStorage

    seg_dir = tmp_path / "data" / "segments"
    store = SegmentStorage(tmp_path / "data", segment_bytes=16 << 10)
    meta = pb.Metadata(status=pb.VOTING, log_id="L", promised=9)
    store.apply(WriteBatch(metadata=meta))
    for b in range(40):
        store.apply(WriteBatch(actions=[action(b * 4 + i, b"v" * 1024) for i in range(4)]))
    assert len(list(seg_dir.glob("*.seg"))) >= 8
    store.apply(WriteBatch(delete_below=150))
    segs = sorted(seg_dir.glob("*.seg"))
    assert len(segs) <= 2  # every segment that held only positions < 150 is gone
    store.close()
    store = SegmentStorage(tmp_path / "data", segment_bytes=16 << 10)
    try:
        assert store.metadata() == meta  # carried by the checkpoint at each segment's head
        assert positions(store) == list(range(150, 160))
    finally:
        store.close()


def flip(path: Path, at: int, mask: int = 0xFF) -> None:
    with path.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ mask]))


def test_segment_torn_tail_is_cut_and_corruption_is_refused(tmp_path: Path) -> None:
    from rlog.storage.segment_engine import SegmentStorage

    store = SegmentStorage(tmp_path / "data", segment_bytes=8 << 10)
    for b in range(11):
        store.apply(WriteBatch(actions=[action(b * 2 + i, b"v" * 1024) for i in range(2)]))
    mark = tmp_path / "data" / "segments" / MARK_NAME
    before = mark.read_bytes()  # a torn write never returned: the mark did not move
    store.apply(WriteBatch(actions=[action(22 + i, b"v" * 1024) for i in range(2)]))
    store.close()
    segs = sorted((tmp_path / "data" / "segments").glob("*.seg"))
    newest = segs[-1]
    size = newest.stat().st_size
    with newest.open("r+b") as f:  # a torn last record: half of it reached the disk
        f.truncate(size - 700)
    # Cut short below what the synced mark says was synced: acknowledged frames are gone.
    with pytest.raises(StorageLost, match="short of the"):
        SegmentStorage(tmp_path / "data", segment_bytes=8 << 10)
    mark.write_bytes(before)
    store = SegmentStorage(tmp_path / "data", segment_bytes=8 << 10)
    assert positions(store) == list(range(22))  # the last batch (22, 23) is wholly gone
    store.apply(WriteBatch(actions=[action(22)]))  # appends after the cut
    store.close()
    store = SegmentStorage(tmp_path / "data", segment_bytes=8 << 10)
    assert positions(store) == list(range(23))
    store.close()
    # An older segment is covered by the index snapshot written when the next one began:
    # opening does not read it, and damage there is found when the record is read.
    assert list((tmp_path / "data" / "segments").glob("*.idx"))
    flip(segs[0], 60)  # inside the record at position 0 (its value)
    store = SegmentStorage(tmp_path / "data", segment_bytes=8 << 10)
    assert store.damage() == []
    with pytest.raises(CorruptRecord):
        store.get(0)
    assert [a.position for a in store.scan(1, 1)] == [1]  # its neighbours are served
    store.close()
    flip(segs[0], 60)  # as it was
    # Without a snapshot every segment is replayed and its frames checked at open, as before:
    for snapshot in (tmp_path / "data" / "segments").glob("*.idx"):
        snapshot.unlink()
    flip(segs[0], 40)  # a flipped byte in an older segment's frame is corruption
    # Its frame's length still leads to the next frame: the frame is skipped and reported
    # (the replica then recovers from its peers, docs/faults.md) ...
    store = SegmentStorage(tmp_path / "data", segment_bytes=8 << 10)
    assert store.damage() and "fails its CRC" in store.damage()[0]
    store.close()
    for snapshot in (tmp_path / "data" / "segments").glob("*.idx"):
        snapshot.unlink()
    with segs[0].open("r+b") as f:  # ... a damaged length field leads nowhere: refused
        f.seek(1)
        byte = f.read(1)
        f.seek(1)
        f.write(bytes([byte[0] ^ 0x7F]))
    with pytest.raises(StorageError, match="is corrupt at byte"):
        SegmentStorage(tmp_path / "data")


def test_segment_damaged_frames_in_a_row_are_each_skipped(tmp_path: Path) -> None:
    """A bad sector holds several small frames: damage to consecutive frames is skipped
    frame by frame, as long as their length fields lead on to a good frame (found by a live
    disk-fault test: a repaired replica then refused to restart)."""
    from rlog.storage.segment_engine import SegmentStorage

    store = SegmentStorage(tmp_path / "data")
    for p in range(6):
        store.apply(WriteBatch(actions=[action(p, b"VALUE-%d-0123456789" % p)]))
    store.close()
    (seg,) = (tmp_path / "data" / "segments").glob("*.seg")
    blob = seg.read_bytes()
    for p in (1, 2, 3):  # three frames in a row, each with one value byte flipped
        flip(seg, blob.index(b"VALUE-%d-" % p) + 10, 0x01)
    store = SegmentStorage(tmp_path / "data")
    try:
        assert len(store.damage()) == 3
        assert all("fails its CRC" in d for d in store.damage())
        assert positions(store) == [0, 4, 5]  # nothing damaged served, the rest kept
    finally:
        store.close()
    # The same damage reaching the newest segment's last frame: the frames in a row lead to
    # no good frame, so their extent cannot be trusted, and data follows the first: refused.
    flip(seg, blob.index(b"VALUE-4-") + 10, 0x01)
    flip(seg, blob.index(b"VALUE-5-") + 10, 0x01)
    with pytest.raises(StorageError, match="a frame fails its CRC and data follows it"):
        SegmentStorage(tmp_path / "data")


# -- runs: one record per run (WriteBatch.runs, Storage.scan_records) --------------------------


def records(store: Storage, first: int = 0, last: int = 2**64 - 1) -> list[tuple[str, int, int]]:
    """What scan_records yields, as (kind, first, last) triples."""
    out = []
    for r in store.scan_records(first, last):
        if isinstance(r, pb.Run):
            out.append(("run", r.first, packed.run_last(r)))
        else:
            out.append(("action", r.position, r.position))
    return out


def values(store: Storage, first: int = 0, last: int = 2**64 - 1) -> dict[int, bytes]:
    return {a.position: a.value for a in store.scan(first, last)}


@pytest.fixture(params=RUN_ENGINES)
def run_engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def open_runs(run_engine: str, tmp_path: Path) -> Iterator[Callable[[], Storage]]:
    yield from open_.__wrapped__(run_engine, tmp_path)  # type: ignore[attr-defined]


def test_run_round_trip(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    store = open_runs()
    r = run(10, 64, promised=3, performed=4, learned=True, epoch=2, session=7, sequence=1)
    store.apply(WriteBatch(runs=[r]))
    for s in before_and_after_reopen(run_engine, store, open_runs):
        assert list(s.scan_records(0, 2**64 - 1)) == [r]  # the run as sent, one record
        assert list(s.scan(0, 100)) == packed.expand(r)
        for position in (10, 11, 40, 73):
            assert s.get(position) == packed.action_at(r, position)
        assert s.get(9) is None and s.get(74) is None
        assert (s.first_position(), s.last_position()) == (10, 73)


def test_scan_records_clips_runs_at_the_range_ends(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    store = open_runs()
    a, b = run(10, 20, b"a"), run(30, 20, b"b")
    store.apply(WriteBatch(runs=[a, b], actions=[action(60, b"x")]))
    for s in before_and_after_reopen(run_engine, store, open_runs):
        assert records(s, 15, 35) == [("run", 15, 29), ("run", 30, 35)]
        got = list(s.scan_records(15, 35))
        assert got[0] == packed.clip(a, 15, 29) and got[1] == packed.clip(b, 30, 35)
        assert records(s, 12, 12) == [("run", 12, 12)]
        assert records(s, 45, 100) == [("run", 45, 49), ("action", 60, 60)]
        assert records(s, 50, 59) == [] and records(s, 61, 2**64 - 1) == []
        assert records(s, 35, 20) == []
        assert values(s, 28, 31) == {28: b"a:28", 29: b"a:29", 30: b"b:30", 31: b"b:31"}


def test_scan_records_across_read_chunks(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    """Scans read the engine in chunks that grow from a few records to SCAN_CHUNK: every
    record comes once, in order, whatever the range, also where a scan stops early."""
    store = open_runs()
    count = 700  # past 2 + 4 + ... + 256 + 256 records
    store.apply(
        WriteBatch(
            runs=[run(10 * k, 3, b"r") for k in range(count)],
            actions=[action(10 * k + 5, b"a%d" % k) for k in range(count)],
        )
    )
    expected = []
    for k in range(count):
        expected += [("run", 10 * k, 10 * k + 2), ("action", 10 * k + 5, 10 * k + 5)]
    for s in before_and_after_reopen(run_engine, store, open_runs):
        assert records(s) == expected
        assert records(s, 1, 10 * count) == [("run", 1, 2), *expected[1:]]
        assert records(s, 2001, 4005) == [
            ("run", 2001, 2002),
            *[r for r in expected if 2001 < r[1] <= 4005],
        ]
        first_three = list(itertools.islice(s.scan_records(95, 2**64 - 1), 3))
        assert [(r.position if isinstance(r, pb.Action) else r.first) for r in first_three] == [
            95,
            100,
            105,
        ]


@pytest.mark.parametrize("engine", DISK)
def test_one_put_per_run_in_the_disk_engines(engine: str, open_) -> None:  # type: ignore[no-untyped-def]
    from rlog.storage.records import RecordStorage, decode

    store = open_()
    assert isinstance(store, RecordStorage)
    r = run(5, 64, epoch=1)
    store.apply(WriteBatch(runs=[r]))
    stored = store._range(0, 2**64 - 1, 100)
    assert [key for key, _ in stored] == [5]  # one record, keyed by the run's first position
    assert decode(5, stored[0][1]) == r
    assert r.SerializeToString() in stored[0][1]  # the run's bytes as serialized, unchanged


def test_action_inside_a_run_splits_it(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    store = open_runs()
    r = run(10, 64)
    store.apply(WriteBatch(runs=[r]))
    store.apply(WriteBatch(actions=[action(20, b"x", performed=9)]))
    for s in before_and_after_reopen(run_engine, store, open_runs):
        assert records(s) == [("run", 10, 19), ("action", 20, 20), ("run", 21, 73)]
        assert s.get(20) == action(20, b"x", performed=9)
        assert s.get(19) == packed.action_at(r, 19) and s.get(21) == packed.action_at(r, 21)
        assert (s.first_position(), s.last_position()) == (10, 73)
    store = s
    # At the run's ends: the run shrinks, nothing is left empty.
    store.apply(WriteBatch(actions=[action(10, b"lo"), action(73, b"hi")]))
    assert records(store) == [
        ("action", 10, 10),
        ("run", 11, 19),
        ("action", 20, 20),
        ("run", 21, 72),
        ("action", 73, 73),
    ]
    assert values(store, 9, 12) == {10: b"lo", 11: b"r:11", 12: b"r:12"}


def test_run_over_stored_runs_replaces_their_positions(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    store = open_runs()
    store.apply(WriteBatch(runs=[run(10, 64, b"a")], actions=[action(80), action(90)]))
    store.apply(WriteBatch(runs=[run(50, 35, b"b")]))  # 50..84: a's tail, the action at 80
    assert records(store) == [("run", 10, 49), ("run", 50, 84), ("action", 90, 90)]
    store.apply(WriteBatch(runs=[run(20, 10, b"c")]))  # inside a: a is split in two
    assert records(store) == [
        ("run", 10, 19),
        ("run", 20, 29),
        ("run", 30, 49),
        ("run", 50, 84),
        ("action", 90, 90),
    ]
    store.apply(WriteBatch(runs=[run(5, 100, b"d")]))  # covers everything but 90 wholly
    for s in before_and_after_reopen(run_engine, store, open_runs):
        assert records(s) == [("run", 5, 104)]
        assert values(s) == {p: b"d:%d" % p for p in range(5, 105)}


def test_delete_below_clips_a_straddling_run(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    store = open_runs()
    r = run(10, 64)
    store.apply(WriteBatch(runs=[run(0, 5, b"z"), r]))
    store.apply(WriteBatch(delete_below=40))
    for s in before_and_after_reopen(run_engine, store, open_runs):
        assert records(s) == [("run", 40, 73)]
        assert s.get(39) is None and s.get(40) == packed.action_at(r, 40)
        assert (s.first_position(), s.last_position()) == (40, 73)
        assert list(s.scan_records(0, 2**64 - 1)) == [packed.clip(r, 40, 73)]
    store = s
    store.apply(WriteBatch(delete_below=74))
    assert records(store) == [] and store.first_position() is None


def test_batch_order_cut_then_runs_then_actions(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    store = open_runs()
    store.apply(WriteBatch(runs=[run(0, 10, b"old")]))
    meta = pb.Metadata(status=pb.VOTING, begin=3)
    store.apply(
        WriteBatch(
            metadata=meta,
            delete_below=3,
            runs=[run(0, 6, b"new"), run(8, 4, b"new")],  # the first straddles the cut
            actions=[action(1, b"below"), action(5, b"act"), action(9, b"act")],
        )
    )
    for s in before_and_after_reopen(run_engine, store, open_runs):
        assert values(s) == {
            3: b"new:3",
            4: b"new:4",
            5: b"act",
            6: b"old:6",
            7: b"old:7",
            8: b"new:8",
            9: b"act",
            10: b"new:10",
            11: b"new:11",
        }
        assert (s.first_position(), s.last_position()) == (3, 11)
        assert s.metadata() == meta


def test_merged_batches_keep_their_order(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    store = open_runs()
    first = WriteBatch(actions=[action(3, b"early"), action(20, b"early")], runs=[run(0, 2)])
    first.merge(WriteBatch(runs=[run(2, 5, b"later")]))  # covers the early action at 3
    first.merge(WriteBatch(actions=[action(4, b"last")], delete_below=1))
    store.apply(first)
    assert values(store) == {
        1: b"r:1",
        2: b"later:2",
        3: b"later:3",
        4: b"last",
        5: b"later:5",
        6: b"later:6",
        20: b"early",
    }


def test_runs_at_large_positions(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    store = open_runs()
    top = 2**64 - 1
    store.apply(WriteBatch(runs=[run(top - 9, 10), run(2**32 - 3, 6)]))
    for s in before_and_after_reopen(run_engine, store, open_runs):
        assert records(s) == [("run", 2**32 - 3, 2**32 + 2), ("run", top - 9, top)]
        assert s.last_position() == top and s.get(top) is not None
        assert values(s, top - 1, top) == {top - 1: b"r:%d" % (top - 1), top: b"r:%d" % top}
    with pytest.raises(ValueError):
        store.apply(WriteBatch(runs=[run(top - 2, 5)]))


def test_runs_against_a_model(run_engine: str, open_runs) -> None:  # type: ignore[no-untyped-def]
    """Random batches of runs, actions and cuts; the store must equal a per-position model
    (the runs expanded) after every batch and after reopening."""
    store = open_runs()
    rng = random.Random(run_engine)
    model: dict[int, pb.Action] = {}
    for step in range(150):
        batch = WriteBatch()
        for k in range(rng.randrange(3)):
            r = run(rng.randrange(200), rng.randrange(1, 40), b"s%d.%d" % (step, k))
            batch.runs.append(r)
        for _ in range(rng.randrange(4)):
            batch.actions.append(action(rng.randrange(240), b"a%d" % step, performed=step))
        if rng.random() < 0.08:
            batch.delete_below = rng.randrange(150)
        cut = batch.delete_below
        if cut is not None:
            model = {p: a for p, a in model.items() if p >= cut}
        for r in batch.runs:
            for a in packed.expand(r):
                if cut is None or a.position >= cut:
                    model[a.position] = a
        for a in batch.actions:
            if cut is None or a.position >= cut:
                model[a.position] = a
        store.apply(batch)
        if step % 25 == 24:
            store = reopen(run_engine, store, open_runs)
        want = [model[p] for p in sorted(model)]
        assert list(store.scan(0, 2**64 - 1)) == want, step
        lo, hi = sorted((rng.randrange(250), rng.randrange(250)))
        assert list(store.scan(lo, hi)) == [a for a in want if lo <= a.position <= hi]
        expanded = [
            x
            for r in store.scan_records(lo, hi)
            for x in (packed.expand(r) if isinstance(r, pb.Run) else [r])
        ]
        assert expanded == [a for a in want if lo <= a.position <= hi]
        probe = rng.randrange(250)
        assert store.get(probe) == model.get(probe)
        assert store.first_position() == (min(model) if model else None)
        assert store.last_position() == (max(model) if model else None)


def test_segment_torn_run_frame_is_cut_and_a_bad_crc_ends_the_log(tmp_path: Path) -> None:
    from rlog.storage.segment_engine import SegmentStorage

    store = SegmentStorage(tmp_path / "data", segment_bytes=1 << 20)
    value = b"v" * 1024
    data, offsets = packed.pack([value] * 64)
    for b in range(6):
        r = packed.make_run(b * 64, pb.Action(performed=b), data, offsets)
        store.apply(WriteBatch(runs=[r], metadata=pb.Metadata(promised=b)))
    store.close()
    (seg,) = (tmp_path / "data" / "segments").glob("*.seg")
    size = seg.stat().st_size
    with seg.open("r+b") as f:  # the last run's frame (~66 KiB) reached the disk in part
        f.truncate(size - 30_000)
    # A torn write never returned, so the synced mark never said the frame was synced: a
    # dir without a mark stands for that (with it, the cut is loss: tests above).
    mark = tmp_path / "data" / "segments" / MARK_NAME
    mark.unlink()
    store = SegmentStorage(tmp_path / "data")
    assert records(store) == [("run", b * 64, b * 64 + 63) for b in range(5)]
    assert store.metadata().promised == 4  # the torn batch is wholly gone, metadata too
    assert seg.stat().st_size < size - 60_000  # cut at the start of the torn frame
    store.close()
    # A flipped byte inside the newest frame's run bytes: its CRC fails, the log ends there.
    size = seg.stat().st_size
    with seg.open("r+b") as f:
        f.seek(size - 5000)
        byte = f.read(1)
        f.seek(size - 5000)
        f.write(bytes([byte[0] ^ 0x01]))
    mark.unlink()
    store = SegmentStorage(tmp_path / "data")
    try:
        assert records(store) == [("run", b * 64, b * 64 + 63) for b in range(4)]
        assert store.metadata().promised == 3
        assert all(a.value == value for a in store.scan(0, 2**64 - 1))
        store.apply(WriteBatch(runs=[packed.make_run(256, pb.Action(), data, offsets)]))
        assert store.last_position() == 256 + 63
    finally:
        store.close()


@pytest.mark.parametrize("engine", DISK)
def test_a_scan_reads_about_what_its_consumer_takes(engine: str, tmp_path: Path) -> None:
    """A consumer that stops after a few large records (a Fetch answer of 4 MiB) must not
    have copied hundreds of them out of the engine; a whole scan reads each record once."""
    from rlog.storage.records import SCAN_CHUNK, SCAN_FIRST_CHUNK

    store = open_storage(tmp_path / "data", engine)
    try:
        big = b"v" * 65_536
        count = SCAN_CHUNK + 44  # more records than one read used to take at once
        for first in range(0, count, 50):
            batch = []
            for n in range(first, min(first + 50, count)):
                data, offsets = packed.pack([big] * 4)
                head = pb.Action(type=pb.APPEND, learned=True)
                batch.append(packed.make_run(n * 4, head, data, offsets))
            store.apply(WriteBatch(runs=batch))
        reads: list[int] = []
        range_read = store._range  # type: ignore[attr-defined]

        def counted(first: int, last: int, limit: int) -> list[tuple[int, bytes]]:
            found = range_read(first, last, limit)
            reads.append(len(found))
            return found

        store._range = counted  # type: ignore[attr-defined]
        scan = store.scan_records(0, 4 * count - 1)
        taken = [next(scan), next(scan)]
        assert [r.first for r in taken] == [0, 4]  # type: ignore[union-attr]
        assert sum(reads) <= SCAN_FIRST_CHUNK
        rest = list(scan)
        assert [r.first for r in taken + rest] == [4 * n for n in range(count)]  # type: ignore[union-attr]
        assert sum(reads) == count - 1  # each record read once (the first by the floor lookup)
    finally:
        store.close()
