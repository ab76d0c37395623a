"""RocksDB engine (rocksdict, raw mode).

Layout: <data dir>/rocksdb/ (a RocksDB directory). Keys: b"a" + 8-byte big-endian first
position for the records (an action, or a whole run; rlog/storage/records.py), b"m" for the
serialized Metadata.

Durability: one `WriteBatch` per `apply`, written with WriteOptions.sync = batch.sync
(sync=True fdatasyncs the write-ahead log before returning; sync=False skips it: a machine
crash may lose that batch, a process crash does not).

Deletion below a position: a single range tombstone (`delete_range`) in the same batch, so
truncating a prefix of any length costs one record; compaction reclaims the space later.
"""

from __future__ import annotations

from pathlib import Path

import rocksdict

from rlog.proto import rlog_pb2 as pb
from rlog.storage._common import (
    ACTION_END,
    ACTION_PREFIX,
    MAX_POSITION,
    META_KEY,
    action_key,
    decode_position,
    open_data_dir,
)
from rlog.storage.base import StorageError
from rlog.storage.records import Plan, RecordStorage, decode_metadata


class RocksDbStorage(RecordStorage):
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

    def metadata(self) -> pb.Metadata:
        raw = self._db.get(META_KEY)
        return decode_metadata(raw, self.path)

    def _floor(self, position: int) -> tuple[int, bytes] | None:
        it = self._db.iter()
        it.seek_for_prev(action_key(position))
        if it.valid() and it.key().startswith(ACTION_PREFIX):
            return decode_position(it.key()[1:]), it.value()
        return None

    def _range(self, first: int, last: int, limit: int) -> list[tuple[int, bytes]]:
        out: list[tuple[int, bytes]] = []
        it = self._db.iter()
        it.seek(action_key(first))
        while it.valid() and len(out) < limit:
            key = it.key()
            if not key.startswith(ACTION_PREFIX):
                break
            position = decode_position(key[1:])
            if position > last:
                break
            out.append((position, it.value()))
            it.next()
        return out

    def _last_record(self) -> tuple[int, bytes] | None:
        return self._floor(MAX_POSITION)

    def _first_key(self) -> int | None:
        it = self._db.iter()
        it.seek(ACTION_PREFIX)
        if it.valid() and it.key().startswith(ACTION_PREFIX):
            return decode_position(it.key()[1:])
        return None

    def _write(self, plan: Plan) -> None:
        cut = plan.cut
        wb = rocksdict.WriteBatch(raw_mode=True)
        if cut is not None and cut > 0:
            wb.delete_range(ACTION_PREFIX, action_key(cut) if cut <= MAX_POSITION else ACTION_END)
        for position in plan.deletes:
            wb.delete(action_key(position))
        for position, (head, body) in plan.puts:
            wb.put(action_key(position), head + body)
        if plan.metadata is not None:
            wb.put(META_KEY, plan.metadata)
        try:
            self._db.write(wb, self._synced if plan.sync else self._unsynced)
        except Exception as exc:
            raise StorageError(f"data dir {self.path}: RocksDB write failed: {exc}") from exc

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._db.close()
            self._lock.release()
