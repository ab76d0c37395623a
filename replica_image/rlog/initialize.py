"""Offline operations on a replica's data dir: `rlog initialize` and the freshness test
`rlog dev` and `rlog restore` use before initializing a brand-new log. A data dir that
holds the mark of an unfinished restore (rlog.storage.restoring) is neither: it is never
fresh and never initialized.

Initializing sets a fresh, empty data dir VOTING without running the protocol, like
`mesos-log initialize`: it is only safe when every replica of a brand-new log is initialized
this way (docs/recovery.md explains why a single wiped replica must never be).
"""

from __future__ import annotations

from pathlib import Path

from rlog.client.errors import RlogError
from rlog.proto import rlog_pb2 as pb
from rlog.storage import AUTO, WriteBatch, open_storage
from rlog.storage.restoring import refuse_if_restoring, restoring


def initialize(data_dir: str | Path, storage_engine: str = AUTO) -> None:
    """Set a fresh data dir VOTING offline (like `mesos-log initialize`). Raises
    StorageError if it cannot be opened or holds an unfinished restore, and RlogError if the
    log in it is not empty."""
    refuse_if_restoring(Path(data_dir))
    storage = open_storage(Path(data_dir), storage_engine)
    try:
        meta = storage.metadata()
        if meta.status != pb.EMPTY or storage.first_position() is not None:
            raise RlogError(f"the log at {data_dir} is not empty")
        meta.status = pb.VOTING
        storage.apply(WriteBatch(metadata=meta, sync=True))
    finally:
        storage.close()


def is_fresh(data_dir: Path, storage_engine: str = AUTO) -> bool:
    """True if the data dir is missing, empty, or holds an EMPTY replica with no entries
    (and no mark of an unfinished restore)."""
    if restoring(data_dir):
        return False
    if not data_dir.exists() or not any(data_dir.iterdir()):
        return True
    storage = open_storage(data_dir, storage_engine)
    try:
        return storage.metadata().status == pb.EMPTY and storage.first_position() is None
    finally:
        storage.close()
