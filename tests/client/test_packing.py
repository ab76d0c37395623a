"""The edges' pure parts: what a client sends and parses (rlog.client.packing), how a replica
groups what it reads into runs (rlog.runtime.read_runs), including answers of servers that
predate packed values."""

from __future__ import annotations

import pytest

from rlog import packed
from rlog.client.packing import (
    Payload,
    answered_positions,
    joined,
    last_position,
    pairs_of,
    runs_of,
)
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.read_runs import end_of, read_runs


def values(run: pb.Run) -> list[bytes]:
    return packed.values_of(run.data, run.offsets)


def test_joined_payloads_are_one_packed_batch():
    parts = [Payload.of_values([b"a", b"bb"]), Payload.of_values([]), Payload.of_values([b"ccc"])]
    parts = [p for p in parts if p.count]
    both = joined(parts)
    assert both.count == 3 and packed.values_of(both.data, both.offsets) == [b"a", b"bb", b"ccc"]
    packed.offsets_of(both.data, both.offsets)
    assert joined(parts[:1]) is parts[0]


def test_answered_positions_from_first_and_count_or_an_older_list():
    assert list(answered_positions(pb.AppendResponse(first=7, count=3))) == [7, 8, 9]
    assert list(answered_positions(pb.AppendResponse(positions=[4, 5]))) == [4, 5]
    assert list(answered_positions(pb.AppendResponse())) == []


def test_an_older_servers_entries_become_runs_of_consecutive_positions():
    response = pb.ReadResponse(
        entries=[
            pb.Entry(position=3, value=b"a"),
            pb.Entry(position=4, value=b""),
            pb.Entry(position=6, value=b"c"),
        ]
    )
    runs = runs_of(response)
    assert [(r.first, values(r)) for r in runs] == [(3, [b"a", b""]), (6, [b"c"])]
    assert last_position(response) == 6
    assert list(pairs_of(response)) == [(3, b"a"), (4, b""), (6, b"c")]
    assert last_position(pb.ReadResponse()) is None


def action(position: int, kind: int = pb.APPEND, value: bytes = b"") -> pb.Action:
    return pb.Action(position=position, type=kind, value=value or b"v%d" % position)


def test_consecutive_append_actions_make_one_run_and_other_entries_split():
    records = [
        action(1),
        action(2),
        action(3, pb.NOP),
        action(4, pb.SESSION),
        action(5),
        action(6, pb.EPOCH),
        action(7),
        action(8),
    ]
    runs = read_runs(records, 1, 8)
    assert [(r.first, values(r)) for r in runs] == [
        (1, [b"v1", b"v2"]),
        (5, [b"v5"]),
        (7, [b"v7", b"v8"]),
    ]
    assert all(not r.HasField("head") for r in runs)
    assert end_of(records) == 8


def test_a_stored_run_passes_through_clipped_without_its_head():
    data, offsets = packed.pack([b"a", b"b", b"c", b"d"])
    head = pb.Action(type=pb.APPEND, promised=5, performed=5, learned=True)
    stored = packed.make_run(10, head, data, offsets)
    records: list[pb.Action | pb.Run] = [action(9), stored, action(14), action(15, pb.NOP)]
    runs = read_runs(records, 11, 15)
    assert [(r.first, values(r)) for r in runs] == [(11, [b"b", b"c", b"d"]), (14, [b"v14"])]
    assert all(not r.HasField("head") for r in runs)
    whole = read_runs([stored], 0, 100)
    assert [(r.first, values(r)) for r in whole] == [(10, [b"a", b"b", b"c", b"d"])]
    assert end_of([action(1), stored]) == 13


@pytest.mark.parametrize("first, last", [(1, 1), (2, 3), (0, 100)])
def test_runs_hold_exactly_the_append_positions_asked_for(first, last):
    records = [action(p, pb.APPEND if p % 3 else pb.NOP) for p in range(1, 10)]
    got = [
        (r.first + i, v) for r in read_runs(records, first, last) for i, v in enumerate(values(r))
    ]
    want = [(a.position, a.value) for a in records if a.type == pb.APPEND]
    assert got == [(p, v) for p, v in want if first <= p <= last]
