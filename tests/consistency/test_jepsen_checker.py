"""The linearizability checker (jepsen/checker, Porcupine with our log model) and the
direct checks on hand-built histories: it passes what a linearizable log may return and
fails each kind of wrong answer. That it *can* fail is what makes its passes mean something.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jepsen import checks, linearizability
from jepsen.history import (
    APPEND_EPOCH,
    APPEND_IDEMPOTENT,
    APPEND_IF_NEXT,
    FAIL,
    INFO,
    OK,
    READ_MIN_POSITION,
    TAKE_EPOCH,
    Op,
)


def append(process, invoke, complete, values, position=None, result=OK, error=""):
    positions = list(range(position, position + len(values))) if position is not None else None
    return Op(
        process,
        "append",
        invoke,
        complete,
        result,
        values=values,
        position=position,
        positions=positions if result == OK else None,
        error=error,
    )


def read(process, invoke, complete, entries, from_=None, result=OK):
    return Op(process, "read", invoke, complete, result, from_=from_, entries=entries)


def write(path: Path, ops: list[Op]) -> Path:
    path.write_text("".join(json.dumps(op.to_json()) + "\n" for op in ops))
    return path


def verdict(tmp_path: Path, ops: list[Op]) -> linearizability.Verdict:
    return linearizability.check(
        write(tmp_path / "history.jsonl", ops), tmp_path / "violation.html"
    )


# A linearizable history with everything the recorder produces: concurrent appends and
# reads, a batch, gaps (no-op entries of a new leader), a read from a position, a failed
# append (dropped), an unknown append a read saw, and one nobody saw.
LINEARIZABLE = [
    append(0, 10, 20, ["a"], position=1),
    read(1, 15, 18, []),  # concurrent with append(a): may miss it
    append(1, 19, 30, ["b", "c"], position=2),
    read(2, 21, 25, [(1, "a")]),  # concurrent with the batch: may miss it
    append(2, 26, 90, ["d"], result=INFO, error="OutcomeUnknown"),  # seen below: happened
    append(0, 31, 40, ["e"], position=6),  # gaps at 4, 5: a new leader's no-ops
    read(1, 41, 45, [(1, "a"), (2, "b"), (3, "c"), (6, "e")]),  # before d took effect
    append(0, 46, 50, ["x"], result=FAIL, error="Unavailable: not attempted"),
    read(1, 50, 55, [(6, "e"), (7, "d")], from_=5),
    append(0, 56, 60, ["f"], result=INFO, error="OutcomeUnknown"),  # never seen: a no-op
    read(1, 61, 70, [(1, "a"), (2, "b"), (3, "c"), (6, "e"), (7, "d")]),
]


def test_the_checker_is_built_and_cached():
    first = linearizability.build()
    assert first.exists()
    assert linearizability.build() == first


def test_a_linearizable_history_passes(tmp_path):
    result = verdict(tmp_path, LINEARIZABLE)
    assert result.verdict == "linearizable" and result.status == linearizability.LINEARIZABLE
    assert result.operations == len(LINEARIZABLE) - 1  # the failed append is dropped
    assert result.visualization is None  # only written for a violation


def test_an_unknown_batch_seen_only_by_its_tail_is_placed_whole(tmp_path):
    ops = [
        append(0, 10, 20, ["a"], position=1),
        append(1, 21, 99, ["b", "c", "d"], result=INFO, error="OutcomeUnknown"),
        read(2, 30, 40, [(3, "c"), (4, "d")], from_=3),
        read(2, 41, 50, [(1, "a"), (2, "b"), (3, "c"), (4, "d")]),
    ]
    assert verdict(tmp_path, ops).status == linearizability.LINEARIZABLE
    torn = [*ops[:3], read(2, 41, 50, [(1, "a"), (3, "c"), (4, "d")])]
    assert verdict(tmp_path, torn).status == linearizability.VIOLATION


def test_a_stale_read_fails(tmp_path):
    ops = [
        append(0, 10, 20, ["a"], position=1),
        append(0, 21, 30, ["b"], position=2),
        read(1, 31, 40, [(1, "a")]),  # began after b was acknowledged, misses it
    ]
    result = verdict(tmp_path, ops)
    assert result.verdict == "not linearizable" and result.status == linearizability.VIOLATION
    assert result.visualization is not None and "<html" in result.visualization.read_text()
    assert [s.missed for s in checks.stale_reads(ops)] == ["b"]


def test_a_read_going_back_in_time_fails(tmp_path):
    # Two reads after a concurrent append: once one saw it, a later one must too.
    ops = [
        append(0, 10, 100, ["a"], position=1),
        read(1, 20, 30, [(1, "a")]),
        read(1, 31, 40, []),
    ]
    assert verdict(tmp_path, ops).status == linearizability.VIOLATION


def test_a_duplicated_value_fails(tmp_path):
    ops = [
        append(0, 10, 20, ["a"], position=1),
        read(1, 21, 30, [(1, "a"), (2, "a")]),
    ]
    assert verdict(tmp_path, ops).status == linearizability.VIOLATION
    assert checks.reads_are_sane(ops) != []
    assert checks.final_log_holds_the_appends(ops, [(1, "a"), (2, "a")]) != []


def test_a_read_of_a_value_never_appended_fails(tmp_path):
    ops = [
        append(0, 10, 20, ["a"], position=1),
        read(1, 21, 30, [(1, "a"), (2, "ghost")]),
    ]
    assert verdict(tmp_path, ops).status == linearizability.VIOLATION
    assert checks.reads_are_sane(ops) == ["read by 1 at 21: ghost was never appended"]


def test_a_failed_append_seen_by_a_read_fails(tmp_path):
    # A definite failure did not happen: a read that shows it is wrong.
    ops = [
        append(0, 10, 20, ["a"], result=FAIL, error="Unavailable"),
        read(1, 21, 30, [(1, "a")]),
    ]
    assert verdict(tmp_path, ops).status == linearizability.VIOLATION


def test_a_torn_batch_fails(tmp_path):
    ops = [
        append(0, 10, 20, ["a", "b"], position=1),
        read(1, 21, 30, [(1, "a")]),
    ]
    assert verdict(tmp_path, ops).status == linearizability.VIOLATION
    assert checks.final_log_holds_the_appends(ops, [(1, "a"), (3, "b")]) != []


def test_appends_out_of_real_time_order_fail(tmp_path):
    ops = [
        append(0, 10, 20, ["a"], position=5),
        append(1, 21, 30, ["b"], position=3),  # began after a was acknowledged at 5
    ]
    assert verdict(tmp_path, ops).status == linearizability.VIOLATION
    assert len(checks.appends_in_real_time_order(ops)) == 1


def test_replicas_disagreeing_on_a_position_are_reported():
    assert checks.replicas_agree([[(1, "a"), (2, "b")], [(1, "a")], None]) == []
    assert checks.replicas_agree([[(1, "a"), (2, "b")], [(1, "a"), (2, "c")]]) == [
        "position 2: b on replica 0, c on replica 1"
    ]


def test_bad_input_is_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"process": 0, "f": "delete", "invoke": 1, "complete": 2, "result": "ok"}\n')
    with pytest.raises(ValueError, match="not an append, take-epoch or read kind"):
        linearizability.check(bad)


# ---- batches: whole and contiguous, in every log and every read ----------------------------


def test_an_acknowledged_batch_must_sit_whole_at_its_positions():
    ops = [append(0, 10, 20, ["a", "b", "c"], position=4)]
    assert checks.final_log_holds_the_appends(ops, [(4, "a"), (5, "b"), (6, "c")]) == []
    assert checks.final_log_holds_the_appends(ops, [(4, "a"), (6, "b"), (7, "c")]) != []
    assert checks.final_log_holds_the_appends(ops, [(4, "b"), (5, "a"), (6, "c")]) != []
    assert checks.final_log_holds_the_appends(ops, [(4, "a"), (5, "b")]) != []


def test_a_batch_of_unknown_outcome_is_whole_or_absent():
    ops = [append(1, 10, 90, ["x", "y", "z"], result=INFO, error="OutcomeUnknown")]
    assert checks.final_log_holds_the_appends(ops, []) == []
    assert checks.final_log_holds_the_appends(ops, [(7, "x"), (8, "y"), (9, "z")]) == []
    # Its tail adopted by a fill while its head was overwritten: torn.
    (problem,) = checks.final_log_holds_the_appends(ops, [(9, "z")])
    assert "partly present" in problem
    (problem,) = checks.final_log_holds_the_appends(ops, [(7, "x"), (9, "y"), (10, "z")])
    assert "split" in problem


def test_a_failed_batch_must_be_absent_even_whole():
    ops = [append(1, 10, 20, ["x", "y"], result=FAIL, error="Unavailable")]
    (problem,) = checks.final_log_holds_the_appends(ops, [(1, "x"), (2, "y")])
    assert "failed but is in the log" in problem


def test_a_lagging_replica_may_hold_a_prefix_but_not_a_torn_batch():
    ops = [
        append(0, 10, 20, ["a"], position=1),
        append(0, 21, 30, ["b", "c"], position=2),
        append(1, 31, 99, ["x", "y", "z"], result=INFO, error="OutcomeUnknown"),
    ]

    def lagging(log):
        return checks.final_log_holds_the_appends(ops, log, lagging=True)

    acked = [(1, "a"), (2, "b"), (3, "c")]
    assert lagging([(1, "a")]) == []
    assert lagging([(1, "a"), (2, "b")]) == []
    assert lagging([*acked, (4, "x")]) == []  # the unknown batch cut at the log's end
    assert lagging([(1, "a"), (3, "c")]) != []
    assert lagging([*acked, (5, "y")]) != []
    assert checks.final_log_holds_the_appends(ops, [(1, "a"), (2, "b")]) != []  # not lagging


def test_replica_logs_are_checked_like_the_final_log():
    ops = [append(1, 10, 99, ["x", "y"], result=INFO, error="OutcomeUnknown")]
    problems = checks.all_problems(ops, [], [[], [(2, "y")], None])
    assert problems["replica logs"] == [
        "replica 1: append ['x', 'y'] (info) is partly present: [None, 2]"
    ]
    assert problems["final log"] == []


def test_a_read_must_see_a_batch_whole():
    batch = append(0, 10, 20, ["a", "b", "c"], position=2)
    whole = read(1, 21, 30, [(1, "o"), (2, "a"), (3, "b"), (4, "c")])
    tail = read(1, 21, 30, [(3, "b"), (4, "c")], from_=3)  # `from` cuts it: fine
    torn = read(1, 21, 30, [(1, "o"), (2, "a"), (4, "c")])
    split = read(1, 21, 30, [(2, "a"), (3, "b"), (5, "c")])
    other = append(2, 5, 8, ["o"], position=1)
    assert checks.reads_see_batches_whole([other, batch, whole, tail]) == []
    assert len(checks.reads_see_batches_whole([other, batch, torn])) == 1
    assert len(checks.reads_see_batches_whole([other, batch, split])) == 1
    # Unknown outcome: the same rule (a read shows it whole or not at all).
    unknown = append(0, 10, 99, ["a", "b", "c"], result=INFO, error="OutcomeUnknown")
    assert len(checks.reads_see_batches_whole([other, unknown, torn])) == 1
    assert verdict_of([other, unknown, torn]) == linearizability.VIOLATION


def verdict_of(ops: list[Op]) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return linearizability.check(write(Path(tmp) / "history.jsonl", ops)).status


def kind(op: Op, f: str, **fields: object) -> Op:
    """`op` recorded as another operation kind, with that kind's fields."""
    op.f = f
    for name, value in fields.items():
        setattr(op, name, value)
    return op


