"""LevelDB engine (plyvel), the engine Mesos' replicated log uses.

Layout: <data dir>/leveldb/ (a LevelDB directory). Keys: b"a" + 8-byte big-endian first
position for the records (an action, or a whole run; rlog/storage/records.py), b"m" for the
serialized Metadata.

Durability: one `WriteBatch` per `apply`, written with `sync=batch.sync` (sync=True makes
LevelDB fdatasync its write-ahead log before returning; sync=False skips it, so a machine
crash may lose that batch, a process crash does not). After a synced batch the directory is
synced too when a file appeared in it, and the write-ahead logs before that (a new log
started when the memtable filled: `_sync_names`).

Deletion below a position: LevelDB has no range delete, so the batch carries one delete per
stored key of the prefix (read with a key-only iterator), then, as Mesos does after a
truncation, a large deletion is followed by CompactRange over the prefix so later scans and
first_position() do not wade through tombstones.
"""

from __future__ import annotations

import os
from pathlib import Path

import plyvel

from rlog.proto import rlog_pb2 as pb
from rlog.storage._common import (
    ACTION_END,
    ACTION_PREFIX,
    MAX_POSITION,
    META_KEY,
    action_key,
    decode_position,
    fsync_dir,
    open_data_dir,
)
from rlog.storage.base import StorageError
from rlog.storage.records import Plan, RecordStorage, decode_metadata

COMPACT_AFTER_DELETES = 4096  # compact the deleted prefix when a batch deletes this many


class LevelDbStorage(RecordStorage):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        engine_dir, self._lock = open_data_dir(self.path, "leveldb")
        try:
            self._db = plyvel.DB(
                str(engine_dir),
                create_if_missing=True,
                paranoid_checks=True,
                compression=None,  # payloads are opaque
            )
        except plyvel.Error as exc:
            self._lock.release()
            raise StorageError(f"data dir {self.path}: cannot open LevelDB: {exc}") from None
        self._dir = engine_dir
        self._synced_names: dict[str, int] = {}  # the directory's entries as last synced
        try:
            # LevelDB 1.22 renames CURRENT into place without syncing the directory, and a
            # new database's first MANIFEST, which CURRENT names until then, is never
            # synced: a power cut after the first open leaves CURRENT naming an empty
            # MANIFEST ("Corruption: no meta-nextfile entry").
            self._sync_names()
        except OSError as exc:
            self._db.close()
            self._lock.release()
            raise StorageError(f"data dir {self.path}: cannot sync leveldb/: {exc}") from None
        self._closed = False

    def _sync_names(self) -> None:
        """fsync the LevelDB directory if it holds a name (or a name for another file) that
        was not there at its last fsync, and the write-ahead logs' data before it.

        LevelDB syncs its directory only when it syncs a MANIFEST: the write-ahead log it
        starts when a memtable fills is written and fdatasync'ed by every synced batch from
        then on, while its name is synced only when the background flush of the old
        memtable commits, later (or never, if the power goes first). And it closes the old
        log without syncing it: batches written to it without sync would be lost while a
        later synced batch, in the new log, survives, where in one log a synced batch makes
        every batch before it durable (the contract of `Storage.apply`). Names that went
        away need no sync: LevelDB ignores what it deleted."""
        names = {entry.name: entry.inode() for entry in os.scandir(self._dir)}
        if all(self._synced_names.get(name) == inode for name, inode in names.items()):
            return
        for name in names:
            if name.endswith(".log"):
                try:
                    fd = os.open(self._dir / name, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # flushed and deleted meanwhile: its batches are in a table
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
        fsync_dir(self._dir)
        self._synced_names = names

    def metadata(self) -> pb.Metadata:
        raw = self._db.get(META_KEY)
        return decode_metadata(raw, self.path)

    def _floor(self, position: int) -> tuple[int, bytes] | None:
        with self._db.iterator(
            start=ACTION_PREFIX, stop=action_key(position), include_stop=True, reverse=True
        ) as it:
            for key, value in it:
                return decode_position(key[1:]), value
        return None

    def _range(self, first: int, last: int, limit: int) -> list[tuple[int, bytes]]:
        # Each call reads from its own short-lived iterator (an implicit snapshot).
        out: list[tuple[int, bytes]] = []
        with self._db.iterator(
            start=action_key(first), stop=action_key(last), include_stop=True
        ) as it:
            for key, value in it:
                if len(out) == limit:
                    break
                out.append((decode_position(key[1:]), value))
        return out

    def _edge(self, reverse: bool) -> tuple[int, bytes] | None:
        with self._db.iterator(start=ACTION_PREFIX, stop=ACTION_END, reverse=reverse) as it:
            for key, value in it:
                return decode_position(key[1:]), value
        return None

    def _last_record(self) -> tuple[int, bytes] | None:
        return self._edge(reverse=True)

    def _first_key(self) -> int | None:
        with self._db.iterator(start=ACTION_PREFIX, stop=ACTION_END, include_value=False) as it:
            for key in it:
                return decode_position(key[1:])
        return None

    def _write(self, plan: Plan) -> None:
        cut = plan.cut
        deleted = 0
        try:
            wb = self._db.write_batch(sync=plan.sync)
            if cut is not None and cut > 0:
                stop = action_key(cut) if cut <= MAX_POSITION else ACTION_END
                with self._db.iterator(start=ACTION_PREFIX, stop=stop, include_value=False) as it:
                    for key in it:
                        wb.delete(key)
                        deleted += 1
            for position in plan.deletes:
                wb.delete(action_key(position))
            for position, (head, body) in plan.puts:
                wb.put(action_key(position), head + body)
            if plan.metadata is not None:
                wb.put(META_KEY, plan.metadata)
            wb.write()
            if plan.sync:
                self._sync_names()
        except plyvel.Error as exc:
            raise StorageError(f"data dir {self.path}: LevelDB write failed: {exc}") from exc
        except OSError as exc:
            raise StorageError(f"data dir {self.path}: syncing leveldb/ failed: {exc}") from exc
        if deleted >= COMPACT_AFTER_DELETES and cut is not None:
            self._db.compact_range(start=ACTION_PREFIX, stop=action_key(min(cut, MAX_POSITION)))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db.close()
            self._lock.release()
