"""Packed values and runs: the unit the data path moves (docs/data-path.md).

A batch of values travels and is stored as two byte strings: `data`, the values back to back,
and `offsets`, count+1 little-endian uint32 offsets into `data` (the first 0, the last
len(data)): the layout of an Arrow binary column, so pyarrow wraps it without copying and
Python never needs one object per value to move it. A `pb.Run` is such a batch at
consecutive positions with the fields its positions share (`head`).

Everything here is pure and cheap per batch; the only per-value loops are the ones that hand
values to a caller that asked for a list (`values_of`, `expand`).
"""

from __future__ import annotations

import itertools
import sys
from array import array
from collections.abc import Sequence

from rlog.proto import rlog_pb2 as pb

_LITTLE = sys.byteorder == "little"
MAX_PACKED_BYTES = (1 << 32) - 1  # uint32 offsets


class PackedError(ValueError):
    """Packed values that do not check out (bad offsets): the request is refused whole."""


def u32(raw: bytes) -> array[int]:
    """Packed offsets as integers (unchecked: see offsets_of)."""
    offsets = array("I")
    offsets.frombytes(raw)
    if not _LITTLE:
        offsets.byteswap()
    return offsets


def raw(offsets: array[int]) -> bytes:
    """Offsets as packed bytes (little-endian uint32)."""
    if not _LITTLE:
        offsets = array("I", offsets)
        offsets.byteswap()
    return offsets.tobytes()


def pack(values: Sequence[bytes]) -> tuple[bytes, bytes]:
    """(data, offsets) of `values`."""
    offsets = array("I", [0])
    end = 0
    for value in values:
        end += len(value)
        offsets.append(end)
    if end > MAX_PACKED_BYTES:
        raise PackedError(f"{end} bytes of values do not fit one packed batch (max 4 GiB)")
    return b"".join(values), raw(offsets)


def offsets_of(data: bytes, offsets: bytes) -> array[int]:
    """The offsets as integers, checked: count+1 non-decreasing offsets from 0 to len(data)."""
    if len(offsets) % 4 or (offsets and len(offsets) < 8):
        raise PackedError(f"packed offsets of {len(offsets)} bytes: not count+1 uint32 values")
    if not offsets:
        if data:
            raise PackedError("packed data without offsets")
        return array("I")
    parsed = u32(offsets)
    if parsed[0] != 0 or parsed[-1] != len(data):
        raise PackedError(
            f"packed offsets run from {parsed[0]} to {parsed[-1]}, not from 0 to {len(data)}"
        )
    if any(b < a for a, b in itertools.pairwise(parsed)):
        raise PackedError("packed offsets decrease")
    return parsed


def count_of(offsets: bytes) -> int:
    """How many values `offsets` delimits (unchecked)."""
    return max(len(offsets) // 4 - 1, 0)


def max_size(data: bytes, offsets: bytes) -> int:
    """The largest value's size (0 if none); checks the offsets."""
    parsed = offsets_of(data, offsets)
    return max((b - a for a, b in itertools.pairwise(parsed)), default=0)


def values_of(data: bytes, offsets: bytes) -> list[bytes]:
    """The values as a list (one object per value: for callers that want a list)."""
    parsed = u32(offsets)
    return [data[parsed[i] : parsed[i + 1]] for i in range(len(parsed) - 1)]


def slice_packed(data: bytes, offsets: bytes, start: int, stop: int) -> tuple[bytes, bytes]:
    """Values [start, stop) of a packed batch, packed again (offsets re-based to 0)."""
    parsed = u32(offsets)
    lo, hi = parsed[start], parsed[stop]
    if lo == 0 and stop == len(parsed) - 1:
        return data, offsets
    return data[lo:hi], raw(array("I", (o - lo for o in parsed[start : stop + 1])))


# ---- runs ---------------------------------------------------------------------------------


def run_count(run: pb.Run) -> int:
    return count_of(run.offsets)


def run_bytes(run: pb.Run) -> int:
    """len(run.data), read from its last offset: reading `data` copies the bytes (a run's
    megabyte) just to count them. Trusts the offsets (checked ones: see offsets_of)."""
    offsets = run.offsets
    return int.from_bytes(offsets[-4:], "little") if offsets else 0


def run_last(run: pb.Run) -> int:
    """The run's last position (first - 1 for an empty run)."""
    return run.first + run_count(run) - 1


def make_run(first: int, head: pb.Action, data: bytes, offsets: bytes) -> pb.Run:
    run = pb.Run(first=first, data=data, offsets=offsets)
    run.head.CopyFrom(head)
    run.head.ClearField("position")
    run.head.ClearField("value")
    return run


def clip(run: pb.Run, first: int, last: int) -> pb.Run:
    """The part of `run` at positions [first, last] (the run itself if it lies inside)."""
    lo, hi = max(first, run.first), min(last, run_last(run))
    if lo == run.first and hi == run_last(run):
        return run
    if hi < lo:
        return pb.Run(first=lo, head=run.head)
    data, offsets = slice_packed(run.data, run.offsets, lo - run.first, hi - run.first + 1)
    return pb.Run(first=lo, head=run.head, data=data, offsets=offsets)


def action_at(run: pb.Run, position: int) -> pb.Action:
    """The action the run holds at `position` (materialized: a copy of the head)."""
    index = position - run.first
    parsed = u32(run.offsets)
    if not 0 <= index < len(parsed) - 1:
        raise IndexError(f"position {position} is not in the run at {run.first}")
    action = pb.Action()
    action.CopyFrom(run.head)
    action.position = position
    action.value = run.data[parsed[index] : parsed[index + 1]]
    return action


def expand(run: pb.Run) -> list[pb.Action]:
    """One action per position (the slow path: fills, promises, tools)."""
    parsed = u32(run.offsets)
    out = []
    for index in range(len(parsed) - 1):
        action = pb.Action()
        action.CopyFrom(run.head)
        action.position = run.first + index
        action.value = run.data[parsed[index] : parsed[index + 1]]
        out.append(action)
    return out
