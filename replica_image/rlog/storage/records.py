"""What the disk engines share above their key-value primitives: the record codec, the
planning of a `WriteBatch` over stored records (pure), and `RecordStorage`, the reads and
`apply` written once against five primitives each engine supplies.

A stored record is a `pb.Run` (ONE record for all its positions, keyed by its first
position) or a `pb.Action` (keyed by its position). Records never overlap; every read of a
position is a floor lookup (the record with the greatest key <= position) followed by a
check that the record reaches the position.

Record bytes: one tag byte, then for a run its last position (8 bytes, big-endian: reads
learn where a run ends without parsing it), then the message as serialized. The tags (0x01
Action, 0x02 Run) are field number 0 in protobuf's wire format, which no serialized message
starts with, so a record of storage format 1 (a plain serialized Action, possibly empty) is
told apart from a tagged one and read as the Action it is (docs/data-path.md, "Storage: one
record per run").

Checksums (storage format 3): records are written with the tags 0x03 (Action) and 0x04
(Run), also field number 0, followed by a CRC32C (4 bytes, big-endian) of the record's key
(8 bytes, big-endian) and every other byte of the record; a run's last position comes
before the CRC, at the same place as in a 0x02 record. Every read checks it: a record whose
CRC fails (a flipped bit, a torn page, a record stored under the wrong key) raises
`CorruptRecord` and is never decoded. Records of formats 1 and 2 (no CRC) are still read as
they are; they get one when rewritten (docs/faults.md).
"""

from __future__ import annotations

import abc
import bisect
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import google_crc32c

from rlog.packed import action_at, clip, expand, run_count, run_last
from rlog.proto import rlog_pb2 as pb
from rlog.storage._common import MAX_POSITION
from rlog.storage.base import (
    CorruptRecord,
    RunHead,
    Storage,
    StorageError,
    WriteBatch,
    clip_head,
    head_of,
)

Record = pb.Action | pb.Run

ACTION_TAG = 0x01  # format 2, no checksum
RUN_TAG = 0x02  # format 2, no checksum
CHECKED_ACTION_TAG = 0x03
CHECKED_RUN_TAG = 0x04
METADATA_TAG = 0x05  # metadata with a checksum (untagged: a format 1/2 plain Metadata)
_CHECKED_ACTION_TAG = bytes([CHECKED_ACTION_TAG])
_CHECKED_RUN_TAG = bytes([CHECKED_RUN_TAG])
_METADATA_TAG = bytes([METADATA_TAG])
_LAST = struct.Struct(">Q")
_CRC = struct.Struct(">I")
_KEY = struct.Struct(">Q")
_METADATA_KEY = 2**64 - 1  # what the metadata's CRC covers as its key (its tag sets it apart)
SCAN_CHUNK = 256  # records read per short read transaction / iterator, at most
# A scan's first read takes a few records and each next one doubles while the chunk holds
# less than SCAN_CHUNK_BYTES: a consumer that stops after a few megabytes (Fetch, Read, a
# learned range) then never copies 256 records of 1 MB runs out of the engine to use four.
SCAN_FIRST_CHUNK = 4
SCAN_CHUNK_BYTES = 4 * 1024 * 1024


# ---- the codec ----------------------------------------------------------------------------


def _crc(key: int, head: bytes, body: bytes) -> bytes:
    crc = google_crc32c.extend(google_crc32c.value(_KEY.pack(key)), head)
    return _CRC.pack(google_crc32c.extend(crc, body))


# A record as an engine writes it: (header, body), its stored bytes the two one after the
# other. Kept apart so that an engine writing gather lists (the segment engine) never copies
# a run's body into a joined record: a run is a whole batch, up to MiBs, and that join was
# ~5 % of a follower's CPU at 4 KiB values (docs/data-path.md, "Records written in parts").
Encoded = tuple[bytes, bytes]


def encode_parts(record: Record) -> Encoded:
    """The record's header (tag, last position for a run, CRC) and its message bytes; the
    CRC covers the key (the record's first position), the header and the body."""
    body = record.SerializeToString()
    if isinstance(record, pb.Run):
        head = _CHECKED_RUN_TAG + _LAST.pack(run_last(record))
        return head + _crc(record.first, head, body), body
    return _CHECKED_ACTION_TAG + _crc(record.position, _CHECKED_ACTION_TAG, body), body


def encode(record: Record) -> bytes:
    """The record's bytes, CRC included (the key is the record's first position)."""
    return b"".join(encode_parts(record))


