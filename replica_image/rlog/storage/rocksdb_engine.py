"""RocksDB engine (rocksdict, raw mode).

Layout: <data dir>/rocksdb/ (a RocksDB directory). Keys: b"a" + 8-byte big-endian position
for actions, b"m" for the serialized Metadata.

Durability: one `WriteBatch` per `apply`, written with WriteOptions.sync = batch.sync
(sync=True fdatasyncs the write-ahead log before returning; sync=False skips it: a machine
crash may lose that batch, a process crash does not).

Deletion below a position: a single range tombstone (`delete_range`) in the same batch, so
truncating a prefix of any length costs one record; compaction reclaims the space later.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import rocksdict

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


class RocksDbStorage(KeyValueReads, Storage):
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        engine_dir, self._lock = open_data_dir(self.path, "rocksdb")
        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_paranoid_checks(True)
        options.set_max_background_jobs(2)
        options.set_keep_log_file_num(4)
        try:
            self._db = rocksdict.Rdict(str(engine_dir), options)
        except Exception as exc:  # rocksdict raises plain Exception
            self._lock.release()
            raise StorageError(f"data dir {self.path}: cannot open RocksDB: {exc}") from None
        self._synced = rocksdict.WriteOptions()
        self._synced.sync = True
        self._unsynced = rocksdict.WriteOptions()
        self._unsynced.sync = False
        self._closed = False

    def scan(self, first: int, last: int) -> Iterator[pb.Action]:
        first = max(first, 0)
        last = min(last, 2**64 - 1)
        while first <= last:
            chunk: list[bytes] = []
            next_first: int | None = None
            it = self._db.iter()
            it.seek(action_key(first))
            while it.valid():
                key = it.key()
                if not key.startswith(ACTION_PREFIX):
                    break
                position = decode_position(key[1:])
                if position > last:
                    break
                if len(chunk) == _SCAN_CHUNK:
                    next_first = position
                    break
                chunk.append(it.value())
                it.next()
            del it
            for raw in chunk:
                yield pb.Action.FromString(raw)
            if next_first is None:
                return
            first = next_first

    def last_position(self) -> int | None:
        it = self._db.iter()
        it.seek_for_prev(ACTION_PREFIX + b"\xff" * 8)
        if it.valid() and it.key().startswith(ACTION_PREFIX):
            return decode_position(it.key()[1:])
        return None

    def first_position(self) -> int | None:
        it = self._db.iter()
        it.seek(ACTION_PREFIX)
        if it.valid() and it.key().startswith(ACTION_PREFIX):
            return decode_position(it.key()[1:])
        return None

    def apply(self, batch: WriteBatch) -> None:
        cut = batch.delete_below
        actions = batch.actions
        if cut is not None:
            actions = [a for a in actions if a.position >= cut]
        puts = [(action_key(a.position), a.SerializeToString()) for a in actions]
        wb = rocksdict.WriteBatch(raw_mode=True)
        if batch.metadata is not None:
            wb.put(META_KEY, batch.metadata.SerializeToString())
        if cut is not None and cut > 0:
            wb.delete_range(ACTION_PREFIX, action_key(cut) if cut < 2**64 else ACTION_END)
        for key, value in puts:
            wb.put(key, value)
        try:
            self._db.write(wb, self._synced if batch.sync else self._unsynced)
        except Exception as exc:
            raise StorageError(f"data dir {self.path}: RocksDB write failed: {exc}") from exc

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db.close()
            self._lock.release()
