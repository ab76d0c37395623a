"""Fetch answers (rlog/runtime/fetch.py): built as bytes, each record serialized alone and
joined, they must parse as the FetchResponse protobuf would have built; served from a real
replica core over LMDB on disk, bounded in bytes and positions, in order, learned only."""

from __future__ import annotations

from pathlib import Path

import pytest
from replica_runs import learn_range, run_of, write_run

from rlog.packed import run_bytes, run_count
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.records import span
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.fetch import FETCH_CHUNK_BYTES, answer, fetch_answers, lane_answers
from rlog.runtime.protowire import varint
from rlog.storage import open_storage

VALUE = 4096
PER_RUN = 256  # 1 MiB runs, as a client's batch of 256 x 4 KiB stores them


def test_varint_is_protobufs():
    assert varint(0) == b"\x00"
    for n in (1, 127, 128, 300, 16383, 16384, 2**21, 2**32 + 5, 2**63):
        message = pb.FetchRequest(to=n)  # field 2, varint: tag 0x10, then n's varint
        assert message.SerializeToString() == b"\x10" + varint(n)


def test_answer_parses_as_the_response_protobuf_builds():
    records: list[pb.Action | pb.Run] = [
        pb.Action(position=3, type=pb.APPEND, value=b"a" * 300, learned=True, performed=2),
        run_of(4, [b"x" * 200, b"", b"y" * 70_000]),
        pb.Action(position=7, type=pb.NOP, learned=True),
        run_of(8, [bytes([i]) * i for i in range(50)]),
    ]
    built = pb.FetchResponse(begin=3)
    for record in records:
        (built.runs if isinstance(record, pb.Run) else built.actions).append(record)
    parsed = pb.FetchResponse.FromString(answer(3, records))
    assert parsed == built
    assert pb.FetchResponse.FromString(answer(0, [])) == pb.FetchResponse()
    assert pb.FetchResponse.FromString(answer(9, [])) == pb.FetchResponse(begin=9)


@pytest.fixture
def replica(tmp_path: Path):
    storage = open_storage(tmp_path / "data", "lmdb")
    core = ReplicaCore(storage)
    batch = core.set_status(pb.VOTING)
    storage.apply(batch)
    core.persisted(batch)
    yield core
    storage.close()


def fill(core: ReplicaCore, runs: int, first: int = 1) -> list[pb.Run]:
    """`runs` runs of PER_RUN values written and persisted at proposal 1 (not learned)."""
    written = []
    for n in range(runs):
        start = first + n * PER_RUN
        values = [f"{start + i}:".encode().ljust(VALUE, b".") for i in range(PER_RUN)]
        run = run_of(start, values)
        assert write_run(core, 1, run).response.verdict == pb.ACCEPT
        written.append(run)
    return written


def served(core: ReplicaCore, first: int, to: int, max_actions: int) -> list[pb.FetchResponse]:
    request = pb.FetchRequest(**{"from": first, "to": to, "max_actions": max_actions})
    return [pb.FetchResponse.FromString(raw) for raw in fetch_answers(core, request)]


def values_of(responses: list[pb.FetchResponse], learned: bool = True) -> dict[int, bytes]:
    out = {}
    for response in responses:
        assert not response.actions
        for run in response.runs:
            assert run.head.learned == learned
            offsets = [
                int.from_bytes(run.offsets[i : i + 4], "little")
                for i in range(0, len(run.offsets), 4)
            ]
            for i in range(run_count(run)):
                out[run.first + i] = run.data[offsets[i] : offsets[i + 1]]
    return out


def test_learned_runs_are_served_whole_in_bounded_answers(replica: ReplicaCore):
    written = fill(replica, 12)
    learn_range(replica, 1, 1, 12 * PER_RUN)
    last = 12 * PER_RUN
    responses = served(replica, 1, last, last)
    assert len(responses) > 1
    for response in responses:
        assert sum(run_bytes(r) for r in response.runs) <= FETCH_CHUNK_BYTES
        assert response.begin == replica.begin
    want = {}
    for run in written:
        want.update(values_of([pb.FetchResponse(runs=[run])], learned=False))
    assert values_of(responses) == want
    # The stored runs go out as they were stored, one run per client batch.
    assert [span(r) for response in responses for r in response.runs] == [span(r) for r in written]


def test_an_answer_stops_at_max_actions_at_the_range_and_at_the_first_unlearned(
    replica: ReplicaCore,
):
    fill(replica, 4)
    learn_range(replica, 1, 1, 2 * PER_RUN + 10)  # learned up to 10 values into the third run
    got = values_of(served(replica, 1, 4 * PER_RUN, 4 * PER_RUN))
    assert sorted(got) == list(range(1, 2 * PER_RUN + 11))
    got = values_of(served(replica, 100, 4 * PER_RUN, 300))  # clipped runs at both ends
    assert sorted(got) == list(range(100, 400))
    got = values_of(served(replica, 1, 50, 4096))
    assert sorted(got) == list(range(1, 51))
    nothing = served(replica, 2 * PER_RUN + 11, 4 * PER_RUN, 4096)
    assert len(nothing) == 1 and not nothing[0].runs and not nothing[0].actions


def lane_served(
    core: ReplicaCore, first: int, to: int, max_actions: int, max_bytes: int, request_id: int = 7
) -> pb.FetchAnswers:
    request = pb.FetchRequest(to=to, max_actions=max_actions, id=request_id, max_bytes=max_bytes)
    setattr(request, "from", first)
    return pb.FetchAnswers.FromString(b"".join(lane_answers(core, request)))


def test_a_lane_answer_holds_the_answers_a_fetch_call_streams(replica: ReplicaCore):
    fill(replica, 12)
    learn_range(replica, 1, 1, 12 * PER_RUN + 1)  # all but nothing: up to the end
    last = 12 * PER_RUN
    for first, to, max_actions in ((1, last, last), (100, last - 7, 2000), (1, 50, 4096)):
        answers = lane_served(replica, first, to, max_actions, 1 << 40)
        assert answers.id == 7 and not answers.cut
        assert list(answers.answers) == served(replica, first, to, max_actions)
    # nothing learned there: one empty answer, as a call gets
    empty = lane_served(replica, last + 1, last + 50, 4096, 1 << 40)
    assert list(empty.answers) == served(replica, last + 1, last + 50, 4096)
    assert len(empty.answers) == 1 and not empty.answers[0].runs and not empty.cut


def test_a_lane_answer_stops_at_max_bytes_and_says_it_was_cut(replica: ReplicaCore):
    fill(replica, 12)  # 12 runs of 1 MiB: answers of FETCH_CHUNK_BYTES (4 runs) each
    learn_range(replica, 1, 1, 12 * PER_RUN)
    last = 12 * PER_RUN
    whole = served(replica, 1, last, last)
    assert len(whole) == 3
    cut = lane_served(replica, 1, last, last, FETCH_CHUNK_BYTES + 1)
    assert cut.cut and list(cut.answers) == whole[:2]  # the answer that passes the bound is in
    exact = lane_served(replica, 1, last, last, FETCH_CHUNK_BYTES)
    assert exact.cut and list(exact.answers) == whole[:1]
    # reaching the bound with the request's last answer is not a cut
    to_end = lane_served(replica, 1, last, last, 3 * FETCH_CHUNK_BYTES)
    assert not to_end.cut and list(to_end.answers) == whole
    # a bound the lane caps: at most LANE_MAX_BYTES past the first answer
    capped = lane_served(replica, 1, last, last, 0)
    assert list(capped.answers) == whole and not capped.cut
