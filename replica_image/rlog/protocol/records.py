"""Records as the replica's rules see them: an action (one position) or a run (consecutive
positions held as one record), and the pure operations the rules need on them: the positions
a record holds (`span`), whether a peer's records can be held at all (`well_formed`),
clipping (`cut`), putting what is decided but not yet durable over what is stored
(`layer`), marking a record learned (`as_learned`), and what makes two actions the same
entry (`same_value`). No state and no I/O: the replica's state is `replica.ReplicaCore`;
how records are encoded on disk is `rlog.storage` (storage/records.py).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import TypeVar

from rlog.packed import PackedError, clip, offsets_of, run_count, run_last
from rlog.proto import rlog_pb2 as pb
from rlog.storage.base import RunHead, clip_head


def same_value(a: pb.Action, b: pb.Action) -> bool:
    """Whether two actions propose the same log entry (ignoring Paxos bookkeeping): the same
    content from the same write (`origin_*`). Identical content appended by two requests is
    two different entries."""
    # Not `session_check`: the origin already tells writes apart (one leader at one
    # proposal places a position once, with one check), and a replica that predates the
    # field drops it when it fills the entry (`entry_of` copies fields by name), so during
    # a rolling upgrade comparing it would make upgraded replicas reject that fill of a
    # learned SESSION entry at every proposal.
    return (
        a.type == b.type
        and a.value == b.value
        and a.truncate_to == b.truncate_to
        and a.tombstone == b.tombstone
        and a.origin_proposal == b.origin_proposal
        and a.origin_leader == b.origin_leader
        and a.batch_first == b.batch_first
        and a.batch_last == b.batch_last
        and a.session == b.session
        and a.sequence == b.sequence
        and a.epoch == b.epoch
    )


def tombstone(position: int) -> pb.Action:
    return pb.Action(position=position, type=pb.NOP, tombstone=True, learned=True)


Record = pb.Action | pb.Run
Head = pb.Action | RunHead  # a record as bookkeeping reads it: a run without its values
R = TypeVar("R", pb.Action | pb.Run, pb.Action | RunHead)

# The highest position a record may hold: one below uint64's maximum, so that the begin a
# learned tombstone implies (its position + 1) still fits the uint64 fields it is stored in.
MAX_POSITION = 2**64 - 2


def well_formed(records: Iterable[Record]) -> bool:
    """Whether a peer's records can be held: every run's offsets check out and no position
    passes MAX_POSITION. A correct leader never sends anything else; a message that does not
    pass is taken as a whole or not at all (not at all), never stored to break later reads."""
    for record in records:
        if isinstance(record, pb.Run):
            try:
                offsets_of(record.data, record.offsets)
            except PackedError:
                return False
            if run_last(record) > MAX_POSITION:
                return False
        elif record.position > MAX_POSITION:
            return False
    return True


def span(record: Record | RunHead) -> tuple[int, int]:
    """The first and last position a record holds."""
    if isinstance(record, pb.Run):
        return record.first, record.first + run_count(record) - 1
    if isinstance(record, RunHead):
        return record.first, record.last
    return record.position, record.position


def first_of(record: Record | RunHead) -> int:
    return record.position if isinstance(record, pb.Action) else record.first


def cut(record: R, first: int, last: int) -> R:
    """A run (or run head) clipped to [first, last]; an action as it is."""
    if isinstance(record, pb.Run):
        return clip(record, first, last)
    if isinstance(record, RunHead):
        return clip_head(record, first, last)
    return record


def layer(lower: Iterable[R], upper: Sequence[R]) -> Iterator[R]:
    """The records of `lower` with those of `upper` put over them (both in position order,
    each without overlaps): an upper record replaces what lower holds at its positions."""
    index, count = 0, len(upper)
    covered = -1  # positions up to here are held by an upper record already emitted
    for record in lower:
        lo, hi = span(record)
        position = max(lo, covered + 1)
        while position <= hi:
            if index < count and first_of(upper[index]) <= hi:
                over = upper[index]
                over_lo, over_hi = span(over)
                if over_lo > position:
                    assert not isinstance(record, pb.Action)  # an action is one position
                    yield cut(record, position, over_lo - 1)
                yield over
                index += 1
                covered = max(covered, over_hi)
                position = max(position, over_hi + 1)
            else:
                yield cut(record, position, hi)
                position = hi + 1
    yield from upper[index:]


def as_learned(record: Record) -> Record:
    """The record with its learned flag set (a copy if it was not set)."""
    if isinstance(record, pb.Run):
        if record.head.learned:
            return record
        run = pb.Run()
        run.CopyFrom(record)  # one copy of the values (a constructor from .data makes two)
        run.head.learned = True
        return run
    if record.learned:
        return record
    copy = pb.Action()
    copy.CopyFrom(record)
    copy.learned = True
    return copy


def any_within(positions: Collection[int], lo: int, hi: int) -> bool:
    """Whether a position of `positions` (a set or dict) lies in [lo, hi]: by scanning the
    smaller of the two, so a check per run against a large set stays cheap."""
    if len(positions) <= hi - lo + 1:
        return any(lo <= p <= hi for p in positions)
    return any(p in positions for p in range(lo, hi + 1))
