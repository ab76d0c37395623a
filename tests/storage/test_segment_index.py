"""The segment engine's columnar index against a plain dict model: random puts (in order,
overwrites, holes filled), deletes and cuts, and a snapshot's round trip."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from rlog.storage.segment_format import decode_snapshot, encode_snapshot
from rlog.storage.segment_index import RecordIndex


def _check(index: RecordIndex, model: dict[int, tuple[int, int, int]]) -> None:
    keys = sorted(model)
    assert list(index.keys) == keys
    assert [index.location(i) for i in range(len(index))] == [model[k] for k in keys]
    assert index.records_per_segment() == Counter(loc[0] for loc in model.values())


@pytest.mark.parametrize("seed", range(8))
def test_the_index_follows_a_dict_through_random_changes(seed: int) -> None:
    rng = random.Random(seed)
    index, model = RecordIndex(), {}
    next_key = 1
    for step in range(3000):
        kind = rng.random()
        if kind < 0.55:  # an append past the end
            next_key += rng.randint(1, 3)
            key = next_key
        elif kind < 0.75 and model:  # an overwrite of an indexed key
            key = rng.choice(list(model))
        elif kind < 0.85:  # a hole filled (or a key below everything)
            key = rng.randint(0, next_key)
        elif kind < 0.95:
            key = rng.randint(0, next_key)
            assert index.delete(key) == (model.pop(key)[0] if key in model else None)
            continue
        else:
            cut = rng.randint(0, next_key)
            lost = Counter(loc[0] for k, loc in model.items() if k < cut)
            model = {k: v for k, v in model.items() if k >= cut}
            assert index.delete_below(cut) == lost
            continue
        loc = (rng.randint(0, 50), rng.randint(0, 2**40), rng.randint(0, 2**20))
        assert index.put(key, loc) == (model[key][0] if key in model else None)
        model[key] = loc
        if step % 100 == 0:
            _check(index, model)
    _check(index, model)
    for key in [*list(model)[:5], next_key + 1, 0]:
        i = index.find(key)
        assert (i is not None and index.keys[i] == key) == (key in model)


def test_a_snapshot_round_trips_the_index_and_its_damage_is_refused() -> None:
    index = RecordIndex()
    for k in range(1000):
        index.put(10 + 64 * k, (k // 100, 8 + 1000 * k, 900 + k % 7))
    data = encode_snapshot(42, b"meta", 7, index)
    number, meta, begin, loaded = decode_snapshot(data)
    assert (number, meta, begin) == (42, b"meta", 7)
    assert [loaded.location(i) for i in range(len(loaded))] == [
        index.location(i) for i in range(len(index))
    ]
    assert list(loaded.keys) == list(index.keys)
    damaged = bytearray(data)
    damaged[len(damaged) // 2] ^= 1
    with pytest.raises(ValueError, match="CRC"):
        decode_snapshot(bytes(damaged))


def test_a_location_that_does_not_fit_is_refused_and_changes_nothing() -> None:
    index = RecordIndex()
    index.put(1, (0, 0, 10))
    with pytest.raises(ValueError, match="does not fit"):
        index.put(2, (2**32, 0, 10))
    with pytest.raises(ValueError, match="does not fit"):
        index.put(1, (0, 0, 2**32))
    assert len(index) == 1 and index.location(0) == (0, 0, 10)


def test_a_record_costs_24_bytes_of_index() -> None:
    index = RecordIndex()
    for k in range(10_000):
        index.put(k, (k // 1000, 100 * k, 1024))
    assert index.nbytes() == 24 * 10_000
