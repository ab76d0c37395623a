"""Restore: build the data dirs of a brand-new log from an archive, offline (docs/backup.md).

Every data dir gets the same content: the archived APPEND entries at their own positions
as learned runs, a learned NOP at every position of the range that held no APPEND (a NOP,
SESSION, EPOCH or TRUNCATE entry of the old log), `begin` at the archive's first position,
everything up to the restore point learned, and the status VOTING, like `rlog initialize`
and under the same rule: only for every replica of a new log, never one replica of a
running log. The replicas stamp the dirs with their log id on first start.

All or nothing: every data dir is marked (rlog.storage.restoring) before any record is
written and the mark is removed only once every record and the metadata are synced, every
segment having passed its SHA-256 first. A restore cut short (an S3 error, a kill, an OOM)
leaves the mark: the dir is never fresh, never initialized, never served, and a restore
run again discards what it holds and starts over.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlog.archive.format import (
    MANIFEST_NAME,
    ArchiveError,
    Manifest,
    SegmentInfo,
    decode_segment,
)
from rlog.archive.store import ObjectStore
from rlog.initialize import is_fresh
from rlog.packed import clip, run_count, run_last
from rlog.proto import rlog_pb2 as pb
from rlog.storage import AUTO, Storage, WriteBatch, open_storage
from rlog.storage.restoring import clear_restoring, mark_restoring, restoring

# TEST ONLY: `rlog restore` run with this environment variable set to a point of the
# restore ("marked": every dir marked; "segment:N": N segments written; "written": the
# metadata synced, the marks not yet removed) stops itself there (SIGSTOP) after saying so
# on stderr, so that a test can SIGKILL it exactly there, never by timing
# (tests/archive/test_restore_interrupted_live.py).
STOP_AT_ENV = "RLOG_TEST_RESTORE_STOP_AT"


def _stop_here_if_asked(point: str) -> None:
    if os.environ.get(STOP_AT_ENV) == point:
        print(f"rlog restore: stopped at {point} ({STOP_AT_ENV})", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


@dataclass
class RestoreResult:
    begin: int
    to_position: int | None  # the last position restored (None: an empty archive)
    segments: int
    entries: int
    bytes: int

    def to_dict(self) -> dict[str, int | None]:
        return dict(vars(self))


async def read_manifest(store: ObjectStore) -> Manifest:
    await store.check_bucket()
    raw = await store.get(MANIFEST_NAME)
    if raw is None:
        raise ArchiveError(f"no archive at {store.where()} (no {MANIFEST_NAME} there)")
    return Manifest.from_json(raw, store.where(MANIFEST_NAME))


async def fetch_segment(store: ObjectStore, info: SegmentInfo) -> list[pb.Run]:
    raw = await store.get(info.key)
    if raw is None:
        raise ArchiveError(f"segment {store.where(info.key)} is listed in the manifest but missing")
    return await asyncio.to_thread(decode_segment, raw, info, store.where(info.key))


def _restore_point(manifest: Manifest, to_position: int | None) -> int | None:
    last = manifest.archived_through
    if to_position is None:
        return last
    if last is None or to_position > last:
        raise ArchiveError(
            f"cannot restore to position {to_position}: the archive ends at "
            f"{'nothing (it is empty)' if last is None else last}"
        )
    if to_position < manifest.begin:
        raise ArchiveError(
            f"cannot restore to position {to_position}: the archive begins at "
            f"{manifest.begin} (older segments were deleted by retention)"
        )
    return to_position


def _batch(runs: list[pb.Run], first: int, last: int) -> WriteBatch:
    """The records of [first, last]: the runs as learned APPENDs, NOPs in the gaps."""
    head = pb.Action(type=pb.APPEND, learned=True)
    batch = WriteBatch(sync=False)
    position = first
    for run in runs:
        run = clip(run, first, last)
        if run_count(run) == 0:
            continue
        batch.actions += [
            pb.Action(position=p, type=pb.NOP, learned=True) for p in range(position, run.first)
        ]
        stored = pb.Run(first=run.first, data=run.data, offsets=run.offsets)
        stored.head.CopyFrom(head)
        batch.runs.append(stored)
        position = run_last(run) + 1
    batch.actions += [
        pb.Action(position=p, type=pb.NOP, learned=True) for p in range(position, last + 1)
    ]
    return batch


async def restore(
    store: ObjectStore,
    data_dirs: list[Path],
    to_position: int | None = None,
    storage_engine: str = AUTO,
    progress: Callable[[SegmentInfo], None] | None = None,
    status: pb.Status.ValueType = pb.VOTING,
) -> RestoreResult:
    """Restore the archive (up to `to_position`, default: all of it) into every data dir,
    each of which must be fresh. `status`: VOTING (an offline restore of every replica), or
    STARTING (the replicas then finish the initialization's second phase themselves, with
    the operator's permit: docs/backup.md). A dir that holds the mark of an unfinished
    restore is taken too: what it holds is discarded first. Every segment is verified (size,
    SHA-256, framing, positions) before anything of it is written; a corrupt one stops the
    restore with `CorruptSegment`. Whatever stops it leaves the dirs marked, never a log."""
    manifest = await read_manifest(store)
    to = _restore_point(manifest, to_position)
    for d in data_dirs:
        if not restoring(d) and not await asyncio.to_thread(is_fresh, d, storage_engine):
            raise ArchiveError(f"the data dir {d} is not fresh: restore only into new data dirs")
    what = f"restore of {store.where()} through position {to} (rlog restore, pid {os.getpid()})"
    for d in data_dirs:
        await asyncio.to_thread(mark_restoring, d, what)
    _stop_here_if_asked("marked")
    storages: list[Storage] = []
    result = RestoreResult(manifest.begin, to, 0, 0, 0)
    try:
        for d in data_dirs:
            storages.append(await asyncio.to_thread(open_storage, d, storage_engine))
        if to is not None:
            wanted = [s for s in manifest.segments if s.first <= to]
            for info in wanted:
                runs = await fetch_segment(store, info)
                last = min(info.last, to)
                for storage in storages:  # a batch each: engines may keep what they apply
                    batch = _batch(runs, info.first, last)
                    await asyncio.to_thread(storage.apply, batch)
                result.segments += 1
                result.entries += sum(run_count(r) for r in batch.runs)
                result.bytes += info.bytes
                if progress is not None:
                    progress(info)
                _stop_here_if_asked(f"segment:{result.segments}")
        meta = pb.Metadata(
            status=status,
            begin=manifest.begin,
            learned_below=manifest.begin if to is None else to + 1,
        )
        for storage in storages:
            await asyncio.to_thread(storage.apply, WriteBatch(metadata=meta, sync=True))
    finally:
        for storage in storages:
            await asyncio.to_thread(storage.close)
    _stop_here_if_asked("written")
    for d in data_dirs:  # last: every record and the metadata are synced
        await asyncio.to_thread(clear_restoring, d)
    return result


async def verify(store: ObjectStore, to_position: int | None = None) -> RestoreResult:
    """Check every segment a restore to `to_position` would read, writing nothing."""
    manifest = await read_manifest(store)
    to = _restore_point(manifest, to_position)
    result = RestoreResult(manifest.begin, to, 0, 0, 0)
    for info in manifest.segments:
        if to is None or info.first > to:
            break
        runs = await fetch_segment(store, info)
        result.segments += 1
        result.entries += sum(run_count(clip(r, info.first, to)) for r in runs)
        result.bytes += info.bytes
    return result
