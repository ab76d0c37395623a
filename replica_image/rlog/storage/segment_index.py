"""The segment engine's in-memory index: each live record's key and where its bytes are.

Four typed arrays in key order (key u64, segment u32, offset u64, length u32): 24 bytes per
live record, where a dict of tuples cost about 150 (an int key object, a tuple of three, its
ints and the dict's slot). A replica that stores serial appends keeps one record per
position, so this is the engine's memory per position (docs/storage-engines.md).

Keys almost always arrive in order (appends, catch-up), which is an append to each array;
a key inside the range (a hole filled, a run split by a write over part of it) is an insert,
a move of the arrays' tails as the sorted list before it was.
"""

from __future__ import annotations

import bisect
from array import array
from collections import Counter
from collections.abc import Iterable

Location = tuple[int, int, int]  # segment, offset, length

MAX_SEGMENT = 2**32 - 1
MAX_LENGTH = 2**32 - 1


def _typed(typecode: str, values: array) -> array:
    """`values` itself if it has the typecode (no copy), else a converted copy."""
    return values if values.typecode == typecode else array(typecode, values)


class RecordIndex:
    def __init__(self) -> None:
        self.keys = array("Q")
        self.segments = array("I")
        self.offsets = array("Q")
        self.lengths = array("I")

    @classmethod
    def from_arrays(
        cls, keys: array, segments: Iterable[int], offsets: array, lengths: array
    ) -> RecordIndex:
        # The arrays of the right type are taken as they are, not copied: a snapshot's
        # columns of a million records are 24 MB.
        """An index of sorted keys and their locations (an index snapshot's columns)."""
        index = cls()
        index.keys = _typed("Q", keys)
        index.segments = array("I", segments)
        index.offsets = _typed("Q", offsets)
        index.lengths = _typed("I", lengths)
        if not (len(index.keys) == len(index.segments) == len(index.offsets) == len(index.lengths)):
            raise ValueError("the index's columns differ in length")
        return index

    def __len__(self) -> int:
        return len(self.keys)

    def nbytes(self) -> int:
        """Bytes the columns hold (their allocations may be up to about 1/8 larger)."""
        return sum(a.itemsize * len(a) for a in self._columns())

    def _columns(self) -> tuple[array, array, array, array]:
        return self.keys, self.segments, self.offsets, self.lengths

    def location(self, i: int) -> Location:
        return self.segments[i], self.offsets[i], self.lengths[i]

    def bisect_left(self, key: int) -> int:
        return bisect.bisect_left(self.keys, key)

    def bisect_right(self, key: int, lo: int = 0, hi: int | None = None) -> int:
        return bisect.bisect_right(self.keys, key, lo, len(self.keys) if hi is None else hi)

    def find(self, key: int) -> int | None:
        i = bisect.bisect_left(self.keys, key)
        return i if i < len(self.keys) and self.keys[i] == key else None

    def put(self, key: int, loc: Location) -> int | None:
        """Index `key` at `loc`; the segment of the location it replaced, if any."""
        segment, offset, length = loc
        if not 0 <= segment <= MAX_SEGMENT or not 0 <= length <= MAX_LENGTH:
            raise ValueError(f"location {loc} does not fit the index")
        keys = self.keys
        if not keys or key > keys[-1]:
            keys.append(key)
            self.segments.append(segment)
            self.offsets.append(offset)
            self.lengths.append(length)
            return None
        i = bisect.bisect_left(keys, key)
        if keys[i] == key:
            old = self.segments[i]
            self.segments[i], self.offsets[i], self.lengths[i] = segment, offset, length
            return old
        keys.insert(i, key)
        self.segments.insert(i, segment)
        self.offsets.insert(i, offset)
        self.lengths.insert(i, length)
        return None

    def delete(self, key: int) -> int | None:
        """Drop `key`; the segment its record was in, None if it was not indexed."""
        i = self.find(key)
        if i is None:
            return None
        segment = self.segments[i]
        for column in self._columns():
            del column[i]
        return segment

    def delete_below(self, cut: int) -> Counter[int]:
        """Drop every key below `cut`; how many records each segment lost."""
        n = bisect.bisect_left(self.keys, cut)
        if not n:
            return Counter()
        lost = Counter(self.segments[:n])
        for column in self._columns():
            del column[:n]
        return lost

    def records_per_segment(self) -> Counter[int]:
        return Counter(self.segments)