def _checked_body(key: int, raw: bytes, head_size: int) -> bytes:
    """The message bytes of a checksummed record, once its CRC checks out."""
    end = head_size + _CRC.size
    if len(raw) < end:
        raise CorruptRecord(key, f"record of {len(raw)} bytes is shorter than its header")
    head, body = raw[:head_size], raw[end:]
    if _crc(key, head, body) != raw[head_size:end]:
        raise CorruptRecord(key, "CRC32C mismatch")
    return body


def decode(key: int, raw: bytes) -> Record:
    """The record stored under `key`. Raises CorruptRecord if its checksum fails (or an
    unchecked record of an older format does not parse)."""
    try:
        if raw:
            tag = raw[0]
            if tag == CHECKED_RUN_TAG:
                record: Record = pb.Run.FromString(_checked_body(key, raw, 1 + _LAST.size))
            elif tag == CHECKED_ACTION_TAG:
                record = pb.Action.FromString(_checked_body(key, raw, 1))
            elif tag == RUN_TAG:
                record = pb.Run.FromString(raw[1 + _LAST.size :])
            elif tag == ACTION_TAG:
                record = pb.Action.FromString(raw[1:])
            else:
                record = pb.Action.FromString(raw)  # format 1: an untagged Action
        else:
            record = pb.Action.FromString(raw)
    except CorruptRecord:
        raise
    except Exception as exc:  # protobuf's DecodeError, a short header
        raise CorruptRecord(key, f"does not parse: {exc}") from None
    if first_of(record) != key:
        raise CorruptRecord(key, f"holds position {first_of(record)}")
    return record


def raw_last(key: int, raw: bytes) -> int:
    """The last position of the record stored under `key` (without parsing it). A header
    too short to hold one is read as `key`: the decode that follows reports the record."""
    if raw and raw[0] in (RUN_TAG, CHECKED_RUN_TAG) and len(raw) >= 1 + _LAST.size:
        last = int(_LAST.unpack_from(raw, 1)[0])
        return last if last >= key else key
    return key


# A run's first position, head and the length of its values sit in its first bytes (fields
# 1, 2 and the start of 3 of the message, in that order): this many hold them all for any
# head rlog writes (a head is a few dozen bytes).
HEAD_BYTES = 256


