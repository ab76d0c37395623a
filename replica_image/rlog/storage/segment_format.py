"""The segment engine's bytes on disk (rlog.storage.segment_engine): a batch's frame (length,
CRC, entries), the synced mark, and the index snapshot; pure encoding and decoding, no files."""

from __future__ import annotations

import struct
import sys
import zlib
from array import array
from collections.abc import Iterator
from typing import NamedTuple

import google_crc32c

from rlog.storage.base import StorageError
from rlog.storage.records import Encoded
from rlog.storage.segment_index import RecordIndex

_SNAPSHOT_MAGIC = b"RLOGIDX1"
_SNAPSHOT_HEAD = struct.Struct(">8sQQI")  # magic, segment number, records, metadata length
SNAPSHOT_ENTRY_BYTES = 28  # key u64, segment u64, offset u64, length u32
FRAME_HEADER = struct.Struct(">II")
# Bit 31 of a frame's length says its CRC is CRC32C (storage format 4; hardware-accelerated,
# about 8x zlib's CRC-32 here), clear in frames of formats 1-3 (zlib's CRC-32), which are
# still read. So a frame holds at most 2 GiB - 1 bytes.
_CRC32C_FRAME = 1 << 31
_MAX_FRAME = _CRC32C_FRAME - 1
U32 = struct.Struct(">I")
ENTRY = struct.Struct(">QI")
HAS_META = 1
HAS_CUT = 2
HAS_DELETES = 4
U64 = struct.Struct(">Q")
MARK_NAME = "synced"
_MARK_MAGIC = b"RLOGSYN1"
_MARK = struct.Struct(">8sQQQ")  # magic, snapshot segment (NO_SNAPSHOT), active, synced end
NO_SNAPSHOT = 2**64 - 1


_BIG = 4096  # record bytes at least this long are written from the caller's buffer
_IOV_MAX = 512  # parts per writev (Linux allows 1024)
# Bytes per write call at most. A kernel that gives a large buffered write large page-cache
# folios allocates them in high orders, and in a VM that hands free memory back to its host
# each of those pages faults in the host again: on the Firecracker VMs rlog is benchmarked
# on (Linux 6.18), 2 MiB and 8 MiB writes of new file data ran at 250-300 MB/s and the same
# bytes in 1 MiB writes at about 1,070 MB/s, fdatasync included (docs/performance.md, "What
# the host does to disk-bound figures"). Smaller calls cost a syscall per MiB, nothing measurable.
WRITE_PIECE = 1 << 20


def write_calls(
    parts: list[bytes], piece: int = WRITE_PIECE, iov_max: int = _IOV_MAX
) -> Iterator[list[bytes | memoryview]]:
    """`parts` regrouped into the buffers of successive writev calls: each call at most
    `piece` bytes and `iov_max` buffers, a part longer than that sliced (no copy)."""
    call: list[bytes | memoryview] = []
    room = piece
    for part in parts:
        view: bytes | memoryview = part
        while len(view) > room:  # room > 0 here: a full call is yielded at once
            call.append(memoryview(view)[:room])
            view = memoryview(view)[room:]
            yield call
            call, room = [], piece
        if view:
            call.append(view)
            room -= len(view)
        if len(call) >= iov_max or not room:
            yield call
            call, room = [], piece
    if call:
        yield call


def encode_frame(
    meta: bytes | None, cut: int | None, deletes: list[int], puts: list[tuple[int, Encoded]]
) -> list[bytes]:
    """One frame as a list of byte strings (header first). Large record bodies stay the
    caller's buffers and are never copied into a joined frame or record: with runs a frame
    is MiBs, and each copy of a fresh MiB-sized buffer costs page faults as well as
    bandwidth."""
    flags = (HAS_META if meta is not None else 0) | (HAS_CUT if cut is not None else 0)
    small = bytearray([flags | (HAS_DELETES if deletes else 0)])
    parts: list[bytes] = []
    if meta is not None:
        small += U32.pack(len(meta)) + meta
    if cut is not None:
        small += cut.to_bytes(9, "big")
    if deletes:
        small += U32.pack(len(deletes))
        for key in deletes:
            small += U64.pack(key)
    small += U32.pack(len(puts))
    for position, (head, body) in puts:
        small += ENTRY.pack(position, len(head) + len(body))
        small += head
        if len(body) >= _BIG:
            parts += [bytes(small), body]
            small.clear()
        else:
            small += body
    if small:
        parts.append(bytes(small))
    crc = 0
    for part in parts:
        crc = google_crc32c.extend(crc, part)
    length = sum(map(len, parts))
    if length > _MAX_FRAME:
        raise StorageError(f"a batch of {length} bytes is larger than a segment frame holds")
    return [FRAME_HEADER.pack(length | _CRC32C_FRAME, crc), *parts]


# The smallest payload a frame can have: its flags and its record count.
_EMPTY_PAYLOAD = 1 + U32.size


def blank_frame(size: int) -> bytes | None:
    """A valid frame of exactly `size` bytes that changes nothing when replayed (no flags,
    no records, zeros after them, which replay never reads), to write over a damaged
    frame once its loss is accounted for; None if no frame is that small."""
    length = size - FRAME_HEADER.size
    if length < _EMPTY_PAYLOAD or length > _MAX_FRAME:
        return None
    payload = bytes(length)  # flags 0, count 0, padding
    crc = google_crc32c.value(payload)
    return FRAME_HEADER.pack(length | _CRC32C_FRAME, crc) + payload


