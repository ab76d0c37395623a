"""Power loss (docs/faults.md, "Power loss"): powerfs, the FUSE file system that drops what
was not synced (tests/powerfs/), and real replicas whose power is cut under a writer.

A SIGKILL keeps the page cache, so it cannot show a missing fsync; a drop of powerfs can.
The file system's own tests come first (what a drop loses and keeps), then three replicas
on it: every acknowledged append survives a power cut of all of them at once, and with the
batches' fdatasync skipped (the test-only RLOG_UNSAFE_NO_SYNC=1) the same cut loses
acknowledged appends, which shows the test can fail.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from live import Writers, append_acked

from jepsen import powerfs
from jepsen.powerfs import PowerFS, mount_data_dirs, power_cut, unmount_all
from rlog.client import Client
from rlog.config import UNSAFE_NO_SYNC_ENV
from rlog.tools import consistency
from rlog.tools.dev import DevCluster

UNAVAILABLE = powerfs.unavailable()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(UNAVAILABLE is not None, reason=f"powerfs cannot run: {UNAVAILABLE}"),
]


@pytest.fixture
def mount(tmp_path: Path) -> Iterator[PowerFS]:
    with PowerFS(tmp_path / "mnt", tmp_path / "backing") as fs:
        yield fs


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write(path: Path, data: bytes, sync: bool, offset: int | None = None) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        if offset is None:
            os.lseek(fd, 0, os.SEEK_END)
            os.write(fd, data)
        else:
            os.pwrite(fd, data, offset)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


# ---- the file system ----------------------------------------------------------------------


def test_data_not_synced_is_lost_even_after_close_and_synced_data_stays(mount: PowerFS) -> None:
    root = mount.mountpoint
    write(root / "f", b"synced.", sync=True)
    fsync_dir(root)
    write(root / "f", b"appended", sync=False)
    write(root / "f", b"XX", sync=False, offset=2)  # over synced bytes
    assert (root / "f").read_bytes() == b"syXXed.appended"  # the process sees its writes
    assert mount.pending() == {"files": 1, "dirs": 0}
    mount.drop()
    assert (root / "f").read_bytes() == b"synced."
    assert (mount.backing / "f").read_bytes() == b"synced."
    # A truncate not synced is undone too; one synced stays.
    os.truncate(root / "f", 2)
    mount.drop()
    assert (root / "f").read_bytes() == b"synced."
    fd = os.open(root / "f", os.O_WRONLY)
    os.ftruncate(fd, 2)
    os.fsync(fd)
    os.close(fd)
    mount.drop()
    assert (root / "f").read_bytes() == b"sy"
    assert mount.pending() == {"files": 0, "dirs": 0}


def test_a_file_synced_in_a_directory_never_synced_vanishes(mount: PowerFS) -> None:
    root = mount.mountpoint
    write(root / "lost", b"data", sync=True)  # its data synced, its name not
    (root / "sub").mkdir()
    write(root / "sub" / "x", b"x", sync=True)
    fsync_dir(root / "sub")  # the entry of x in sub is durable, sub's in root is not
    write(root / "kept", b"data", sync=True)
    fsync_dir(root)  # now every name in root is durable: lost, sub, kept
    write(root / "late", b"data", sync=True)  # created after that fsync
    mount.drop()
    assert sorted(p.name for p in root.iterdir()) == ["kept", "lost", "sub"]
    assert (root / "sub" / "x").read_bytes() == b"x"
    (root / "d").mkdir()
    write(root / "d" / "y", b"y", sync=True)
    fsync_dir(root / "d")
    mount.drop()  # root never synced after mkdir d: d and y are gone
    assert not (root / "d").exists()
    assert sorted(p.name for p in mount.backing.iterdir()) == [
        ".powerfs-stash",
        "kept",
        "lost",
        "sub",
    ]


def test_a_rename_or_unlink_not_followed_by_a_directory_fsync_is_undone(mount: PowerFS) -> None:
    root = mount.mountpoint
    write(root / "current", b"old", sync=True)
    fsync_dir(root)
    # The atomic replace: temp file, fsync, rename over, (no) fsync of the directory.
    write(root / "current.tmp", b"new", sync=True)
    os.rename(root / "current.tmp", root / "current")
    assert (root / "current").read_bytes() == b"new"
    mount.drop()
    assert sorted(p.name for p in root.iterdir()) == ["current"]
    assert (root / "current").read_bytes() == b"old"
    # With the directory fsync it stays.
    write(root / "current.tmp", b"new", sync=True)
    os.rename(root / "current.tmp", root / "current")
    fsync_dir(root)
    mount.drop()
    assert (root / "current").read_bytes() == b"new"
    # An unlink comes back; a moved directory goes back with what it holds.
    (root / "a").mkdir()
    write(root / "a" / "f", b"f", sync=True)
    fsync_dir(root / "a")
    fsync_dir(root)
    (root / "current").unlink()
    os.rename(root / "a", root / "b")
    (root / "b" / "f").unlink()
    os.rmdir(root / "b")
    assert sorted(p.name for p in root.iterdir()) == []
    mount.drop()
    assert sorted(p.name for p in root.iterdir()) == ["a", "current"]
    assert (root / "a" / "f").read_bytes() == b"f"
    assert (root / "current").read_bytes() == b"new"


def test_statfs_reports_the_backing_disk(mount: PowerFS) -> None:
    # rlog's --min-free-bytes guard reads statvfs of the data dir: powerfs must report the
    # disk under it, not 0 free.
    mounted, backing = os.statvfs(mount.mountpoint), os.statvfs(mount.backing)
    assert mounted.f_blocks * mounted.f_frsize == backing.f_blocks * backing.f_frsize
    assert abs(mounted.f_bavail * mounted.f_frsize - shutil.disk_usage(mount.backing).free) < (
        64 << 20
    )


# ---- replicas -----------------------------------------------------------------------------


def cut_all_under_a_writer(tmp_path: Path, env: dict[str, str]) -> tuple[dict[int, bytes], int]:
    """Three replicas on powerfs; writers append; the power of all three is cut at once (all
    SIGKILLed, then every mount drops what was not synced) and they start again. Returns
    what was acknowledged before the cut and the cluster (stopped) after one more append
    went through, and how many of those acknowledged positions the log lost."""
    cluster = DevCluster(3, tmp_path, distinct_hosts=True, election_timeout=0.5, env=env)
    mounts = mount_data_dirs(cluster)
    try:
        cluster.start(timeout=60)
        writers = Writers(cluster.endpoints, clients=4, per_call=5)

        async def load() -> dict[int, bytes]:
            task = asyncio.create_task(writers.run())
            while len(writers.acknowledged) < 400:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
            # The cut lands while appends are in flight; those the cut interrupts were not
            # acknowledged, and need not wait for their timeouts.
            await asyncio.to_thread(power_cut, cluster, mounts, range(3))
            acknowledged = dict(writers.acknowledged)
            writers.stop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            return acknowledged

        acknowledged = asyncio.run(load())
        for i in range(3):
            cluster.start_replica(i)
        cluster.wait_for_leader(60)
        with Client(cluster.endpoints, timeout=10) as client:
            append_acked(client, [b"after the cut"])  # a leader elected and its fill done
            log = {entry.position: entry.value for entry in client.read()}
        lost = sum(1 for position, value in acknowledged.items() if log.get(position) != value)
        if not lost:
            report = consistency.check_sync(cluster.endpoints, acknowledged, settle_timeout=60)
            assert report.ok, str(report)  # and every replica holds them
        return acknowledged, lost
    finally:
        cluster.stop()
        unmount_all(mounts)


def test_every_acknowledged_append_survives_a_power_cut_of_every_replica(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != UNSAFE_NO_SYNC_ENV}
    acknowledged, lost = cut_all_under_a_writer(tmp_path, env)
    assert len(acknowledged) >= 400
    assert lost == 0


def test_without_the_batch_fdatasync_a_power_cut_loses_acknowledged_appends(
    tmp_path: Path,
) -> None:
    # The planted bug: the replicas skip the fdatasync of every batch (the test process's
    # own `initialize` still syncs, so they come back VOTING). The same cut must lose
    # acknowledged appends, or the test above proves nothing.
    env = {**os.environ, UNSAFE_NO_SYNC_ENV: "1"}
    acknowledged, lost = cut_all_under_a_writer(tmp_path, env)
    assert len(acknowledged) >= 400
    assert lost > 0
