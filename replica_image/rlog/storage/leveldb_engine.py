"""LevelDB engine (plyvel), the engine Mesos' replicated log uses.

Layout: <data dir>/leveldb/ (a LevelDB directory). Keys: b"a" + 8-byte big-endian position
for actions, b"m" for the serialized Metadata.

Durability: one `WriteBatch` per `apply`, written with `sync=batch.sync` (sync=True makes
LevelDB fdatasync its write-ahead log before returning; sync=False skips it, so a machine
crash may lose that batch, a process crash does not).

Deletion below a position: LevelDB has no range delete, so the batch carries one delete per
stored key of the prefix (read with a key-only iterator), then, as Mesos does after a
truncation, a large deletion is followed by CompactRange over the prefix so later scans and
first_position() do not wade through tombstones.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import plyvel

from rlog.proto import rlog_pb2 as pb
from rlog.storage._common import (
    ACTION_END,
    ACTION_PREFIX,
    META_KEY,
    KeyValueReads,
    action_key,
    decode_position,
    open_data_dir,
)
from rlog.storage.base import Storage, StorageError, WriteBatch

_SCAN_CHUNK = 1024
COMPACT_AFTER_DELETES = 4096  # compact the deleted prefix when a batch deletes this many


class LevelDbStorage(KeyValueReads, Storage):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        engine_dir, self._lock = open_data_dir(self.path, "leveldb")
        try:
            self._db = plyvel.DB(
                str(engine_dir),
                create_if_missing=True,
                paranoid_checks=True,
                compression=None,  # values are small protobufs; payloads are opaque
            )
        except plyvel.Error as exc:
            self._lock.release()
            raise StorageError(f"data dir {self.path}: cannot open LevelDB: {exc}") from None
        self._closed = False

    def scan(self, first: int, last: int) -> Iterator[pb.Action]:
        first = max(first, 0)
        last = min(last, 2**64 - 1)
        # Chunked, each chunk from its own short-lived iterator (an implicit snapshot).
        while first <= last:
            chunk: list[bytes] = []
            next_first: int | None = None
            with self._db.iterator(start=action_key(first), stop=ACTION_END) as it:
                for key, value in it:
                    position = decode_position(key[1:])
                    if position > last:
                        break
                    if len(chunk) == _SCAN_CHUNK:
                        next_first = position
                        break
                    chunk.append(value)
            for raw in chunk:
                yield pb.Action.FromString(raw)
            if next_first is None:
                return
            first = next_first

    def _edge(self, reverse: bool) -> int | None:
        with self._db.iterator(
            start=ACTION_PREFIX, stop=ACTION_END, reverse=reverse, include_value=False
        ) as it:
            for key in it:
                return decode_position(key[1:])
        return None

    def last_position(self) -> int | None:
        return self._edge(reverse=True)

    def first_position(self) -> int | None:
        return self._edge(reverse=False)

    def apply(self, batch: WriteBatch) -> None:
        cut = batch.delete_below
        actions = batch.actions
        if cut is not None:
            actions = [a for a in actions if a.position >= cut]
        puts = [(action_key(a.position), a.SerializeToString()) for a in actions]
        deleted = 0
        try:
            wb = self._db.write_batch(sync=batch.sync)
            if batch.metadata is not None:
                wb.put(META_KEY, batch.metadata.SerializeToString())
            if cut is not None and cut > 0:
                stop = action_key(cut) if cut < 2**64 else ACTION_END
                with self._db.iterator(start=ACTION_PREFIX, stop=stop, include_value=False) as it:
                    for key in it:
                        wb.delete(key)
                        deleted += 1
            for key, value in puts:
                wb.put(key, value)
            wb.write()
        except plyvel.Error as exc:
            raise StorageError(f"data dir {self.path}: LevelDB write failed: {exc}") from exc
        if deleted >= COMPACT_AFTER_DELETES and cut is not None:
            self._db.compact_range(start=ACTION_PREFIX, stop=action_key(min(cut, 2**64 - 1)))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db.close()
            self._lock.release()
