"""An in-memory engine: the pure-core tests and simulations use it (like etcd-raft's
MemoryStorage). It keeps nothing across processes; never used by a real replica.

It stores runs natively, as the disk engines do (docs/data-path.md): a run is one record;
an action put inside a stored run splits it; `delete_below` clips the run it crosses.
Records are kept serialized, so a caller changing a returned message changes nothing here.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator
from dataclasses import dataclass

from rlog.packed import action_at, clip, expand, run_last
from rlog.proto import rlog_pb2 as pb
from rlog.storage._common import MAX_POSITION
from rlog.storage.base import Storage, WriteBatch


@dataclass
class _Record:
    last: int  # == first for an action
    raw: bytes
    is_run: bool
    _run: pb.Run | None = None  # parsed once, never handed out (see `run`)

    def parse(self) -> pb.Action | pb.Run:
        return pb.Run.FromString(self.raw) if self.is_run else pb.Action.FromString(self.raw)

    @property
    def run(self) -> pb.Run:
        """The stored run, parsed (read-only: callers get copies or slices of it)."""
        if self._run is None:
            self._run = pb.Run.FromString(self.raw)
        return self._run


class MemoryStorage(Storage):
    def __init__(self) -> None:
        self._metadata = pb.Metadata()
        self._records: dict[int, _Record] = {}  # by first position
        self._firsts: list[int] = []  # sorted keys of _records

    def metadata(self) -> pb.Metadata:
        meta = pb.Metadata()
        meta.CopyFrom(self._metadata)
        return meta

    def _containing(self, position: int) -> int | None:
        """The first position of the record holding `position`, if any."""
        index = bisect.bisect_right(self._firsts, position) - 1
        if index < 0:
            return None
        first = self._firsts[index]
        return first if self._records[first].last >= position else None

    def get(self, position: int) -> pb.Action | None:
        record = self._records.get(position)
        if record is None or record.is_run:
            first = self._containing(position)
            if first is None:
                return None
            record = self._records[first]
        if record.is_run:
            return action_at(record.run, position)  # a new action, cut out of the run
        return pb.Action.FromString(record.raw)

    def scan_records(self, first: int, last: int) -> Iterator[pb.Action | pb.Run]:
        start = self._containing(first)
        lo = bisect.bisect_left(self._firsts, first if start is None else start)
        hi = bisect.bisect_right(self._firsts, last)
        for key in self._firsts[lo:hi]:
            record = self._records[key].parse()
            yield clip(record, first, last) if isinstance(record, pb.Run) else record

    def scan(self, first: int, last: int) -> Iterator[pb.Action]:
        for record in self.scan_records(first, last):
            if isinstance(record, pb.Run):
                yield from expand(record)
            else:
                yield record

    def last_position(self) -> int | None:
        return self._records[self._firsts[-1]].last if self._firsts else None

    def first_position(self) -> int | None:
        return self._firsts[0] if self._firsts else None

    def _insert(self, first: int, record: _Record) -> None:
        if first not in self._records:
            bisect.insort(self._firsts, first)
        self._records[first] = record

    def _put_run(self, run: pb.Run) -> None:
        if run.offsets and len(run.offsets) > 4:
            self._insert(run.first, _Record(run_last(run), run.SerializeToString(), True))

    def _remove(self, lo: int, hi: int) -> None:
        """Remove what is stored at positions [lo, hi]; runs crossing a bound keep their
        part outside it."""
        start = self._containing(lo)
        index = bisect.bisect_left(self._firsts, lo if start is None else start)
        keys = self._firsts[index : bisect.bisect_right(self._firsts, hi)]
        for key in keys:
            record = self._records.pop(key)
            self._firsts.remove(key)
            if record.is_run and (key < lo or record.last > hi):
                run = pb.Run.FromString(record.raw)
                if key < lo:
                    self._put_run(clip(run, key, lo - 1))
                if record.last > hi:
                    self._put_run(clip(run, hi + 1, record.last))

    def apply(self, batch: WriteBatch) -> None:
        # As the disk engines: a position outside [0, 2**64-1] refuses the batch whole.
        for run in batch.runs:
            if run.first < 0 or run_last(run) > MAX_POSITION:
                raise ValueError(f"run {run.first}..{run_last(run)} is outside [0, 2**64-1]")
        for action in batch.actions:
            if not 0 <= action.position <= MAX_POSITION:
                raise ValueError(f"position {action.position} is outside [0, 2**64-1]")
        for key in batch.drop_records:
            if key in self._records:
                del self._records[key]
                self._firsts.remove(key)
        for run in batch.runs:
            if run_last(run) < run.first:
                continue
            self._remove(run.first, run_last(run))
            self._put_run(run)
        for action in batch.actions:
            self._remove(action.position, action.position)
            self._insert(
                action.position, _Record(action.position, action.SerializeToString(), False)
            )
        if batch.delete_below is not None:
            # Last: a record of this batch below the cut goes too.
            self._remove(0, batch.delete_below - 1)
        if batch.metadata is not None:
            self._metadata = pb.Metadata()
            self._metadata.CopyFrom(batch.metadata)

    def close(self) -> None:
        pass
