"""Small file systems for the disk-full tests: a tmpfs of a given size (root needed), and a
remount that gives it room again."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tiny_tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` mounted at `where` (root needed), unmounted on the way out."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the disk-full tests need root): {done.stderr}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def remount(where: Path, size: str) -> None:
    subprocess.run(
        ["mount", "-o", f"remount,size={size}", str(where)], check=True, capture_output=True
    )
