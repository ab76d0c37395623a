"""The data dirs older rlogs wrote (tests/fixtures/: format 1 before versions, format 2 before
checksums, format 3 before CRC32C frames), unpacked for the storage format tests, and a data
dir's files as bytes to show that nothing in it changed."""

from __future__ import annotations

import tarfile
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "storage_v1"
FIXTURES_V2 = Path(__file__).parent / "fixtures" / "storage_v2"
FIXTURES_V3 = Path(__file__).parent / "fixtures" / "storage_v3"
SUBDIR = {"lmdb": "lmdb", "leveldb": "leveldb", "rocksdb": "rocksdb", "segment": "segments"}


def unpack_v1(engine: str, into: Path) -> Path:
    with tarfile.open(FIXTURES / f"{engine}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return into / "data"


def unpack_v2(engine: str, into: Path) -> Path:
    with tarfile.open(FIXTURES_V2 / f"{engine}.tar.gz") as tar:
        tar.extractall(into, filter="data")
    return into / "data"


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
