"""The storage engines across a power cut (docs/faults.md, "Power loss"): a process writes
synced batches into a data dir on powerfs (tests/powerfs/), is SIGKILLed, the mount drops
whatever was not synced, and the data dir is opened again: every synced batch is there.

A SIGKILL alone keeps the page cache and every directory entry, so these are the tests that
fail when a file's data, a new file's or directory's entry, or a rename is not synced."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines import DISK, action, positions

from jepsen import powerfs
from jepsen.powerfs import PowerFS
from rlog.proto import rlog_pb2 as pb
from rlog.storage import open_storage
from rlog.storage.segment_engine import SegmentStorage

UNAVAILABLE = powerfs.unavailable()
pytestmark = pytest.mark.skipif(
    UNAVAILABLE is not None, reason=f"powerfs cannot run: {UNAVAILABLE}"
)

# Writes `batches` synced batches of 10 positions into a data dir, each with the metadata
# (VOTING, learned_below = the next position), says so and waits to be killed. With
# `segment_bytes` > 0 it uses the segment engine with segments that small and a snapshot at
# every roll, and deletes below half of what it wrote at each batch (rolls, index snapshots,
# reclaimed segments).
WRITER = textwrap.dedent(
    """
    import sys, time
    from rlog.proto import rlog_pb2 as pb
    from rlog.storage import WriteBatch, open_storage
    from rlog.storage.segment_engine import SegmentStorage

    engine, path = sys.argv[1], sys.argv[2]
    batches, segment_bytes = int(sys.argv[3]), int(sys.argv[4])
    if segment_bytes:
        store = SegmentStorage(path, segment_bytes=segment_bytes, snapshot_ratio=1)
    else:
        store = open_storage(path, engine)
    for b in range(batches):
        first = 1 + 10 * b
        actions = [
            pb.Action(position=p, type=pb.APPEND, value=b"v%d" % p * 20)
            for p in range(first, first + 10)
        ]
        meta = pb.Metadata(status=pb.VOTING, learned_below=first + 10)
        cut = (first + 10) // 2 if segment_bytes else None
        store.apply(WriteBatch(metadata=meta, actions=actions, delete_below=cut, sync=True))
    print("synced", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[PowerFS]:
    with PowerFS(tmp_path / "mnt", tmp_path / "backing") as fs:
        yield fs


def write_then_cut(
    mount: PowerFS, engine: str, path: Path, batches: int, segment_bytes: int
) -> str:
    """Run the writer until it synced every batch, SIGKILL it, drop the mount's unsynced
    state; what the drop undid."""
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER, engine, str(path), str(batches), str(segment_bytes)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "synced", "the writer failed"
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    return mount.drop()


@pytest.mark.parametrize("where", ["created", "given"])
@pytest.mark.parametrize("engine", DISK)
def test_a_new_data_dir_keeps_every_synced_batch_across_a_power_cut(
    mount: PowerFS, engine: str, where: str
) -> None:
    # "created": the data dir is created inside the mount (as a replica creates its own);
    # "given": the mount is the data dir (a volume). Then the engine's sub-directory and
    # its files are created: each entry must be synced.
    path = mount.mountpoint / "data" if where == "created" else mount.mountpoint
    write_then_cut(mount, engine, path, batches=5, segment_bytes=0)
    store = open_storage(path, engine)
    try:
        assert store.metadata().status == pb.VOTING
        assert store.metadata().learned_below == 51
        assert positions(store) == list(range(1, 51))
        assert store.get(50) == action(50, b"v50" * 20)
    finally:
        store.close()


@pytest.mark.parametrize("engine", DISK)
def test_a_store_opened_and_never_written_opens_after_a_power_cut(
    mount: PowerFS, engine: str
) -> None:
    # Opening a new store writes its files (LevelDB: a MANIFEST, CURRENT renamed into
    # place): a power cut right after must leave a store that opens, empty.
    path = mount.mountpoint / "data"
    write_then_cut(mount, engine, path, batches=0, segment_bytes=0)
    store = open_storage(path, engine)
    try:
        assert store.metadata().status == pb.EMPTY
        assert positions(store) == []
    finally:
        store.close()


def test_segment_rolls_snapshots_and_reclaims_keep_every_synced_batch(mount: PowerFS) -> None:
    # Segments of 4 KiB (a roll every few batches), an index snapshot at every roll, and
    # segments reclaimed as the begin moves up: new files, renames and unlinks, all of
    # whose entries must be synced before what depends on them.
    path = mount.mountpoint / "data"
    write_then_cut(mount, "segment", path, batches=60, segment_bytes=4096)
    segments = sorted(p.name for p in (mount.backing / "data" / "segments").iterdir())
    assert sum(name.endswith(".seg") for name in segments) > 3
    assert any(name.endswith(".idx") for name in segments)
    store = SegmentStorage(path, segment_bytes=4096, snapshot_ratio=1)
    try:
        assert store.metadata().learned_below == 601
        assert positions(store) == list(range(300, 601))
        assert store.get(600) == action(600, b"v600" * 20)
    finally:
        store.close()


# LevelDB with batches of one 100 KB record until its memtable (4 MiB) fills and it starts
# a new write-ahead log, then one batch more, synced; the batches before it synced too, or
# (argv[2] == "unsynced") not; prints the last position and waits.
LOG_SWITCH_WRITER = textwrap.dedent(
    """
    import os, sys, time
    from rlog.proto import rlog_pb2 as pb
    from rlog.storage import WriteBatch, open_storage

    path, synced = sys.argv[1], sys.argv[2] == "synced"
    store = open_storage(path, "leveldb")

    def newest_log():
        names = os.listdir(os.path.join(path, "leveldb"))
        return max(int(name[:-4]) for name in names if name.endswith(".log"))

    first_log, position, switched = newest_log(), 0, False
    while not switched:
        switched = newest_log() > first_log  # the batch after the switch goes in too
        position += 1
        action = pb.Action(position=position, type=pb.APPEND, value=b"x" * 100_000)
        meta = pb.Metadata(status=pb.VOTING, learned_below=position + 1)
        store.apply(WriteBatch(metadata=meta, actions=[action], sync=synced or switched))
    print(position, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("before", ["synced", "unsynced"])
@pytest.mark.parametrize("engine", [e for e in DISK if "leveldb" in str(e.values)])
def test_leveldb_batches_in_a_new_write_ahead_log_survive_a_power_cut(
    mount: PowerFS, engine: str, before: str
) -> None:
    # The new log's name must be synced before the batches in it are acknowledged, not
    # when LevelDB's background flush of the full memtable gets to it. And a synced batch
    # leaves every batch before it durable (as it does within one log: the engines'
    # contract), those left unsynced in the old log too.
    path = mount.mountpoint / "data"
    writer = subprocess.Popen(
        [sys.executable, "-c", LOG_SWITCH_WRITER, str(path), before],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert writer.stdout is not None
        last = int(writer.stdout.readline())
    finally:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    mount.drop()
    store = open_storage(path, engine)
    try:
        assert store.metadata().learned_below == last + 1
        assert positions(store) == list(range(1, last + 1))
    finally:
        store.close()