def _read_varint(raw: bytes, at: int) -> tuple[int, int]:
    """The varint at `at` and the offset after it (IndexError past the end of `raw`)."""
    value = shift = 0
    while True:
        byte = raw[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 63:
            raise IndexError("varint too long")


def _varint_size(value: int) -> int:
    return max(1, (value.bit_length() + 6) // 7)


def _run_head(key: int, prefix: bytes, length: int) -> RunHead | None:
    """The head of the run record of `length` bytes beginning with `prefix` (at least its
    header), or None when the prefix does not hold it or the record's layout does not add up
    (the caller then reads the whole record, whose checksum judges it)."""
    at = 1 + _LAST.size + (_CRC.size if prefix[0] == CHECKED_RUN_TAG else 0)
    first, head = 0, pb.Action()
    try:
        tag, at = _read_varint(prefix, at)
        if tag == 0x08:  # first (absent when 0)
            first, at = _read_varint(prefix, at)
            tag, at = _read_varint(prefix, at)
        if tag == 0x12:  # head
            size, at = _read_varint(prefix, at)
            if at + size > len(prefix):
                return None
            head = pb.Action.FromString(prefix[at : at + size])
            at += size
            tag, at = _read_varint(prefix, at)
        if tag != 0x1A:  # data, then offsets: 4 bytes per value and one more
            return None
        data, at = _read_varint(prefix, at)
    except Exception:  # a short prefix (IndexError), a head that does not parse
        return None
    # What is left after the values is the offsets field: its size says how many values
    # the run holds, which must be what its header says (the header is not checked alone).
    rest = length - at - data
    last = raw_last(key, prefix)
    count = last - first + 1
    offsets = 4 * (count + 1)
    if first != key or count < 1 or rest != 1 + _varint_size(offsets) + offsets:
        return None
    return RunHead(first, last, head)


def decode_head(key: int, raw: bytes, length: int) -> pb.Action | RunHead:
    """The record stored under `key` as `scan_heads` yields it, from its first bytes `raw`
    (all `length` of them, or at least HEAD_BYTES). A whole record is decoded and checked as
    `decode` does. Of a longer run only its beginning is read: its first position, head and
    layout, without the checksum, which covers the whole record: its values are checked
    whenever they are read (docs/data-path.md, "Bookkeeping reads heads")."""
    if len(raw) < length and raw and raw[0] in (CHECKED_RUN_TAG, RUN_TAG):
        found = _run_head(key, raw, length)
        if found is not None:
            return found
    if len(raw) < length:
        raise _ShortRead()
    return head_of(decode(key, raw))


class _ShortRead(Exception):
    """`decode_head` needs the whole record."""


def encode_metadata(meta: pb.Metadata) -> bytes:
    body = meta.SerializeToString()
    return _METADATA_TAG + _crc(_METADATA_KEY, _METADATA_TAG, body) + body


def decode_metadata(raw: bytes | None, where: object) -> pb.Metadata:
    """The stored metadata (format 1/2: plain, unchecked). Raises StorageError naming the
    data dir `where` if its checksum fails: the replica must not start on a promise or a
    status it cannot trust (docs/faults.md)."""
    if not raw:
        return pb.Metadata()
    try:
        if raw[0] == METADATA_TAG:
            return pb.Metadata.FromString(_checked_body(_METADATA_KEY, raw, 1))
        return pb.Metadata.FromString(raw)
    except Exception as exc:
        raise StorageError(
            f"data dir {where}: the stored metadata is corrupt ({exc}): restore the data dir "
            "or remove it and let the replica recover from its peers"
        ) from None


def first_of(record: Record) -> int:
    return record.first if isinstance(record, pb.Run) else record.position


def last_of(record: Record) -> int:
    return run_last(record) if isinstance(record, pb.Run) else record.position


def clip_record(record: Record, first: int, last: int) -> Record:
    return clip(record, first, last) if isinstance(record, pb.Run) else record


def _last_held(found: pb.Action | RunHead) -> int:
    return found.last if isinstance(found, RunHead) else found.position


# ---- planning (pure) ----------------------------------------------------------------------


def normalize(batch: WriteBatch) -> tuple[int | None, list[Record]]:
    """The batch's cut and its records in the order they apply (runs, then actions).

    Records below the cut are dropped (a run straddling it is clipped): the cut removes them
    in the same batch anyway. Empty runs hold no position and are dropped. Raises ValueError
    for a position outside [0, 2**64-1] before anything is written."""
    cut = batch.delete_below
    if cut is not None:
        cut = min(max(cut, 0), MAX_POSITION + 1)
    records: list[Record] = []
    for run in batch.runs:
        if run_count(run) == 0:
            continue
        if run.first < 0 or run_last(run) > MAX_POSITION:
            raise ValueError(f"run {run.first}..{run_last(run)} is outside [0, 2**64-1]")
        if cut is not None and run.first < cut:
            if run_last(run) < cut:
                continue
            run = clip(run, cut, run_last(run))
        records.append(run)
    for action in batch.actions:
        if not 0 <= action.position <= MAX_POSITION:
            raise ValueError(f"position {action.position} is outside [0, 2**64-1]")
        if cut is None or action.position >= cut:
            records.append(action)
    return cut, records


def spans(records: Iterable[Record]) -> list[tuple[int, int]]:
    """The position ranges `records` write, sorted and merged (adjacent ranges join), so an
    engine reads the stored records they touch with one seek per range."""
    merged: list[tuple[int, int]] = []
    for lo, hi in sorted((first_of(r), last_of(r)) for r in records):
        if merged and lo <= merged[-1][1] + 1:
            if hi > merged[-1][1]:
                merged[-1] = (merged[-1][0], hi)
        else:
            merged.append((lo, hi))
    return merged


class Overlay:
    """The stored records a batch touches, with the batch applied on top, in memory.

    Load the stored records that overlap what the batch writes (`load`), apply the batch
    (`cut`, `put`), then `changes()` says which keys to delete and which records to put."""

    def __init__(self) -> None:
        self._keys: list[int] = []  # sorted keys of _records
        self._records: dict[int, Record] = {}
        self._dirty: set[int] = set()
        self._cut: int | None = None

    def load(self, key: int, record: Record) -> None:
        if key not in self._records:
            bisect.insort(self._keys, key)
            self._records[key] = record

    def _set(self, key: int, record: Record) -> None:
        if key not in self._records:
            bisect.insort(self._keys, key)
        self._records[key] = record
        self._dirty.add(key)

    def _drop(self, key: int) -> Record:
        self._keys.remove(key)
        self._dirty.add(key)
        return self._records.pop(key)

    def overlapping(self, first: int, last: int) -> list[int]:
        """Keys of the records holding any position in [first, last]."""
        i = bisect.bisect_right(self._keys, first) - 1
        if i < 0 or last_of(self._records[self._keys[i]]) < first:
            i += 1
        j = bisect.bisect_right(self._keys, last)
        return self._keys[i:j]

    def put(self, record: Record) -> None:
        """Store `record`, replacing whatever held its positions: a record it covers only in
        part is split, its pieces outside the new record stay."""
        first, last = first_of(record), last_of(record)
        for key in self.overlapping(first, last):
            old = self._drop(key)
            if key < first:
                self._set(key, clip_record(old, key, first - 1))
            if last_of(old) > last:
                self._set(last + 1, clip_record(old, last + 1, last_of(old)))
        self._set(first, record)

    def cut(self, cut: int) -> None:
        """Delete every position below `cut`; a record straddling it keeps its part above."""
        self._cut = cut
        for key in [k for k in self._keys if k < cut]:
            old = self._drop(key)
            if last_of(old) >= cut:
                self._set(cut, clip_record(old, cut, last_of(old)))

    def changes(self) -> tuple[list[int], list[tuple[int, Record]]]:
        """(keys to delete, (key, record) to put), each in key order. Keys below the cut are
        left out: the engine deletes everything below it first, in its own way."""
        deletes: list[int] = []
        puts: list[tuple[int, Record]] = []
        for key in sorted(self._dirty):
            if self._cut is not None and key < self._cut:
                continue
            record = self._records.get(key)
            if record is None:
                deletes.append(key)
            else:
                puts.append((key, record))
        return deletes, puts


@dataclass
class Plan:
    """What an engine writes for one batch, atomically and in this order: every key below
    `cut` deleted (if a cut), the `deletes`, the `puts` (encoded records), the metadata."""

    cut: int | None = None
    deletes: list[int] = field(default_factory=list)
    puts: list[tuple[int, Encoded]] = field(default_factory=list)
    metadata: bytes | None = None
    sync: bool = True


# ---- the shared engine base ---------------------------------------------------------------


class RecordStorage(Storage):
    """Reads and `apply` over records, for an engine that supplies the primitives below
    (keys are record first positions; `raw` values are record bytes as `encode` wrote)."""

    @abc.abstractmethod
    def _floor(self, position: int) -> tuple[int, bytes] | None:
        """The record with the greatest key <= position."""

    @abc.abstractmethod
    def _range(self, first: int, last: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to `limit` records with first <= key <= last, in key order (read eagerly)."""

    def _range_heads(self, first: int, last: int, limit: int) -> list[tuple[int, bytes, int]]:
        """`_range` as (key, bytes, length): an engine that can read a record's beginning
        alone may give only its first HEAD_BYTES or more (of its `length`)."""
        return [(key, raw, len(raw)) for key, raw in self._range(first, last, limit)]

    def _floor_head(self, position: int) -> tuple[int, bytes, int] | None:
        """`_floor` as (key, bytes, length), the bytes possibly cut as `_range_heads`'."""
        found = self._floor(position)
        return None if found is None else (found[0], found[1], len(found[1]))

    @abc.abstractmethod
    def _last_record(self) -> tuple[int, bytes] | None:
        """The record with the greatest key."""

    @abc.abstractmethod
    def _first_key(self) -> int | None:
        """The smallest key."""

    @abc.abstractmethod
    def _write(self, plan: Plan) -> None:
        """Apply `plan` atomically; durable before returning when `plan.sync`."""

    # -- reads -------------------------------------------------------------------------------

    def _reaching(self, position: int, dropped: set[int] | None = None) -> Record | None:
        """The stored record holding `position` (none if its key is in `dropped`). Whether the
        floor record reaches `position` is read from its beginning (its header's last
        position): every write asks this of the record before it, which is the previous
        batch's run and, read whole, was a megabyte read to learn that it ends before."""
        found = self._floor_head(position)
        if found is None or raw_last(found[0], found[1]) < position:
            return None
        key, raw, length = found
        if len(raw) < length:
            # Read whole, as before; this read decides (a write between the two reads may
            # have replaced the record).
            whole = self._floor(position)
            if whole is None or raw_last(*whole) < position:
                return None
            key, raw = whole
        if dropped and key in dropped:
            return None
        return decode(key, raw)

    def get(self, position: int) -> pb.Action | None:
        if not 0 <= position <= MAX_POSITION:
            return None
        record = self._reaching(position)
        if record is None:
            return None
        return action_at(record, position) if isinstance(record, pb.Run) else record

    def scan_records(self, first: int, last: int) -> Iterator[Record]:
        first, last = max(first, 0), min(last, MAX_POSITION)
        if first > last:
            return
        head = self._reaching(first)
        if head is not None:
            yield clip_record(head, first, last)
            if last_of(head) >= last:
                return
            first = last_of(head) + 1
        # Chunked: each chunk comes from its own short read (no snapshot pinned while the
        # consumer works; a scan interleaved with writes may see writes between chunks).
        size = SCAN_FIRST_CHUNK
        while first <= last:
            chunk = self._range(first, last, size)
            if not chunk:
                return
            for key, raw in chunk:
                record = decode(key, raw)
                yield clip_record(record, first_of(record), min(last, last_of(record)))
            if len(chunk) < size:
                return
            first = chunk[-1][0] + 1
            if sum(len(raw) for _, raw in chunk) < SCAN_CHUNK_BYTES:
                size = min(size * 2, SCAN_CHUNK)

    def scan_heads(self, first: int, last: int) -> Iterator[pb.Action | RunHead]:
        first, last = max(first, 0), min(last, MAX_POSITION)
        if first > last:
            return
        floor = self._floor_head(first)
        if floor is not None and raw_last(floor[0], floor[1]) >= first:
            reaching = self._head(*floor)
            if reaching is None:
                return
            yield clip_head(reaching, first, last)
            if _last_held(reaching) >= last:
                return
            first = _last_held(reaching) + 1
        while first <= last:
            chunk = self._range_heads(first, last, SCAN_CHUNK)
            if not chunk:
                return
            for key, raw, length in chunk:
                found = self._head(key, raw, length)
                if found is None:
                    return
                yield clip_head(found, first, last)
            if len(chunk) < SCAN_CHUNK:
                return
            first = chunk[-1][0] + 1

    def _head(self, key: int, raw: bytes, length: int) -> pb.Action | RunHead | None:
        """The record under `key` as `scan_heads` yields it, read whole if its beginning
        does not tell (None: it was removed since, by a truncation)."""
        try:
            return decode_head(key, raw, length)
        except _ShortRead:
            whole = self._range(key, key, 1)
            if not whole or whole[0][0] != key:
                return None
            return head_of(decode(*whole[0]))

    def scan(self, first: int, last: int) -> Iterator[pb.Action]:
        for record in self.scan_records(first, last):
            if isinstance(record, pb.Run):
                yield from expand(record)
            else:
                yield record

    def last_position(self) -> int | None:
        found = self._last_record()
        return None if found is None else raw_last(*found)

    def first_position(self) -> int | None:
        return self._first_key()  # records are never empty, so a key is a held position

    # -- writes ------------------------------------------------------------------------------

    def plan(self, batch: WriteBatch) -> Plan:
        """Read the stored records the batch touches and plan its writes (no writes yet)."""
        cut, records = normalize(batch)
        dropped = set(batch.drop_records)
        overlay = Overlay()
        if cut is not None and cut > 0:
            straddling = self._reaching(cut - 1, dropped)
            if straddling is not None and last_of(straddling) >= cut:
                overlay.load(first_of(straddling), straddling)
        for lo, hi in spans(records):
            head = self._reaching(lo, dropped)
            if head is not None:
                overlay.load(first_of(head), head)
            start = lo
            while start <= hi:
                chunk = self._range(start, hi, SCAN_CHUNK)
                for key, raw in chunk:
                    if key not in dropped:
                        overlay.load(key, decode(key, raw))
                if len(chunk) < SCAN_CHUNK:
                    break
                start = chunk[-1][0] + 1
        if cut is not None:
            overlay.cut(cut)
        for record in records:
            overlay.put(record)
        deletes, puts = overlay.changes()
        if dropped:
            put_keys = {key for key, _ in puts}
            deletes = sorted(set(deletes) | {k for k in dropped if k not in put_keys})
        return Plan(
            cut=cut,
            deletes=deletes,
            puts=[(key, encode_parts(record)) for key, record in puts],
            metadata=None if batch.metadata is None else encode_metadata(batch.metadata),
            sync=batch.sync,
        )

    def apply(self, batch: WriteBatch) -> None:
        self._write(self.plan(batch))
