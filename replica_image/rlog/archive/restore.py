"""Restore: build the data dirs of a brand-new log from an archive, offline (docs/backup.md).

Every data dir gets the same content: the archived APPEND entries at their own positions
as learned runs, a learned NOP at every position of the range that held no APPEND (a NOP,
SESSION, EPOCH or TRUNCATE entry of the old log), `begin` at the archive's first position,
everything up to the restore point learned, and the status VOTING, like `rlog initialize`
and under the same rule: only for every replica of a new log, never one replica of a
running log. The replicas stamp the dirs with their log id on first start.
"""

from __future__ import annotations

import asyncio
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
    the operator's permit: docs/backup.md). Every segment is verified (size, SHA-256, framing,
    positions) before anything of it is written; a corrupt one stops the restore with
    `CorruptSegment` and leaves the dirs unusable as a log (not VOTING)."""
    manifest = await read_manifest(store)
    to = _restore_point(manifest, to_position)
    for d in data_dirs:
        if not await asyncio.to_thread(is_fresh, d, storage_engine):
            raise ArchiveError(f"the data dir {d} is not fresh: restore only into new data dirs")
    storages: list[Storage] = [
        await asyncio.to_thread(open_storage, d, storage_engine) for d in data_dirs
    ]
    result = RestoreResult(manifest.begin, to, 0, 0, 0)
    try:
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
