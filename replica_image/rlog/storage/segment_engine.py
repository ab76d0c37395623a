"""Segmented append-only file engine: one CRC'd frame per batch, one fdatasync per batch.

Layout: <data dir>/segments/<16 hex digits>.seg. A segment is a sequence of frames
`[u32 length][u32 crc(payload)][payload]`, one frame per `apply` (the CRC is CRC32C, flagged
by bit 31 of the length, since storage format 4; zlib's CRC-32 before, still read), so a
batch is atomic: on open, a frame whose length or CRC does not check out ends the log (a
torn tail, only possible at the end of the newest segment; it is cut off). Payload:

    u8 flags (1 = metadata, 2 = delete_below, 4 = deletes)
    [u32 len, Metadata] [9-byte delete_below] [u32 n, n x u64 deleted key]
    u32 count, count x (u64 key, u32 len, record bytes)

Replaying a frame deletes every key below delete_below, then the deleted keys, then puts the
records (rlog/storage/records.py: an action, or a whole run under its first position; the
split pieces of a run that a batch overwrote in part are records of the same frame, planned
by records.Overlay). Storage format 1 wrote the same frames without flag 4 and with untagged
Action records, which this code replays as they are.

Every segment starts with a checkpoint frame (the metadata and the begin as of its
creation), written to a temp file, fsync'd and renamed into place, so any suffix of the
segments replays to the full state. A segment that holds no live record any more (all
overwritten or deleted below a truncation) is unlinked after the next synced batch: that is
the compaction, and it is what deletion below a position amounts to on disk.

The index (record key -> segment, offset, length) lives in memory: O(live records), 24 bytes
each in typed arrays (rlog/storage/segment_index.py; a run of any length is one record). At
a segment roll, when enough has been written since the last one, the engine writes an index
snapshot `<n>.idx` (the index, the metadata and the begin as of segment n's start;
CRC32C'd; temp file, fsync, rename, directory fsync) before it creates segment n, and
removes older snapshots. Opening loads the newest snapshot whose
segment exists and replays only the segments from it on; without one (or if it fails its
check) it replays every segment. So a restart reads at most the bytes written since the
last snapshot (a snapshot is written once at least `SNAPSHOT_RATIO` times its own size has
been written since the one before: at most a quarter more writing), not the whole log.

Frames replayed at open are checked as before (their CRC; a torn tail of the newest segment
cut off, a damaged frame elsewhere skipped and reported, then blanked in place once the
replica has recorded that it recovers what it held: `forget_damage`); the segments a
snapshot covers are not read at open, and damage there is found when a record is read: each
record carries its own CRC32C (rlog/storage/records.py), so a damaged record raises
`CorruptRecord` and the replica repairs it from its peers (docs/faults.md), as with LMDB.
Segments that are only partly dead are not rewritten.

The synced mark `segments/synced` says what the engine knows it holds: the newest index
snapshot's segment, the active segment and the end of its last synced frame (CRC32C'd). It
is created whole (temp file, fsync, rename: never seen empty; an empty one an older version
left is no mark, see `_read_mark`), rewritten in place after every synced batch (no sync of
its own: one pwrite) and synced
at each roll and at close, so after a crash or a stop it is exact, and after a power cut at
worst as old as the last roll: never ahead of the data. Opening checks the segments against
it and against themselves (`_check_chain`): the segments replayed run without a gap from
the snapshot's (or from segment 0 if there never was a snapshot) to the newest; the segment
an index snapshot starts at is there; the newest reaches the synced end. A data dir that
fails a check has lost data it acknowledged (a file deleted, a segment cut short by a bad
restore): `StorageLost`, and the replica rejoins empty (docs/faults.md, "Lost or cut
segments").
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
from pathlib import Path

from rlog.config import UNSAFE_NO_SYNC_ENV, test_segment_bytes, unsafe_no_sync
from rlog.proto import rlog_pb2 as pb
from rlog.storage._common import fsync_dir, open_data_dir, write_durably
from rlog.storage.base import DiskFull, StorageError, StorageLost
from rlog.storage.page_cache import CACHE_BEHIND, CacheWindow, drop
from rlog.storage.records import HEAD_BYTES, Plan, RecordStorage, decode_metadata
from rlog.storage.segment_format import (
    ENTRY,
    FRAME_HEADER,
    HAS_CUT,
    HAS_DELETES,
    HAS_META,
    MARK_NAME,
    NO_SNAPSHOT,
    SNAPSHOT_ENTRY_BYTES,
    U32,
    U64,
    SyncedMark,
    blank_frame,
    bytes_after_frame,
    decode_mark,
    decode_snapshot,
    encode_frame,
    encode_mark,
    encode_snapshot,
    frame_header,
    next_frame,
    payload_ok,
    segment_name,
    snapshot_name,
    write_calls,
)
from rlog.storage.segment_index import RecordIndex

log = logging.getLogger("rlog.storage")
SEGMENT_BYTES = 64 << 20
# An index snapshot is written at a roll once this many times its size has been written to
# segments since the last one (so snapshots add at most 1/SNAPSHOT_RATIO to the writing).
SNAPSHOT_RATIO = 4


class SegmentStorage(RecordStorage):
    def __init__(
        self,
        path: Path,
        segment_bytes: int = SEGMENT_BYTES,
        snapshot_ratio: int = SNAPSHOT_RATIO,
        cache_behind: int = CACHE_BEHIND,
    ) -> None:
        self.path = Path(path)
        # What is written stays in the page cache only this far behind the writes
        # (rlog/storage/page_cache.py).
        self._cached = CacheWindow(cache_behind)
        self._snapshot_ratio = snapshot_ratio
        self._dir, self._lock = open_data_dir(self.path, "segments")
        self._segment_bytes = test_segment_bytes() or segment_bytes
        self._mark_fd = -1  # the synced mark, rewritten after each synced batch
        self._fds: dict[int, int] = {}  # segment number -> read fd
        self._live: dict[int, int] = {}  # segment number -> live index entries in it
        self._index = RecordIndex()  # key -> (segment, offset, length), in key order
        # Held by every read of the index and the read fds, and by `apply` while it changes
        # them (never across a disk write or sync): reads come from the event loop while
        # `apply` runs in the journal's storage thread, and a read between a change of the
        # index's keys and that of its locations (or after a reclaimed segment's fd was
        # closed) read another record's bytes: a false CorruptRecord (docs/faults.md).
        self._guard = threading.Lock()
        self._meta = b""
        self._begin = 0
        self._active = -1
        self._wfd = -1
        self._size = 0
        self._closed = False
        self._damage: list[str] = []  # damaged frames skipped at open
        self._damaged: list[tuple[int, int, int]] = []  # their (segment, start, end)
        self._since_snapshot = 0  # segment bytes written (or replayed) since the last snapshot
        # The newest snapshot's segment: only segments before it are ever reclaimed (see
        # `_reclaimable`); None: no snapshot yet.
        self._snapshot_at: int | None = None
        # TEST ONLY (RLOG_UNSAFE_NO_SYNC=1, rlog/config.py): batches are not fdatasync'ed.
        self._unsafe_no_sync = unsafe_no_sync()
        if self._unsafe_no_sync:
            log.warning(
                "%s=1: batches are not synced, a power cut loses acknowledged writes (test only)",
                UNSAFE_NO_SYNC_ENV,
            )
        try:
            self._recover()
            self._open_mark()
        except OSError as exc:
            self._close_fds()
            self._lock.release()
            raise StorageError(f"data dir {self.path}: cannot open segments: {exc}") from None
        except StorageError:
            self._close_fds()
            self._lock.release()
            raise

    # -- recovery ----------------------------------------------------------------------------

    def _read_mark(self) -> SyncedMark | None:
        """The synced mark (None: a dir written before it existed, or a fresh one)."""
        try:
            data = (self._dir / MARK_NAME).read_bytes()
        except FileNotFoundError:
            return None
        if not data:
            # An interrupted creation: before the mark was created whole (`_open_mark`), it
            # was created empty and then written, and a crash, a full or failing disk in
            # between left it empty. It is created only where there was none (a fresh dir,
            # or one written before the mark existed) and rewritten in place at its full
            # size, so an empty one never recorded anything: the dir is known exactly as
            # one without a mark (its other checks still apply), and setting it aside would
            # throw away a store that lacks nothing. A mark of any other size, or that fails
            # its CRC, was written and then damaged: what it said is unknown, so it is lost.
            return None
        try:
            return decode_mark(data)
        except ValueError as exc:
            raise StorageLost(
                f"data dir {self.path}: the synced mark {MARK_NAME} {exc}: what the segments "
                "should hold is unknown"
            ) from None

    def _check_chain(self, numbers: list[int], replay_from: int, mark: SyncedMark | None) -> None:
        """Before replay: the segments needed are all there (see the module's docstring).
        Segments are reclaimed only below the newest snapshot, which the mark names (synced
        at the roll that wrote it, before anything is reclaimed against it): from there on
        (from segment 0 if none was ever written) none may be missing."""
        newest = numbers[-1] if numbers else -1
        chain_from = replay_from if self._snapshot_at is not None or not numbers else numbers[0]
        if mark is not None:
            if mark.active > newest:
                raise StorageLost(
                    f"data dir {self.path}: segment {segment_name(mark.active)} is missing (it "
                    f"held synced frames through byte {mark.end}; the newest left is "
                    f"{segment_name(newest) if numbers else 'none'})"
                )
            chain_from = max(chain_from, 0 if mark.snapshot == NO_SNAPSHOT else mark.snapshot)
            if self._snapshot_at is None and mark.snapshot == NO_SNAPSHOT:
                chain_from = 0
        present = set(numbers)
        missing = [n for n in range(chain_from, newest + 1) if n not in present]
        if missing:
            raise StorageLost(
                f"data dir {self.path}: segment {segment_name(missing[0])} is missing "
                f"({len(missing)} missing between {segment_name(chain_from)} and "
                f"{segment_name(newest)})"
            )

    def _check_synced_end(self, mark: SyncedMark | None) -> None:
        """After replay (a torn tail cut off): the newest segment reaches the synced end."""
        if mark is None or mark.active != self._active:
            return
        size = os.fstat(self._wfd).st_size
        if size < mark.end:
            raise StorageLost(
                f"data dir {self.path}: segment {segment_name(self._active)} ends at byte "
                f"{size}, short of the {mark.end} bytes synced into it: acknowledged frames "
                "are gone"
            )

    def _open_mark(self) -> None:
        path = self._dir / MARK_NAME
        if self._unsafe_no_sync:  # TEST ONLY: nothing is known synced, the mark would lie
            path.unlink(missing_ok=True)
            return
        os.fsync(self._wfd)  # frames a crash left unsynced are synced before the mark says so
        with contextlib.suppress(FileNotFoundError):
            self._mark_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        if self._mark_fd >= 0 and os.fstat(self._mark_fd).st_size:
            self._write_mark(sync=True)
            return
        if self._mark_fd >= 0:  # empty: an interrupted creation (see `_read_mark`)
            os.close(self._mark_fd)
            self._mark_fd = -1
        # Created whole, never seen empty or short: written to a temp file, synced, renamed
        # over (a crash leaves the temp file, removed at the next open, or the whole mark).
        # Only the creation pays for this: later writes are one pwrite in place.
        write_durably(path, self._mark_bytes())
        self._mark_fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)

    def _mark_bytes(self) -> bytes:
        snapshot = NO_SNAPSHOT if self._snapshot_at is None else self._snapshot_at
        return encode_mark(SyncedMark(snapshot, self._active, self._size))

    def _write_mark(self, sync: bool = False) -> None:
        if self._mark_fd < 0:
            return
        os.pwrite(self._mark_fd, self._mark_bytes(), 0)
        if sync and not self._unsafe_no_sync:
            os.fdatasync(self._mark_fd)

    def _load_snapshot(self, numbers: list[int]) -> int:
        """Install the newest usable index snapshot; the first segment to replay after it
        (the oldest segment if there is none). A snapshot is usable if its segment exists:
        one written just before a crash that left its segment uncreated describes a state
        that later frames of the segment before it (then still the newest) would leave
        behind, so it is removed."""
        first = numbers[0] if numbers else 0
        existing = set(numbers)
        for path in sorted(self._dir.glob("*.idx"), reverse=True):
            try:
                number = int(path.stem, 16)
            except ValueError:
                continue
            if number not in existing:
                if numbers and number <= numbers[-1]:
                    raise StorageLost(
                        f"data dir {self.path}: segment {segment_name(number)} is missing (index "
                        f"snapshot {path.name} starts at it)"
                    )
                path.unlink()  # written just before a crash that left its segment uncreated
                continue
            try:
                _, meta, begin, index = decode_snapshot(path.read_bytes())
            except ValueError as exc:
                log.warning(
                    "data dir %s: index snapshot %s %s: replaying the segments instead",
                    self.path,
                    path.name,
                    exc,
                )
                continue
            self._meta, self._begin = meta, begin
            self._index = index
            self._live = dict(index.records_per_segment())
            self._snapshot_at = number
            return number
        return first

    def _recover(self) -> None:
        for stale in self._dir.glob("*.tmp"):
            stale.unlink()
        numbers = sorted(int(p.stem, 16) for p in self._dir.glob("*.seg"))
        mark = self._read_mark()
        replay_from = self._load_snapshot(numbers)
        self._check_chain(numbers, replay_from, mark)
        for i, number in enumerate(numbers):
            fd = os.open(self._dir / segment_name(number), os.O_RDONLY | os.O_CLOEXEC)
            self._fds[number] = fd
            self._live.setdefault(number, 0)
            if number < replay_from:
                continue  # covered by the snapshot: its records are checked when read
            data = os.pread(fd, os.fstat(fd).st_size, 0)
            self._since_snapshot += len(data)
            newest = i == len(numbers) - 1
            end = self._replay(number, data)
            while end < len(data):
                after = next_frame(data, end, newest)
                if after is not None:
                    # Damage to a frame already acknowledged (frames follow it, or its
                    # segment is not the newest): skip it and say so; its records are lost
                    # here, the replica recovers them from its peers (docs/faults.md).
                    self._damage.append(
                        f"segment {segment_name(number)}: the frame at byte {end} fails its CRC"
                    )
                    self._damaged.append((number, end, after))
                    end = self._replay(number, data, after)
                    continue
                if not newest:
                    raise StorageLost(
                        f"data dir {self.path}: segment {segment_name(number)} is corrupt at "
                        f"byte {end} (not the newest segment, so not a torn write)"
                    )
                if bytes_after_frame(data, end):
                    # A torn write only ever leaves a bad frame last: a frame that fails its
                    # CRC with bytes after it (but no frame found where its length says) is
                    # damage to data already acknowledged, its extent unknown.
                    raise StorageLost(
                        f"data dir {self.path}: segment {segment_name(number)} is corrupt at "
                        f"byte {end} (a frame fails its CRC and data follows it, so "
                        "not a torn write)"
                    )
                # Torn tail of the newest segment: the batch never returned; cut it off.
                wfd = os.open(self._dir / segment_name(number), os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.ftruncate(wfd, end)
                    os.fsync(wfd)
                finally:
                    os.close(wfd)
                break
        # Records of segments that are gone (reclaimed after the snapshot was written) were
        # all deleted or replaced by the frames replayed since; one still indexed is not.
        for number, live in list(self._live.items()):
            if number not in self._fds:
                if live:
                    raise StorageLost(
                        f"data dir {self.path}: segment {segment_name(number)} is missing but "
                        f"holds {live} live records (per the index snapshot)"
                    )
                del self._live[number]
        if numbers:
            self._active = numbers[-1]
            self._wfd = os.open(self._dir / segment_name(self._active), os.O_WRONLY | os.O_CLOEXEC)
            self._size = os.fstat(self._wfd).st_size
            self._check_synced_end(mark)
        else:
            if mark is not None and mark.active >= 0:
                raise StorageLost(f"data dir {self.path}: every segment is missing")
            self._roll()

    def _replay(self, number: int, data: bytes, off: int = 0) -> int:
        """Apply the valid records of one segment from `off` on to the index; return where
        they end."""
        while off + FRAME_HEADER.size <= len(data):
            length, crc, crc32c = frame_header(data, off)
            start = off + FRAME_HEADER.size
            payload = data[start : start + length]
            if len(payload) != length or not payload_ok(payload, crc, crc32c):
                return off
            p = 0
            flags = payload[p]
            p += 1
            meta = cut = None
            if flags & HAS_META:
                (n,) = U32.unpack_from(payload, p)
                meta = payload[p + 4 : p + 4 + n]
                p += 4 + n
            if flags & HAS_CUT:
                cut = int.from_bytes(payload[p : p + 9], "big")
                p += 9
            deletes = []
            if flags & HAS_DELETES:
                (n,) = U32.unpack_from(payload, p)
                p += 4
                deletes = [U64.unpack_from(payload, p + 8 * k)[0] for k in range(n)]
                p += 8 * n
            (count,) = U32.unpack_from(payload, p)
            p += 4
            puts = []
            for _ in range(count):
                position, n = ENTRY.unpack_from(payload, p)
                p += ENTRY.size
                puts.append((position, (number, start + p, n)))
                p += n
            self._install(meta, cut, deletes, puts)
            off = start + length
        return off

    # -- in-memory state ---------------------------------------------------------------------

    def _install(
        self,
        meta: bytes | None,
        cut: int | None,
        deletes: list[int],
        puts: list[tuple[int, tuple[int, int, int]]],
    ) -> None:
        if meta is not None:
            self._meta = meta
        if cut is not None and cut > self._begin:
            self._begin = cut
        index, live = self._index, self._live
        if cut is not None:
            for segment, lost in index.delete_below(cut).items():
                live[segment] -= lost
        for key in deletes:
            gone = index.delete(key)
            if gone is not None:
                live[gone] -= 1
        for position, loc in puts:
            old = index.put(position, loc)
            if old is not None:
                live[old] -= 1
            live[loc[0]] = live.get(loc[0], 0) + 1

    # -- segments ----------------------------------------------------------------------------

    def _write_all(self, fd: int, parts: list[bytes]) -> None:
        for call in write_calls(parts):
            n = os.writev(fd, call)
            if n < sum(map(len, call)):  # a short write (rare): write the rest plainly
                view = memoryview(b"".join(call))[n:]
                while view:
                    view = view[os.write(fd, view) :]

    def _snapshot_due(self) -> bool:
        size = SNAPSHOT_ENTRY_BYTES * len(self._index) + len(self._meta) + 64
        return self._since_snapshot >= self._snapshot_ratio * size

    def _write_snapshot(self, number: int) -> None:
        """The index as of segment `number`'s start, durable before that segment exists
        (so an existing segment's snapshot is always complete); older ones removed."""
        data = encode_snapshot(number, self._meta, self._begin, self._index)
        path = self._dir / snapshot_name(number)
        write_durably(path, data)
        for older in self._dir.glob("*.idx"):
            if older != path:
                older.unlink()
        self._since_snapshot = 0
        self._snapshot_at = number

    def _roll(self) -> None:
        """Start a new segment that begins with a checkpoint of the current state (and,
        when one is due, an index snapshot before it)."""
        number = self._active + 1
        if self._wfd >= 0:
            os.fsync(self._wfd)  # everything before the new segment is durable first
            os.close(self._wfd)
            self._wfd = -1
        if self._snapshot_due():
            self._write_snapshot(number)
        frame = encode_frame(self._meta, self._begin, [], [])
        tmp = self._dir / (segment_name(number) + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            self._write_all(fd, frame)
            os.fsync(fd)
        except OSError:
            tmp.unlink(missing_ok=True)  # a full disk: give the space back
            raise
        finally:
            os.close(fd)
        os.rename(tmp, self._dir / segment_name(number))
        fsync_dir(self._dir)
        self._active = number
        self._wfd = os.open(self._dir / segment_name(number), os.O_WRONLY | os.O_CLOEXEC)
        self._size = sum(map(len, frame))
        self._write_mark(sync=True)
        self._fds[number] = os.open(self._dir / segment_name(number), os.O_RDONLY | os.O_CLOEXEC)
        self._live.setdefault(number, 0)

    def _reclaimable(self, number: int, live: int) -> bool:
        """A segment with no live record that is older than the newest snapshot. Those
        from the snapshot on are replayed at open, and a frame of theirs may delete a
        record of an older segment (a run overwritten in part): with its segment gone, a
        replay would bring the record back."""
        return not live and self._snapshot_at is not None and number < self._snapshot_at

    def _reclaim(self) -> None:
        dead = [n for n, live in self._live.items() if self._reclaimable(n, live)]
        for number in dead:
            os.unlink(self._dir / segment_name(number))
            with self._guard:
                os.close(self._fds.pop(number))
            del self._live[number]
            self._cached.forget(number)
        if dead:
            fsync_dir(self._dir)

    # -- the interface -----------------------------------------------------------------------

    def metadata(self) -> pb.Metadata:
        return decode_metadata(self._meta, self.path)

    def damage(self) -> list[str]:
        return list(self._damage)

    def forget_damage(self) -> None:
        """Write a blank frame (valid, changing nothing) over each damaged frame skipped at
        open, durably: replaying it is what skipping it was, so later opens see the same
        state and no damage. Without this a frame repaired from the peers stayed damaged in
        its segment, and every open found it again and sent the replica back to
        RECOVERING: after a power cut of every replica, two such replicas left no VOTING
        quorum, and no leader, for good."""
        for number, start, end in self._damaged:
            frame = blank_frame(end - start)
            if frame is None:  # too short to hold a frame: reported again at the next open
                continue
            try:
                fd = os.open(self._dir / segment_name(number), os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.pwrite(fd, frame, start)
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            except OSError as exc:
                raise StorageError(
                    f"data dir {self.path}: cannot blank the damaged frame at byte {start} of "
                    f"segment {segment_name(number)}: {exc}"
                ) from exc
            log.info(
                "data dir %s: the damaged frame at byte %d of segment %s blanked (its "
                "records are recovered from the peers)",
                self.path,
                start,
                segment_name(number),
            )
        self._damaged.clear()
        self._damage.clear()

    def _entry(self, i: int) -> tuple[int, bytes]:
        segment, offset, length = self._index.location(i)
        return self._index.keys[i], os.pread(self._fds[segment], length, offset)

    def _entry_head(self, i: int) -> tuple[int, bytes, int]:
        """`_entry` cut to the record's first HEAD_BYTES (bookkeeping reads a run's head,
        never its values), with the record's length."""
        segment, offset, length = self._index.location(i)
        raw = os.pread(self._fds[segment], min(length, HEAD_BYTES), offset)
        return self._index.keys[i], raw, length

    def _floor_index(self, position: int) -> int:
        return self._index.bisect_right(position) - 1

    def _range_indexes(self, first: int, last: int, limit: int) -> range:
        index = self._index
        lo = index.bisect_left(first)
        return range(lo, index.bisect_right(last, lo, min(lo + limit, len(index))))

    # Each read below finds its records and reads their bytes under `_guard`, so it sees
    # the index as of between two batches, never in the middle of one.

    def _floor(self, position: int) -> tuple[int, bytes] | None:
        with self._guard:
            i = self._floor_index(position)
            return None if i < 0 else self._entry(i)

    def _floor_head(self, position: int) -> tuple[int, bytes, int] | None:
        with self._guard:
            i = self._floor_index(position)
            return None if i < 0 else self._entry_head(i)

    def _range(self, first: int, last: int, limit: int) -> list[tuple[int, bytes]]:
        # Read eagerly: a later apply may unlink a segment.
        with self._guard:
            return [self._entry(i) for i in self._range_indexes(first, last, limit)]

    def _range_heads(self, first: int, last: int, limit: int) -> list[tuple[int, bytes, int]]:
        with self._guard:
            return [self._entry_head(i) for i in self._range_indexes(first, last, limit)]

    def _last_record(self) -> tuple[int, bytes] | None:
        with self._guard:
            return self._entry(len(self._index) - 1) if len(self._index) else None

    def _first_key(self) -> int | None:
        with self._guard:
            return self._index.keys[0] if len(self._index) else None

    def _write(self, plan: Plan) -> None:
        cut = plan.cut
        frame = encode_frame(plan.metadata, cut, plan.deletes, plan.puts)
        try:
            if self._size >= self._segment_bytes:
                self._roll()
            start = self._size
            try:
                os.lseek(self._wfd, start, os.SEEK_SET)
                self._write_all(self._wfd, frame)
                if plan.sync and not self._unsafe_no_sync:
                    os.fdatasync(self._wfd)
            except OSError:
                os.ftruncate(self._wfd, start)  # never leave a half frame behind
                raise
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(
                    f"data dir {self.path}: no space left on the device (segment write: "
                    f"{exc.strerror})"
                ) from None
            raise StorageError(f"data dir {self.path}: segment write failed: {exc}") from exc
        self._size = start + sum(map(len, frame))
        self._since_snapshot += self._size - start
        if plan.sync:
            try:
                self._write_mark()
            except OSError as exc:
                raise StorageError(
                    f"data dir {self.path}: synced mark write failed: {exc}"
                ) from exc
        self._cached.written(self._active, start, self._size)
        if plan.sync:  # every byte written so far is on the disk: its pages are clean
            for segment, offset, length in self._cached.to_drop():
                if segment in self._fds:
                    drop(self._fds[segment], offset, length)
        # Locations of each record's bytes inside the frame just written.
        meta = plan.metadata
        p = start + FRAME_HEADER.size + 1 + (4 + len(meta) if meta is not None else 0)
        p += (9 if cut is not None else 0) + (4 + 8 * len(plan.deletes) if plan.deletes else 0)
        p += 4
        locs = []
        for position, (head, body) in plan.puts:
            p += ENTRY.size
            length = len(head) + len(body)
            locs.append((position, (self._active, p, length)))
            p += length
        with self._guard:
            self._install(meta, cut, plan.deletes, locs)
        if plan.sync:
            try:
                self._reclaim()
            except OSError as exc:
                raise StorageError(f"data dir {self.path}: segment cleanup failed: {exc}") from exc

    def _close_fds(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self._mark_fd >= 0:
            os.close(self._mark_fd)
            self._mark_fd = -1
        if self._wfd >= 0:
            os.close(self._wfd)
            self._wfd = -1

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._mark_fd >= 0:
                with contextlib.suppress(OSError):  # a failing disk: the mark stays older
                    os.fsync(self._wfd)
                    self._write_mark(sync=True)
            with self._guard:
                self._close_fds()
            self._lock.release()
