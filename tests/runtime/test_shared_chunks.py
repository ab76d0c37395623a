"""rlog.runtime.shared_chunks: which kept chunk may serve which Tail reader, and the bound."""

from __future__ import annotations

from rlog import packed
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.shared_chunks import SharedChunks, chunk_of


def run(first: int, size: int) -> pb.Run:
    data, offsets = packed.pack([b"v" * size])
    return pb.Run(first=first, data=data, offsets=offsets)


def test_a_chunk_cut_by_the_size_limit_serves_any_reader_reaching_its_end() -> None:
    shared = SharedChunks(1 << 20)
    chunk = chunk_of([run(10, 100)], last=10, end=50)  # cut at 10 although 50 was learned
    assert chunk.cut
    shared.put(10, 4096, chunk)
    assert shared.get(10, 10, 4096) is chunk
    assert shared.get(10, 99, 4096) is chunk
    assert shared.get(10, 9, 4096) is None  # the reader may not read that far yet
    assert shared.get(10, 50, 1024) is None  # cut for another response size
    assert shared.get(11, 50, 4096) is None
    assert (shared.hits, shared.misses) == (2, 3)


def test_a_chunk_that_ended_with_the_learned_entries_serves_only_the_same_end() -> None:
    shared = SharedChunks(1 << 20)
    chunk = chunk_of([run(10, 100)], last=12, end=12)
    assert not chunk.cut
    shared.put(10, 4096, chunk)
    assert shared.get(10, 12, 4096) is chunk
    # More is learned now: the reader reads a fuller chunk itself rather than a short one.
    assert shared.get(10, 13, 4096) is None


def test_the_chunks_kept_stay_within_the_budget_oldest_out_first() -> None:
    shared = SharedChunks(1000)
    for first in range(10):
        shared.put(first, 4096, chunk_of([run(first, 300)], first, first + 1))
        assert shared.bytes <= 1000
    assert len(shared) == 3
    assert shared.get(6, 10, 4096) is None and shared.get(9, 10, 4096) is not None
    # A chunk larger than the whole budget is not kept (and evicts nothing).
    shared.put(20, 4096, chunk_of([run(20, 5000)], 20, 21))
    assert shared.get(20, 21, 4096) is None and len(shared) == 3
    # A chunk kept again replaces the old one's bytes.
    shared.put(9, 4096, chunk_of([run(9, 100)], 9, 10))
    assert shared.bytes == 700
