"""LMDB engine (py-lmdb): a copy-on-write B+tree in one memory-mapped file.

Layout: <data dir>/lmdb/{data.mdb,lock.mdb}; sub-db `actions` keyed by the 8-byte big-endian
position, sub-db `meta` holding the serialized Metadata under b"metadata".

Durability: the environment is opened with sync=True, so every write transaction commit
writes the data pages, fdatasyncs, writes the meta page and fdatasyncs again before
`apply` returns (two flushes per batch). LMDB has no per-transaction NOSYNC in py-lmdb, so a
`sync=False` batch is synced too (allowed: sync=False only *permits* skipping the fsync).

Map size: the map is a sparse reservation of address space (64 GiB by default), not disk
space; the file only grows as pages are used. If it ever fills, the engine doubles it and
retries the batch. Freed pages (after delete_below) are reused, the file never shrinks.

Deletion below a position: LMDB has no range delete, so it walks a cursor from the first key
and deletes key by key, all in the one transaction of the batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lmdb

from rlog.proto import rlog_pb2 as pb
from rlog.storage._common import decode_position, encode_position, open_data_dir
from rlog.storage.base import Storage, StorageError, WriteBatch

DEFAULT_MAP_SIZE = 64 << 30  # 64 GiB of address space; sparse on 64-bit
_META_KEY = b"metadata"
_SCAN_CHUNK = 1024  # entries read per short read transaction in scan()


class LmdbStorage(Storage):
    def __init__(self, path: Path, map_size: int = DEFAULT_MAP_SIZE) -> None:
        self.path = Path(path)
        engine_dir, self._lock = open_data_dir(self.path, "lmdb")
        try:
            self._env = lmdb.open(
                str(engine_dir),
                map_size=map_size,
                subdir=True,
                max_dbs=2,
                sync=True,
                metasync=True,
                readahead=False,
                writemap=False,
                lock=True,
            )
            self._actions = self._env.open_db(b"actions")
            self._meta = self._env.open_db(b"meta")
        except lmdb.Error as exc:
            self._lock.release()
            raise StorageError(f"data dir {self.path}: cannot open LMDB: {exc}") from None
        self._closed = False

    # -- reads -------------------------------------------------------------------------------

    def metadata(self) -> pb.Metadata:
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(_META_KEY)
        return pb.Metadata() if raw is None else pb.Metadata.FromString(raw)

    def get(self, position: int) -> pb.Action | None:
        if not 0 <= position < 2**64:
            return None
        with self._env.begin(db=self._actions) as txn:
            raw = txn.get(encode_position(position))
        return None if raw is None else pb.Action.FromString(raw)

    def scan(self, first: int, last: int) -> Iterator[pb.Action]:
        # Chunked: each chunk is read in a short read transaction so a slow consumer never
        # pins old pages (which would stop LMDB from reusing them and grow the file).
        first = max(first, 0)
        last = min(last, 2**64 - 1)
        while first <= last:
            chunk: list[bytes] = []
            next_first: int | None = None
            with self._env.begin(db=self._actions) as txn:
                cur = txn.cursor()
                if not cur.set_range(encode_position(first)):
                    return
                for key, value in cur:
                    position = decode_position(key)
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

    def last_position(self) -> int | None:
        with self._env.begin(db=self._actions) as txn:
            cur = txn.cursor()
            return decode_position(cur.key()) if cur.last() else None

    def first_position(self) -> int | None:
        with self._env.begin(db=self._actions) as txn:
            cur = txn.cursor()
            return decode_position(cur.key()) if cur.first() else None

    # -- writes ------------------------------------------------------------------------------

    def apply(self, batch: WriteBatch) -> None:
        # Serialize before the transaction (a bad position raises before anything is written).
        puts = [(encode_position(a.position), a.SerializeToString()) for a in batch.actions]
        meta = None if batch.metadata is None else batch.metadata.SerializeToString()
        while True:
            try:
                self._commit(puts, meta, batch.delete_below)
                return
            except lmdb.MapFullError:
                # The transaction was aborted: nothing of the batch is written. Grow and retry.
                info = self._env.info()
                self._env.set_mapsize(info["map_size"] * 2)
            except lmdb.Error as exc:
                raise StorageError(f"data dir {self.path}: LMDB write failed: {exc}") from exc

    def _commit(
        self, puts: list[tuple[bytes, bytes]], meta: bytes | None, delete_below: int | None
    ) -> None:
        with self._env.begin(write=True) as txn:
            if meta is not None:
                txn.put(_META_KEY, meta, db=self._meta)
            for key, value in puts:
                txn.put(key, value, db=self._actions)
            if delete_below is not None and delete_below > 0:
                cur = txn.cursor(db=self._actions)
                if cur.first():
                    # cursor.delete() moves to the next entry; key() is b"" past the end.
                    while True:
                        key = cur.key()
                        if not key or decode_position(key) >= delete_below:
                            break
                        if not cur.delete():
                            break

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()
            self._lock.release()
