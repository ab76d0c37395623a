"""An in-memory engine: the pure-core tests and simulations use it (like etcd-raft's
MemoryStorage). It keeps nothing across processes; never used by a real replica."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from rlog.proto import rlog_pb2 as pb
from rlog.storage.base import Storage, WriteBatch


class MemoryStorage(Storage):
    def __init__(self) -> None:
        self._metadata = pb.Metadata()
        self._actions: dict[int, bytes] = {}
        self._positions: list[int] = []  # sorted keys of _actions

    def metadata(self) -> pb.Metadata:
        meta = pb.Metadata()
        meta.CopyFrom(self._metadata)
        return meta

    def get(self, position: int) -> pb.Action | None:
        raw = self._actions.get(position)
        return None if raw is None else pb.Action.FromString(raw)

    def scan(self, first: int, last: int) -> Iterator[pb.Action]:
        lo = bisect.bisect_left(self._positions, first)
        hi = bisect.bisect_right(self._positions, last)
        for position in self._positions[lo:hi]:
            yield pb.Action.FromString(self._actions[position])

    def last_position(self) -> int | None:
        return self._positions[-1] if self._positions else None

    def first_position(self) -> int | None:
        return self._positions[0] if self._positions else None

    def apply(self, batch: WriteBatch) -> None:
        if batch.metadata is not None:
            self._metadata = pb.Metadata()
            self._metadata.CopyFrom(batch.metadata)
        for action in batch.actions:
            if action.position not in self._actions:
                bisect.insort(self._positions, action.position)
            self._actions[action.position] = action.SerializeToString()
        if batch.delete_below is not None:
            cut = bisect.bisect_left(self._positions, batch.delete_below)
            for position in self._positions[:cut]:
                del self._actions[position]
            del self._positions[:cut]

    def close(self) -> None:
        pass