def test_every_append_kind_is_an_append_to_the_model(tmp_path):
    ops = [
        kind(append(0, 10, 20, ["a"], position=1), APPEND_IDEMPOTENT),
        kind(append(1, 21, 30, ["b", "c"], position=3), APPEND_IF_NEXT, if_next=3),
        kind(append(2, 31, 40, ["d"], position=6), APPEND_EPOCH, epoch=1),
        read(1, 41, 45, [(1, "a"), (3, "b"), (4, "c"), (6, "d")]),
    ]
    assert verdict(tmp_path, ops).verdict == "linearizable"
    assert not any(checks.all_problems(ops, ops[-1].entries, []).values())


def test_an_if_next_append_acknowledged_elsewhere_fails(tmp_path):
    ops = [
        append(0, 10, 20, ["a"], position=1),
        kind(append(1, 21, 30, ["b"], position=3), APPEND_IF_NEXT, if_next=2),
        read(1, 41, 45, [(1, "a"), (3, "b")]),
    ]
    assert verdict(tmp_path, ops).verdict != "linearizable"
    assert len(checks.conditional_appends_land_where_they_said(ops)) == 1


def test_a_refused_conditional_append_must_be_absent():
    refused = kind(append(1, 21, 30, ["b"], result=FAIL), APPEND_IF_NEXT, if_next=2)
    ops = [append(0, 10, 20, ["a"], position=1), refused]
    assert checks.final_log_holds_the_appends(ops, [(1, "a")]) == []
    assert len(checks.final_log_holds_the_appends(ops, [(1, "a"), (2, "b")])) == 1


