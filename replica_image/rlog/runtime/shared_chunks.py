"""Chunks of learned entries read for one Tail reader, kept a little while for the others.

Tail readers that follow the head of the log all ask for the same positions as they are
learned; without sharing, a replica with N of them reads, checks (CRC) and packs every new
entry N times on the event loop that also serves appends (measured with 256 readers: appends
12x slower, docs/faults.md). A learned position's value never changes, so a chunk read once
for [first, last] serves every reader that reaches `first` while it is kept; truncation is
checked by the caller against the log's begin, as for a chunk it reads itself.

A chunk is kept by its first position and the response size it was cut for; it serves a
reader whose end is at or past the chunk's last position: either the chunk was cut by the
size limit (the reader would have cut it the same way), or it ends exactly at the reader's
end. A chunk that ended early only because fewer entries were learned then is read again.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from rlog.packed import run_bytes
from rlog.proto import rlog_pb2 as pb

# What the chunks kept may hold in all (bytes of values): 64 Tail responses of 256 KiB.
DEFAULT_SHARED_CHUNK_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class Chunk:
    runs: list[pb.Run]  # the APPEND entries of [first, last] (may be none: NOPs, sessions)
    last: int  # the chunk's last position
    cut: bool  # ended by the response's size limits, not by the end asked for
    size: int  # bytes of values


def chunk_of(runs: list[pb.Run], last: int, end: int) -> Chunk:
    # (stored runs: their offsets were checked; reading `data` would copy each run)
    return Chunk(runs, last, last < end, sum(run_bytes(run) for run in runs))


class SharedChunks:
    """An LRU of chunks by (first position, response size), bounded in bytes of values."""

    def __init__(self, budget_bytes: int = DEFAULT_SHARED_CHUNK_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._chunks: OrderedDict[tuple[int, int], Chunk] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, first: int, end: int, chunk_bytes: int) -> Chunk | None:
        """The chunk kept for a reader at `first` that may read up to `end`, or None."""
        chunk = self._chunks.get((first, chunk_bytes))
        if chunk is None or chunk.last > end or not (chunk.cut or chunk.last == end):
            self.misses += 1
            return None
        self._chunks.move_to_end((first, chunk_bytes))
        self.hits += 1
        return chunk

    def put(self, first: int, chunk_bytes: int, chunk: Chunk) -> None:
        if chunk.size > self.budget_bytes:
            return
        old = self._chunks.pop((first, chunk_bytes), None)
        if old is not None:
            self._bytes -= old.size
        self._chunks[(first, chunk_bytes)] = chunk
        self._bytes += chunk.size
        while self._bytes > self.budget_bytes:
            _, evicted = self._chunks.popitem(last=False)
            self._bytes -= evicted.size

    @property
    def bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._chunks)
