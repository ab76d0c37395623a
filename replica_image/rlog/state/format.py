"""The bytes of a state entry in the log (format 1).

Every entry starts with a 6-byte header: the format version (1 byte), the kind (1 byte) and
a CRC-32 of the body (4 bytes, little-endian). A reader refuses an entry whose version it
does not know (`UnknownFormat`, naming the version) or whose body does not match its CRC or
does not parse (`CorruptEntry`): it never guesses at a state it cannot read.

Kinds:
- DIFF: the effect of one batch of mutations, already decided: absolute new versions and
  values, and expunges. Replaying a diff needs no decision. It also carries the position of
  the newest complete snapshot its writer knew (recovery starts there) and a random nonce
  (a writer whose append had an unknown outcome finds out whether it landed).
- SNAPSHOT: one chunk of a full copy of the state as of position `as_of` (every state entry
  below `as_of` included, none at or above it). A snapshot is `count` chunks; it is complete
  once every chunk is in the log. Chunks may be interleaved with diffs at positions after
  `as_of`; those apply on top of the snapshot.
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from rlog.client.errors import RlogError

FORMAT_VERSION = 1
NO_SNAPSHOT = -1

_HEADER = struct.Struct("<BBI")  # version, kind, crc32 of the body
_DIFF_HEAD = struct.Struct("<q16sI")  # newest snapshot, nonce, op count
_SNAPSHOT_HEAD = struct.Struct("<qqIIQI")  # as_of, previous, index, count, counter, vars
_OP_HEAD = struct.Struct("<BI")  # op kind, name length
_VALUE_HEAD = struct.Struct("<QI")  # version, value length
_NAME_HEAD = struct.Struct("<I")


class StateError(RlogError):
    """The replicated state cannot be used (see the subclasses)."""


class StateFormatError(StateError):
    """An entry of the log is not a state entry this library can read."""


class UnknownFormat(StateFormatError):
    """An entry with a format version this library does not read."""


class CorruptEntry(StateFormatError):
    """An entry whose bytes do not match its checksum or do not parse."""


class Kind(enum.IntEnum):
    DIFF = 1
    SNAPSHOT = 2


class OpKind(enum.IntEnum):
    SET = 1
    EXPUNGE = 2


@dataclass(frozen=True, slots=True)
class Op:
    """One decided change: SET name to value at `version`, or EXPUNGE name."""

    kind: OpKind
    name: str
    version: int = 0
    value: bytes = b""


@dataclass(frozen=True, slots=True)
class Diff:
    snapshot: int  # the newest complete snapshot's `as_of` its writer knew (NO_SNAPSHOT: none)
    nonce: bytes
    ops: tuple[Op, ...]


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    as_of: int  # the snapshot's identity: it holds every state entry below this position
    previous: int  # the newest complete snapshot before it (NO_SNAPSHOT: none)
    index: int
    count: int
    counter: int  # the highest version ever given, as of `as_of`
    variables: tuple[tuple[str, int, bytes], ...]  # (name, version, value)


Decoded = Diff | SnapshotChunk


def _frame(kind: Kind, body: bytes) -> bytes:
    return _HEADER.pack(FORMAT_VERSION, kind, zlib.crc32(body)) + body


def _name_bytes(name: str) -> bytes:
    return name.encode("utf-8")


def encode_diff(diff: Diff) -> bytes:
    parts = [_DIFF_HEAD.pack(diff.snapshot, diff.nonce, len(diff.ops))]
    for op in diff.ops:
        name = _name_bytes(op.name)
        parts.append(_OP_HEAD.pack(op.kind, len(name)))
        parts.append(name)
        parts.append(_VALUE_HEAD.pack(op.version, len(op.value)))
        parts.append(op.value)
    return _frame(Kind.DIFF, b"".join(parts))


def variable_size(name: str, value: bytes) -> int:
    """The bytes one variable takes in a snapshot chunk."""
    return _NAME_HEAD.size + len(name.encode("utf-8")) + _VALUE_HEAD.size + len(value)


def encode_snapshot_chunk(chunk: SnapshotChunk) -> bytes:
    parts = [
        _SNAPSHOT_HEAD.pack(
            chunk.as_of,
            chunk.previous,
            chunk.index,
            chunk.count,
            chunk.counter,
            len(chunk.variables),
        )
    ]
    for name, version, value in chunk.variables:
        raw = _name_bytes(name)
        parts.append(_NAME_HEAD.pack(len(raw)))
        parts.append(raw)
        parts.append(_VALUE_HEAD.pack(version, len(value)))
        parts.append(value)
    return _frame(Kind.SNAPSHOT, b"".join(parts))


def snapshot_chunks(
    as_of: int,
    previous: int,
    counter: int,
    variables: Iterable[tuple[str, int, bytes]],
    max_chunk_bytes: int,
) -> list[bytes]:
    """The encoded chunks of a snapshot, each at most about `max_chunk_bytes` (a single
    larger variable gets a chunk of its own). An empty state is one empty chunk."""
    groups: list[list[tuple[str, int, bytes]]] = [[]]
    size = 0
    for item in variables:
        item_size = variable_size(item[0], item[2])
        if groups[-1] and size + item_size > max_chunk_bytes:
            groups.append([])
            size = 0
        groups[-1].append(item)
        size += item_size
    return [
        encode_snapshot_chunk(
            SnapshotChunk(as_of, previous, index, len(groups), counter, tuple(group))
        )
        for index, group in enumerate(groups)
    ]


class _Reader:
    def __init__(self, body: bytes, position: int) -> None:
        self.body = body
        self.offset = 0
        self.position = position

    def take(self, layout: struct.Struct) -> tuple[Any, ...]:
        end = self.offset + layout.size
        if end > len(self.body):
            raise self.short()
        values = layout.unpack_from(self.body, self.offset)
        self.offset = end
        return values

    def raw(self, length: int) -> bytes:
        end = self.offset + length
        if end > len(self.body):
            raise self.short()
        data = self.body[self.offset : end]
        self.offset = end
        return data

    def name(self, length: int) -> str:
        try:
            return self.raw(length).decode("utf-8")
        except UnicodeDecodeError:
            raise CorruptEntry(
                f"state entry at position {self.position} is corrupted: a name is not UTF-8"
            ) from None

    def short(self) -> CorruptEntry:
        return CorruptEntry(
            f"state entry at position {self.position} is corrupted: it ends early "
            f"({len(self.body)} body bytes)"
        )

    def finish(self) -> None:
        if self.offset != len(self.body):
            raise CorruptEntry(
                f"state entry at position {self.position} is corrupted: "
                f"{len(self.body) - self.offset} bytes left over"
            )


def decode(value: bytes, position: int) -> Decoded:
    """The state entry `value` found at `position`; raises `UnknownFormat` or `CorruptEntry`."""
    if not value:
        raise UnknownFormat(
            f"entry at position {position} is empty: not a state entry "
            f"(this library reads state format {FORMAT_VERSION})"
        )
    if value[0] != FORMAT_VERSION:
        raise UnknownFormat(
            f"entry at position {position} has state format {value[0]}, which this library "
            f"does not read (it reads format {FORMAT_VERSION}); is this log used by something "
            "else, or written by a newer rlog.state?"
        )
    if len(value) < _HEADER.size:
        raise CorruptEntry(
            f"state entry at position {position} is corrupted: {len(value)} bytes, "
            f"shorter than the {_HEADER.size}-byte header"
        )
    _, kind, crc = _HEADER.unpack_from(value)
    body = bytes(value[_HEADER.size :])
    if zlib.crc32(body) != crc:
        raise CorruptEntry(
            f"state entry at position {position} is corrupted: its checksum does not match"
        )
    reader = _Reader(body, position)
    if kind == Kind.DIFF:
        snapshot, nonce, count = reader.take(_DIFF_HEAD)
        ops: list[Op] = []
        for _ in range(int(count)):
            op_kind, name_length = reader.take(_OP_HEAD)
            name = reader.name(int(name_length))
            version, value_length = reader.take(_VALUE_HEAD)
            data = reader.raw(int(value_length))
            if op_kind not in (OpKind.SET, OpKind.EXPUNGE):
                raise CorruptEntry(
                    f"state entry at position {position} is corrupted: operation {op_kind}"
                )
            ops.append(Op(OpKind(op_kind), name, int(version), data))
        reader.finish()
        return Diff(int(snapshot), bytes(nonce), tuple(ops))
    if kind == Kind.SNAPSHOT:
        as_of, previous, index, count, counter, n = reader.take(_SNAPSHOT_HEAD)
        variables = _snapshot_variables(body, reader.offset, int(n), position)
        if not 0 <= int(index) < int(count):
            raise CorruptEntry(
                f"state entry at position {position} is corrupted: chunk {index} of {count}"
            )
        return SnapshotChunk(
            int(as_of),
            int(previous),
            int(index),
            int(count),
            int(counter),
            variables,
        )
    raise CorruptEntry(f"state entry at position {position} is corrupted: unknown kind {kind}")


def _snapshot_variables(
    body: bytes, offset: int, count: int, position: int
) -> tuple[tuple[str, int, bytes], ...]:
    """The variables of a snapshot chunk's body from `offset` on: the hot loop of recovery,
    so written out without helper calls."""
    name_head, value_head = _NAME_HEAD.unpack_from, _VALUE_HEAD.unpack_from
    name_size, value_size = _NAME_HEAD.size, _VALUE_HEAD.size
    variables: list[tuple[str, int, bytes]] = []
    append = variables.append
    try:
        for _ in range(count):
            (name_length,) = name_head(body, offset)
            offset += name_size
            name_end = offset + name_length
            name = body[offset:name_end].decode("utf-8")
            version, value_length = value_head(body, name_end)
            offset = name_end + value_size
            end = offset + value_length
            if end > len(body) or name_end > len(body):
                raise struct.error("short")
            append((name, version, body[offset:end]))
            offset = end
    except (struct.error, UnicodeDecodeError):
        raise CorruptEntry(
            f"state entry at position {position} is corrupted: a snapshot variable does not parse"
        ) from None
    if offset != len(body):
        raise CorruptEntry(
            f"state entry at position {position} is corrupted: {len(body) - offset} bytes left over"
        )
    return tuple(variables)


def decode_all(entries: Iterable[tuple[int, bytes]]) -> Iterator[tuple[int, Decoded]]:
    for position, value in entries:
        yield position, decode(value, position)