def test_an_append_of_a_fenced_epoch_after_the_newer_epoch_is_reported():
    take_1 = Op(0, TAKE_EPOCH, 1, 2, OK, epoch=1, position=1)
    take_2 = Op(1, TAKE_EPOCH, 3, 4, OK, epoch=2, position=5)
    before = kind(append(0, 5, 6, ["a"], position=3), APPEND_EPOCH, epoch=1)
    after = kind(append(0, 7, 8, ["b"], position=6), APPEND_EPOCH, epoch=1)
    newer = kind(append(1, 7, 8, ["c"], position=7), APPEND_EPOCH, epoch=2)
    assert checks.epochs_fence([take_1, take_2, before, newer]) == []
    (problem,) = checks.epochs_fence([take_1, take_2, before, after, newer])
    assert "epoch 1 acknowledged at [6] after epoch 2 was taken at 5" in problem
    backwards = Op(2, TAKE_EPOCH, 3, 4, OK, epoch=3, position=4)
    assert len(checks.epochs_fence([take_1, take_2, backwards])) == 1


def test_a_min_position_read_must_hold_its_bound_and_the_final_log():
    final = [(1, "a"), (2, "b"), (4, "c")]

    def stale(entries: list[tuple[int, str]], bound: int) -> Op:
        return kind(read(3, 1, 2, entries, from_=0), READ_MIN_POSITION, min_position=bound)

    assert checks.min_position_reads([stale([(1, "a"), (2, "b")], 2)], final) == []
    assert len(checks.min_position_reads([stale([(1, "a")], 2)], final)) == 1  # stale
    assert len(checks.min_position_reads([stale([(1, "a"), (4, "c")], 4)], final)) == 1  # a hole
    assert len(checks.min_position_reads([stale([(1, "a"), (2, "x")], 2)], final)) == 1
    # Not linearizable, so Porcupine leaves it out: a read that is stale by then is fine.
    late = [append(0, 10, 20, ["a"], position=1), stale([], 0)]
    late[1].invoke, late[1].complete = 30, 40
    assert verdict_of(late) == linearizability.LINEARIZABLE


