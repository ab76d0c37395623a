"""What Read and Tail answer: the learned APPEND entries as runs (docs/data-path.md, "Clients,
reads and Spark"), built from the records the replica reads.

A record is a per-position `pb.Action` or a stored `pb.Run`. Consecutive APPEND actions are
packed into one run; a stored run passes through as it is (clipped to the range asked for,
its head dropped: a reader needs positions and values only). Other entries (NOP, SESSION,
EPOCH, TRUNCATE) end a run and are not sent.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rlog import packed
from rlog.proto import rlog_pb2 as pb

# What one Read or Tail response holds at most. Stored runs pass whole (a response never cuts
# one it has room for, so each is read from storage once per read), so the bounds are on the
# bytes of values (the message size), on the records (the Python work per response: a record
# costs a parse and an object, its positions nothing) and, loosely, on the positions (4 bytes
# of offsets each).
READ_RESPONSE_BYTES = 4 * 1024 * 1024
READ_RESPONSE_RECORDS = 1024
READ_RESPONSE_POSITIONS = 1 << 18


def read_runs(records: Iterable[pb.Action | pb.Run], first: int, last: int) -> list[pb.Run]:
    """The APPEND entries among `records` (in position order) within [first, last]."""
    runs: list[pb.Run] = []
    values: list[bytes] = []
    start = 0  # position of values[0]

    def close() -> None:
        if values:
            data, offsets = packed.pack(values)
            runs.append(pb.Run(first=start, data=data, offsets=offsets))
            values.clear()

    for record in records:
        if isinstance(record, pb.Run):
            clipped = packed.clip(record, first, last)
            if not packed.run_count(clipped):
                continue
            close()
            run = pb.Run()
            run.CopyFrom(clipped)  # one copy of the values (a constructor from .data: two)
            run.ClearField("head")
            runs.append(run)
            continue
        position = record.position
        if record.type != pb.APPEND or not first <= position <= last:
            close()
            continue
        if values and position != start + len(values):
            close()
        if not values:
            start = position
        values.append(record.value)
    close()
    return runs


def response_of(runs: Iterable[pb.Run]) -> pb.ReadResponse:
    """A Read or Tail response holding `runs`, each copied in once (the message's
    constructor copies a run by serializing and parsing it)."""
    response = pb.ReadResponse()
    for run in runs:
        response.runs.add().CopyFrom(run)
    return response


def end_of(records: Sequence[pb.Action | pb.Run]) -> int:
    """The last position `records` cover (they are not empty)."""
    record = records[-1]
    if isinstance(record, pb.Run):
        return packed.run_last(record)
    return int(record.position)
