"""A replica that finds its data dir held by another live process (the container it
replaces, still exiting) waits for it instead of exiting: `open_when_free`, against a real
process holding the dir's lock."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from engines import OPEN_SCRIPT

from rlog.runtime.process import open_when_free
from rlog.storage import DataDirLocked


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """A process that opened tmp_path/data (lmdb) and holds it until its stdin closes."""
    proc = subprocess.Popen(
        [sys.executable, "-c", OPEN_SCRIPT, str(tmp_path / "data"), "lmdb"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "opened"
    yield proc
    if proc.poll() is None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)


def test_the_replica_opens_the_dir_once_its_holder_exits(
    holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    async def scenario() -> float:
        started = time.monotonic()
        opening = asyncio.create_task(open_when_free(tmp_path / "data", "lmdb", 30.0))
        await asyncio.sleep(1.5)
        assert not opening.done()  # still waiting while the holder lives
        assert holder.stdin is not None
        holder.stdin.close()  # the old process exits and its lock goes with it
        storage, _ = await opening
        storage.close()
        return time.monotonic() - started

    assert asyncio.run(scenario()) >= 1.5
    assert holder.wait(timeout=60) == 0


def test_the_wait_ends_with_the_holder_named(holder: subprocess.Popen[str], tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(DataDirLocked, match=rf"pid {holder.pid}\).*waited 1s"):
        asyncio.run(open_when_free(tmp_path / "data", "lmdb", 1.0))
    assert time.monotonic() - started >= 1.0
    assert holder.poll() is None  # the holder was left alone


def test_a_free_dir_opens_at_once(tmp_path: Path) -> None:
    storage, opened = asyncio.run(open_when_free(tmp_path / "data", "lmdb", 30.0))
    try:
        assert opened == "lmdb engine (asked for by name)"
        assert storage.metadata() is not None
    finally:
        storage.close()
