"""The storage engines under test and what the storage tests build for them: the engines as
pytest params (skipped where not installed), records (`action`, `run`), the positions a
store holds, and a script that opens a data dir in another process."""

from __future__ import annotations

import tempfile
import textwrap
from pathlib import Path

import pytest

from rlog import packed
from rlog.proto import rlog_pb2 as pb
from rlog.storage import ENGINES, Storage, StorageError, open_storage

DISK_ENGINES = [e for e in ENGINES if e != "memory"]

# Engines that store runs (WriteBatch.runs) as the contract in rlog/storage/base.py says. The
# memory engine gains runs on another branch: add "memory" here when that branch is merged,
# and the run tests (tests/storage/test_storage.py) cover it too.
RUN_ENGINES_BESIDES_DISK: list[str] = ["memory"]


def available(engine: str) -> bool:
    try:
        open_storage(Path(tempfile.gettempdir()) / "never-created" / "x", engine)
    except StorageError as exc:
        return "needs" not in str(exc)
    return True


def _param(engine: str):  # type: ignore[no-untyped-def]
    mark = pytest.mark.skipif(not available(engine), reason=f"{engine} not installed")
    return pytest.param(engine, marks=mark)


ALL = [_param(e) for e in ENGINES]
DISK = [_param(e) for e in DISK_ENGINES]
RUN_ENGINES = [_param(e) for e in [*DISK_ENGINES, *RUN_ENGINES_BESIDES_DISK]]


def action(position: int, value: bytes = b"", **kw: object) -> pb.Action:
    return pb.Action(position=position, type=pb.APPEND, value=value, **kw)  # type: ignore[arg-type]


def positions(store: Storage, first: int = 0, last: int = 2**64 - 1) -> list[int]:
    return [a.position for a in store.scan(first, last)]


def run(first: int, count: int, tag: bytes = b"r", **head: object) -> pb.Run:
    """A run of `count` values b"<tag>:<position>" at first.. with the given head fields."""
    values = [b"%s:%d" % (tag, p) for p in range(first, first + count)]
    data, offsets = packed.pack(values)
    return packed.make_run(first, pb.Action(type=pb.APPEND, **head), data, offsets)  # type: ignore[arg-type]


# Opens the data dir argv[1] with engine argv[2] and holds it until its stdin closes.
OPEN_SCRIPT = textwrap.dedent(
    """
    import sys
    from rlog.storage import StorageError, open_storage
    try:
        store = open_storage(sys.argv[1], sys.argv[2])
    except StorageError as exc:
        print("StorageError:", exc)
        sys.exit(3)
    print("opened", flush=True)
    sys.stdin.read()  # hold the dir until the parent closes our stdin
    store.close()
    """
)
