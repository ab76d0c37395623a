"""A read of the segment engine while `apply` changes its index sees the state between two
batches, never part of one.

The replica reads its storage on the event loop while the journal's storage thread applies
batches (rlog/runtime/journal.py). The index is four arrays changed one after another, and
Python may switch threads between two of them (the loop over the columns in
`RecordIndex.delete` and `delete_below`). A read there found a key in the new keys and its
location in the old columns: it read another record's bytes and reported a corrupt record
that was not (the replica then dropped a good record and went RECOVERING). This test stops
the writer at that very point, reads from another thread, then lets the writer go on: the
read must answer the record it asked for.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlog.proto import rlog_pb2 as pb
from rlog.storage.base import WriteBatch
from rlog.storage.segment_engine import SegmentStorage
from rlog.storage.segment_index import RecordIndex

WAIT = 10.0  # seconds: only a bound on a hang, never reached when the test passes


class IndexPausedMidChange(RecordIndex):
    """A RecordIndex whose next multi-column change stops after the keys changed and before
    the locations do, until `resume` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.armed = False
        self.paused = threading.Event()
        self.resume = threading.Event()

    def _columns(self) -> Iterator:  # type: ignore[override]
        yield self.keys
        if self.armed:
            self.armed = False
            self.paused.set()
            self.resume.wait(WAIT)
        yield self.segments
        yield self.offsets
        yield self.lengths


def _pausing(store: SegmentStorage) -> IndexPausedMidChange:
    old = store._index
    index = IndexPausedMidChange.from_arrays(old.keys, old.segments, old.offsets, old.lengths)
    assert isinstance(index, IndexPausedMidChange)
    store._index = index
    return index


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(WriteBatch(delete_below=3), id="truncation"),
        pytest.param(WriteBatch(drop_records=[2]), id="record-dropped"),
    ],
)
def test_a_read_during_an_index_change_sees_a_whole_batch(
    tmp_path: Path, change: WriteBatch
) -> None:
    store = SegmentStorage(tmp_path)
    try:
        for position in range(1, 7):  # one record per position
            store.apply(
                WriteBatch(
                    actions=[
                        pb.Action(
                            position=position,
                            type=pb.APPEND,
                            value=f"value-{position}".encode(),
                            learned=True,
                        )
                    ]
                )
            )
        index = _pausing(store)
        index.armed = True
        writer = threading.Thread(target=store.apply, args=(change,))
        writer.start()
        assert index.paused.wait(WAIT), "the writer never reached the index change"

        answers: list[object] = []

        def read() -> None:
            try:
                answers.append(store.get(5))
            except Exception as exc:  # the answer under test
                answers.append(exc)

        reader = threading.Thread(target=read)
        reader.start()
        # The reader either answers now (reading mid-change, as before the fix) or waits for
        # the writer; either way let the writer finish, then judge the answer.
        reader.join(1.0)
        index.resume.set()
        writer.join(WAIT)
        reader.join(WAIT)
        assert not writer.is_alive() and not reader.is_alive()
        assert len(answers) == 1
        answer = answers[0]
        assert isinstance(answer, pb.Action), f"the read answered {answer!r}"
        assert (answer.position, answer.value) == (5, b"value-5")
        # and the change itself took effect
        gone = 2
        assert store.get(gone) is None
        kept = store.get(6)
        assert kept is not None and kept.value == b"value-6"
    finally:
        store.close()
