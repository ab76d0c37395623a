"""The client's side of packed values (docs/data-path.md, "Clients, reads and Spark"): what an
append sends (`Payload`), what an append answer says (`answered_positions`), and what a read
answer holds (`runs_of`, `last_position`, `pairs_of`), for servers that send runs and for
older ones that send one `Entry` per position.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from rlog import packed
from rlog.proto import rlog_pb2 as pb


@dataclass(frozen=True, slots=True)
class Payload:
    """The values of one append, packed (`data` + count+1 LE uint32 `offsets`)."""

    data: bytes
    offsets: bytes
    count: int

    @classmethod
    def of_values(cls, values: Sequence[bytes]) -> Payload:
        data, offsets = packed.pack(values)
        return cls(data, offsets, len(values))

    @classmethod
    def of_packed(cls, data: bytes, offsets: bytes) -> Payload:
        """Values packed by the caller; the server checks the offsets (a bad batch is refused
        whole with INVALID_ARGUMENT)."""
        return cls(data, offsets, packed.count_of(offsets))

    @property
    def size(self) -> int:
        return len(self.data)


EMPTY = Payload(b"", b"", 0)


def joined(payloads: Sequence[Payload]) -> Payload:
    """Several appends' values as one request's: data back to back, offsets re-based."""
    if len(payloads) == 1:
        return payloads[0]
    offsets = array("I", [0])
    base = 0
    for payload in payloads:
        if payload.count:
            parsed = packed.u32(payload.offsets)
            if base:
                offsets.extend(o + base for o in parsed[1:])
            else:
                offsets.extend(parsed[1:])
            base += len(payload.data)
    if base > packed.MAX_PACKED_BYTES:
        raise packed.PackedError(f"{base} bytes of values do not fit one packed batch")
    return Payload(
        b"".join(p.data for p in payloads),
        packed.raw(offsets) if len(offsets) > 1 else b"",
        sum(p.count for p in payloads),
    )


def answered_positions(response: pb.AppendResponse) -> Sequence[int]:
    """The positions an append was given: `first .. first+count-1` (a range, no list), or the
    `positions` list of a server that predates packed answers."""
    if response.count or not response.positions:
        return range(response.first, response.first + response.count)
    return list(response.positions)


# ---- reads ------------------------------------------------------------------------------------


def runs_of(response: pb.ReadResponse) -> list[pb.Run]:
    """The response's entries as runs (head unset): its `runs` as they are, or the `entries`
    of an older server packed into runs of consecutive positions."""
    if response.runs or not response.entries:
        return list(response.runs)
    runs: list[pb.Run] = []
    group: list[pb.Entry] = []
    for entry in response.entries:
        if group and entry.position != group[-1].position + 1:
            runs.append(_run_of_entries(group))
            group = []
        group.append(entry)
    if group:
        runs.append(_run_of_entries(group))
    return runs


def _run_of_entries(entries: list[pb.Entry]) -> pb.Run:
    data, offsets = packed.pack([e.value for e in entries])
    return pb.Run(first=entries[0].position, data=data, offsets=offsets)


def last_position(response: pb.ReadResponse) -> int | None:
    """The last position the response holds an entry of (None: it holds none)."""
    if response.runs:
        for run in reversed(response.runs):
            if packed.run_count(run):
                return packed.run_last(run)
        return None
    if response.entries:
        return int(response.entries[-1].position)
    return None


def pairs_of(response: pb.ReadResponse) -> Iterator[tuple[int, bytes]]:
    """(position, value) of every entry of the response, in order."""
    if not response.runs:
        for entry in response.entries:
            yield entry.position, entry.value
        return
    for run in response.runs:
        offsets = packed.u32(run.offsets)
        data = run.data
        first = run.first
        for index in range(len(offsets) - 1):
            yield first + index, data[offsets[index] : offsets[index + 1]]
