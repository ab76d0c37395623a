"""slowfs (bench/slowfs, `make bench-slow-disk`): the volume the benchmark kit slows its data
down on. What it promises, on a real mount: data passes through unchanged, every file
sync takes at least the latency asked for, and syncs from two threads wait their turn (one
device). Lower bounds only: each follows from the sleeps slowfs does, whatever the host's
speed."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jepsen.powerfs import mounted, unavailable

REPO = Path(__file__).resolve().parents[2]
UNAVAILABLE = unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"no FUSE here: {UNAVAILABLE}")

LATENCY = 0.1  # seconds: far above a real sync here, so the bounds below say slowfs did it


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    binary = subprocess.run(
        [str(REPO / "tests" / "powerfs" / "build.sh"), str(REPO / "bench" / "slowfs")],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.split()[-1]
    root = tmp_path_factory.mktemp("slowfs")
    backing, mountpoint = root / "backing", root / "mnt"
    backing.mkdir()
    mountpoint.mkdir()
    process = subprocess.Popen(
        [binary, "-sync-latency", f"{LATENCY}s", backing, mountpoint],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 10
        while not mounted(mountpoint):
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "slowfs did not mount in 10 s"
            time.sleep(0.05)
        yield mountpoint
    finally:
        process.terminate()
        process.wait(timeout=10)
    assert not mounted(mountpoint)


def timed_sync(fd: int) -> float:
    t0 = time.monotonic()
    os.fdatasync(fd)
    return time.monotonic() - t0


def test_data_passes_through_and_syncs_are_slow(slow: Path) -> None:
    data = os.urandom(300_000)
    fd = os.open(slow / "pass", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.write(fd, data)
        assert timed_sync(fd) >= LATENCY
        assert timed_sync(fd) >= LATENCY  # nothing written since: still a sync
        os.fsync(fd)
    finally:
        os.close(fd)
    assert (slow / "pass").read_bytes() == data
    assert (slow.parent / "backing" / "pass").read_bytes() == data


def test_syncs_of_two_files_wait_their_turn(slow: Path) -> None:
    fds = [os.open(slow / f"turn{i}", os.O_WRONLY | os.O_CREAT, 0o600) for i in range(2)]
    try:
        for fd in fds:
            os.write(fd, b"x")
        threads = [threading.Thread(target=os.fdatasync, args=(fd,)) for fd in fds]
        t0 = time.monotonic()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert time.monotonic() - t0 >= 2 * LATENCY  # one device: one after the other
    finally:
        for fd in fds:
            os.close(fd)
