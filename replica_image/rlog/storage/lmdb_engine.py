"""LMDB engine (py-lmdb): a copy-on-write B+tree in one memory-mapped file.

Layout: <data dir>/lmdb/{data.mdb,lock.mdb}; sub-db `actions` holding the records (an action,
or a whole run; rlog/storage/records.py) keyed by their 8-byte big-endian first position,
sub-db `meta` holding the serialized Metadata under b"metadata".

Durability: the environment is opened with sync=True, so every write transaction commit
writes the data pages, fdatasyncs, writes the meta page and fdatasyncs again before
`apply` returns (two flushes per batch). LMDB has no per-transaction NOSYNC in py-lmdb, so a
`sync=False` batch is synced too (allowed: sync=False only *permits* skipping the fsync).

Map size: the map is a sparse reservation of address space (64 GiB by default), not disk
space; the file only grows as pages are used. If it ever fills, the engine doubles it and
retries the batch, up to `max_map_size` (1 TiB by default); past that the batch fails with
`DiskFull` ("LMDB map full"), as it does when the file system has no space left (ENOSPC,
EDQUOT): nothing of the batch is written and the next batch may succeed (docs/faults.md).
Freed pages (after delete_below) are reused, the file never shrinks.

Damage found at open is storage lost (`StorageLost`: the replica sets the data dir aside and
rejoins through a quorum, rlog/runtime/repair.py, docs/faults.md): a data.mdb shorter than
the pages its meta page says are in use (truncated), or one LMDB finds invalid or corrupt
(its meta pages cut or overwritten). An empty data.mdb LMDB takes as new (it creates the
file empty, then writes its meta pages), so one cut to nothing opens as a wiped store would.

Deletion below a position: LMDB has no range delete, so it walks a cursor from the first key
and deletes key by key, all in the one transaction of the batch.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import lmdb

from rlog.proto import rlog_pb2 as pb
from rlog.storage._common import decode_position, encode_position, fsync_dir, open_data_dir
from rlog.storage.base import DiskFull, StorageError, StorageLost
from rlog.storage.records import Plan, RecordStorage, decode_metadata

DEFAULT_MAP_SIZE = 64 << 30  # 64 GiB of address space; sparse on 64-bit
DEFAULT_MAX_MAP_SIZE = 1 << 40  # the map doubles up to this, then writes fail with DiskFull
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
# An EIO from a commit counts as a full disk when less than the batch and this is left
# (page headers, the B+tree pages a commit rewrites).
_FULL_MARGIN = 1 << 20
_TRUNCATION_SLACK_PAGES = 4
# What LMDB says at open of a data.mdb that is not as it wrote it: meta pages missing or
# invalid (a file cut inside them), the tree's pages bad or beyond the file. Storage lost
# (rlog/runtime/repair.py), not a version or environment problem (those stay StorageError).
_DAMAGED = (lmdb.InvalidError, lmdb.CorruptedError, lmdb.PageNotFoundError)
_META_KEY = b"metadata"


class LmdbStorage(RecordStorage):
    def __init__(
        self,
        path: Path,
        map_size: int = DEFAULT_MAP_SIZE,
        max_map_size: int = DEFAULT_MAX_MAP_SIZE,
    ) -> None:
        self.path = Path(path)
        self.max_map_size = max(max_map_size, map_size)
        engine_dir, self._lock = open_data_dir(self.path, "lmdb")
        env: lmdb.Environment | None = None
        try:
            self._env = env = lmdb.open(
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
            # Before anything reads the tree: opening the named databases reads the main
            # tree's pages, which a truncated file may no longer hold (SIGBUS).
            self._check_size(engine_dir / "data.mdb")
            self._actions = self._env.open_db(b"actions")
            self._meta = self._env.open_db(b"meta")
            # LMDB syncs its files' data, never their names: data.mdb, created by the first
            # open, would vanish in a power cut with every commit in it (docs/faults.md).
            fsync_dir(engine_dir)
        except (lmdb.Error, StorageError, OSError) as exc:
            if env is not None:
                env.close()
            self._lock.release()
            if isinstance(exc, StorageError):
                raise
            if isinstance(exc, _DAMAGED) and _written(engine_dir / "data.mdb"):
                # A data.mdb LMDB wrote (it is not empty) whose meta pages or tree are not
                # what LMDB wrote: what it held is gone here, as with a truncated file.
                raise StorageLost(
                    f"data dir {self.path}: data.mdb is damaged (LMDB: {exc})"
                ) from None
            raise StorageError(f"data dir {self.path}: cannot open LMDB: {exc}") from None
        self._closed = False

    def _check_size(self, data_file: Path) -> None:
        """Refuse a data file shorter than the pages its meta page says are in use (a
        truncated file): reading those pages through the map would kill the process with
        SIGBUS, and the records they held are gone (docs/faults.md)."""
        page = self._env.stat()["psize"]
        in_use = (self._env.info()["last_pgno"] + 1) * page
        size = data_file.stat().st_size
        # The last pages counted may never have been written (pages a transaction took and
        # freed again): a file a little short is normal, one short by more is truncated.
        if size < in_use - _TRUNCATION_SLACK_PAGES * page:
            raise StorageLost(
                f"data dir {self.path}: {data_file.name} is truncated: {size} bytes, but its "
                f"pages in use end at byte {in_use}"
            )

    # -- the record primitives (rlog/storage/records.py) -------------------------------------

    def metadata(self) -> pb.Metadata:
        with self._env.begin(db=self._meta) as txn:
            raw = txn.get(_META_KEY)
        return decode_metadata(raw, self.path)

    def _floor(self, position: int) -> tuple[int, bytes] | None:
        with self._env.begin(db=self._actions) as txn:
            cur = txn.cursor()
            key = encode_position(position)
            if cur.set_range(key):
                if cur.key() == key:
                    return position, cur.value()
                found = cur.prev()
            else:
                found = cur.last()
            return (decode_position(cur.key()), cur.value()) if found else None

    def _range(self, first: int, last: int, limit: int) -> list[tuple[int, bytes]]:
        # Each call is one short read transaction, so a slow consumer never pins old pages
        # (which would stop LMDB from reusing them and grow the file).
        out: list[tuple[int, bytes]] = []
        with self._env.begin(db=self._actions) as txn:
            cur = txn.cursor()
            found = cur.set_range(encode_position(first))
            # Keys first, a value only once it is taken: a value is a copy (a run's megabyte).
            while found and len(out) < limit:
                position = decode_position(cur.key())
                if position > last:
                    break
                out.append((position, cur.value()))
                found = cur.next()
        return out

    def _last_record(self) -> tuple[int, bytes] | None:
        with self._env.begin(db=self._actions) as txn:
            cur = txn.cursor()
            return (decode_position(cur.key()), cur.value()) if cur.last() else None

    def _first_key(self) -> int | None:
        with self._env.begin(db=self._actions) as txn:
            cur = txn.cursor()
            return decode_position(cur.key()) if cur.first() else None

    def _write(self, plan: Plan) -> None:
        while True:
            try:
                self._commit(plan)
                return
            except lmdb.MapFullError:
                # The transaction was aborted: nothing of the batch is written. Grow and retry.
                size = self._env.info()["map_size"]
                if size >= self.max_map_size:
                    raise DiskFull(
                        f"data dir {self.path}: LMDB map full at {size} bytes "
                        f"(the maximum map size)"
                    ) from None
                self._env.set_mapsize(min(size * 2, self.max_map_size))
            except lmdb.Error as exc:
                if _no_space(exc) or self._short_write_on_a_full_disk(exc, plan):
                    raise DiskFull(
                        f"data dir {self.path}: no space left on the device (LMDB: {exc})"
                    ) from None
                raise StorageError(f"data dir {self.path}: LMDB write failed: {exc}") from exc

    def _short_write_on_a_full_disk(self, exc: lmdb.Error, plan: Plan) -> bool:
        """LMDB reports a write the file system cut short as EIO: on a full disk ENOSPC
        shows as a partial write. Told apart from a failing device by the space left."""
        if os.strerror(errno.EIO) not in str(exc):
            return False
        try:
            st = os.statvfs(self.path)
        except OSError:
            return False
        needed = sum(len(head) + len(body) for _, (head, body) in plan.puts) + _FULL_MARGIN
        return st.f_bavail * st.f_frsize < needed

    def _commit(self, plan: Plan) -> None:
        with self._env.begin(write=True) as txn:
            if plan.cut is not None and plan.cut > 0:
                cur = txn.cursor(db=self._actions)
                if cur.first():
                    # cursor.delete() moves to the next entry; key() is b"" past the end.
                    while True:
                        key = cur.key()
                        if not key or decode_position(key) >= plan.cut:
                            break
                        if not cur.delete():
                            break
            for position in plan.deletes:
                txn.delete(encode_position(position), db=self._actions)
            for position, (head, body) in plan.puts:
                txn.put(encode_position(position), head + body, db=self._actions)
            if plan.metadata is not None:
                txn.put(_META_KEY, plan.metadata, db=self._meta)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._env.close()
            self._lock.release()


def _written(data_file: Path) -> bool:
    try:
        return data_file.stat().st_size > 0
    except OSError:
        return False


def _no_space(exc: lmdb.Error) -> bool:
    """Whether an LMDB error is the file system's ENOSPC/EDQUOT (py-lmdb puts the errno's
    text in the message)."""
    text = str(exc)
    return any(os.strerror(code) in text for code in _NO_SPACE)