def frame_header(data: bytes, off: int) -> tuple[int, int, bool]:
    """The frame header at `off`: payload length, CRC, and whether the CRC is CRC32C."""
    length, crc = FRAME_HEADER.unpack_from(data, off)
    return length & _MAX_FRAME, crc, bool(length & _CRC32C_FRAME)


def payload_ok(payload: bytes, crc: int, crc32c: bool) -> bool:
    return (google_crc32c.value(payload) if crc32c else zlib.crc32(payload)) == crc


def _frame_ok(data: bytes, off: int) -> bool:
    if off + FRAME_HEADER.size > len(data):
        return False
    length, crc, crc32c = frame_header(data, off)
    start = off + FRAME_HEADER.size
    return start + length <= len(data) and payload_ok(data[start : start + length], crc, crc32c)


def next_frame(data: bytes, bad: int, newest: bool) -> int | None:
    """Where replay goes on after the damaged frame at `bad`: where its length field says
    it ends, if that can be trusted. It can when the frames from there on lead, each by its
    own length field, to a good frame, or (in a segment that is not the newest, so never
    torn) to the segment's end: several damaged frames in a row (a bad sector holds many
    small frames) are each skipped in turn. None: no such place."""
    first: int | None = None
    at = bad
    while at + FRAME_HEADER.size <= len(data):
        after = at + FRAME_HEADER.size + frame_header(data, at)[0]
        if first is None:
            first = after
        if after == len(data):
            return None if newest else first
        if after > len(data):
            return None
        if _frame_ok(data, after):
            return first
        at = after
    return None


def bytes_after_frame(data: bytes, bad: int) -> bool:
    """Whether bytes follow the frame at `bad` that fails its check. Segments are written by
    appending only, so a torn write leaves its frame last, cut short or reaching the end of
    the file; bytes after it mean the frame was damaged after it was written. (A damaged
    length field that points past the end reads as a torn tail: docs/faults.md.)"""
    if bad + FRAME_HEADER.size > len(data):
        return False
    length = frame_header(data, bad)[0]
    return bad + FRAME_HEADER.size + length < len(data)


class SyncedMark(NamedTuple):
    """What the engine knew it held when it last wrote the synced mark."""

    snapshot: int  # the newest index snapshot's segment (NO_SNAPSHOT: none ever written)
    active: int  # the segment written to
    end: int  # the end of its last synced frame


def encode_mark(mark: SyncedMark) -> bytes:
    body = _MARK.pack(_MARK_MAGIC, *mark)
    return body + U32.pack(google_crc32c.value(body))


def decode_mark(data: bytes) -> SyncedMark:
    """ValueError if `data` is not a synced mark or fails its CRC."""
    if len(data) != _MARK.size + 4:
        raise ValueError(f"{len(data)} bytes, not {_MARK.size + 4}")
    body, (crc,) = data[:-4], U32.unpack(data[-4:])
    if google_crc32c.value(body) != crc:
        raise ValueError("fails its CRC")
    magic, snapshot, active, end = _MARK.unpack(body)
    if magic != _MARK_MAGIC:
        raise ValueError("not a synced mark")
    return SyncedMark(snapshot, active, end)


def segment_name(number: int) -> str:
    return f"{number:016x}.seg"


def snapshot_name(number: int) -> str:
    return f"{number:016x}.idx"


def _little(values: array) -> bytes:
    if sys.byteorder == "big":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()


def _unpack_array(typecode: str, data: bytes) -> array:
    values = array(typecode)
    values.frombytes(data)
    if sys.byteorder == "big":
        values.byteswap()
    return values


def encode_snapshot(number: int, meta: bytes, begin: int, index: RecordIndex) -> bytes:
    """An index snapshot: the state before segment `number`."""
    body = b"".join(
        [
            _SNAPSHOT_HEAD.pack(_SNAPSHOT_MAGIC, number, len(index), len(meta)),
            meta,
            begin.to_bytes(9, "big"),
            _little(index.keys),
            _little(array("Q", index.segments)),
            _little(index.offsets),
            _little(index.lengths),
        ]
    )
    return body + U32.pack(google_crc32c.value(body))


def decode_snapshot(data: bytes) -> tuple[int, bytes, int, RecordIndex]:
    """(segment number, metadata, begin, index) of a snapshot; ValueError if it is not one
    or fails its checksum."""
    if len(data) < _SNAPSHOT_HEAD.size + 9 + 4:
        raise ValueError("too short")
    body, (crc,) = data[:-4], U32.unpack(data[-4:])
    if google_crc32c.value(body) != crc:
        raise ValueError("fails its CRC")
    magic, number, count, meta_len = _SNAPSHOT_HEAD.unpack_from(body)
    if magic != _SNAPSHOT_MAGIC:
        raise ValueError("not an index snapshot")
    p = _SNAPSHOT_HEAD.size
    meta = body[p : p + meta_len]
    p += meta_len
    begin = int.from_bytes(body[p : p + 9], "big")
    p += 9
    if len(body) != p + count * SNAPSHOT_ENTRY_BYTES:
        raise ValueError("its length does not match its record count")
    keys = _unpack_array("Q", body[p : p + 8 * count])
    p += 8 * count
    segments = _unpack_array("Q", body[p : p + 8 * count])
    p += 8 * count
    offsets = _unpack_array("Q", body[p : p + 8 * count])
    p += 8 * count
    lengths = _unpack_array("I", body[p : p + 4 * count])
    return number, meta, begin, RecordIndex.from_arrays(keys, segments, offsets, lengths)