# ---- the registers model (rlog.state's versioned variables) ---------------------------------


def register_ops(path: Path, ops: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(op) + "\n" for op in ops))
    return path


def fetch(process, invoke, complete, name, version, value):
    return {
        "process": process,
        "f": "fetch",
        "name": name,
        "invoke": invoke,
        "complete": complete,
        "result": "ok",
        "version": version,
        "value": value,
    }


def store(process, invoke, complete, name, expect, value, stored=None, version=None):
    op = {
        "process": process,
        "f": "store",
        "name": name,
        "expect": expect,
        "value": value,
        "invoke": invoke,
        "complete": complete,
        "result": "info" if stored is None else "ok",
    }
    if stored is not None:
        op["stored"] = stored
    if version is not None:
        op["version"] = version
    return op


def test_registers_accept_compare_and_set_with_an_unknown_store(tmp_path):
    history = [
        fetch(0, 1, 2, "a", 0, ""),
        store(0, 3, 6, "a", 0, "x", stored=True, version=1),
        store(1, 4, 7, "a", 0, "y", stored=False),  # lost the race: refused
        store(2, 8, 9, "a", 1, "z"),  # unknown outcome, later seen
        fetch(1, 10, 11, "a", 4, "z"),
        store(1, 12, 13, "a", 1, "w", stored=False),
        fetch(0, 1, 2, "b", 0, ""),  # another register, its own partition
    ]
    verdict = linearizability.check(register_ops(tmp_path / "h.jsonl", history), model="registers")
    assert verdict.linearizable, verdict.verdict
    assert verdict.operations == 7


@pytest.mark.parametrize(
    "history",
    [
        # Two stores against the same version both succeed: a lost update.
        [
            store(0, 1, 4, "a", 0, "x", stored=True, version=1),
            store(1, 2, 5, "a", 0, "y", stored=True, version=2),
        ],
        # A fetch after a store completed does not see it: a stale read.
        [
            store(0, 1, 2, "a", 0, "x", stored=True, version=1),
            fetch(1, 3, 4, "a", 0, ""),
        ],
        # A store refused although nothing changed the version it named.
        [fetch(0, 1, 2, "a", 0, ""), store(0, 3, 4, "a", 0, "x", stored=False)],
    ],
    ids=["lost-update", "stale-fetch", "refused-for-nothing"],
)
def test_registers_refuse_each_wrong_answer(tmp_path, history):
    verdict = linearizability.check(register_ops(tmp_path / "h.jsonl", history), model="registers")
    assert verdict.status == linearizability.VIOLATION, verdict.verdict
