"""The batch rule of a fill (consensus.py), on hand-made promise answers: a client batch (one
`Append` call's entries) is re-proposed whole, in one write, or replaced by NOPs where it won
(docs/protocol.md, "Atomic batches")."""

from __future__ import annotations

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.consensus import (
    BatchKey,
    Elsewhere,
    FillRound,
    Lookup,
    Outcome,
    batch_of,
    broken_batches,
)

P = 10  # the fill's proposal
B = (3, 1, 1, 4)  # a batch placed by leader 1 at proposal 3 at positions 1..4


def entry(position: int, performed: int, batch: BatchKey = B, learned: bool = False) -> pb.Action:
    """Batch `batch`'s entry at `position` as a replica holds it."""
    origin_proposal, origin_leader, first, last = batch
    return pb.Action(
        position=position,
        type=pb.APPEND,
        value=f"{origin_leader}-{origin_proposal}-{position}".encode(),
        performed=performed,
        promised=performed,
        learned=learned,
        origin_proposal=origin_proposal,
        origin_leader=origin_leader,
        batch_first=first,
        batch_last=last,
    )


def single(position: int, performed: int, value: bytes = b"other") -> pb.Action:
    return pb.Action(
        position=position,
        type=pb.APPEND,
        value=value,
        performed=performed,
        origin_proposal=performed,
        origin_leader=2,
    )


def empty(position: int) -> pb.Action:
    return pb.Action(position=position)


def tombstone(position: int) -> pb.Action:
    return pb.Action(position=position, type=pb.NOP, tombstone=True, learned=True)


def nothing_elsewhere(position: int) -> Elsewhere:
    raise AssertionError(f"the rule asked about {position}, outside the answers")


def promised(fill: FillRound, *answers: list[pb.Action]) -> None:
    """A quorum (replicas 0, 1, ...) answers the current promise stage."""
    for replica, actions in enumerate(answers):
        response = pb.PromiseResponse(verdict=pb.ACCEPT, proposal=P, actions=actions)
        outcome = fill.add(replica, response)
    assert outcome == Outcome.ACCEPTED


def written(write: pb.WriteRequest | pb.PromiseRequest | None) -> dict[int, pb.Action]:
    assert isinstance(write, pb.WriteRequest) and write.proposal == P
    return {a.position: a for a in write.actions}


def is_entry_of(action: pb.Action, batch: BatchKey = B) -> bool:
    return action.type == pb.APPEND and batch_of(action) == batch


def test_a_batch_seen_whole_is_proposed_whole_in_one_write():
    fill = FillRound([1, 2, 3, 4], P, 3, 2, nothing_elsewhere)
    promised(fill, [entry(p, 3) for p in range(1, 5)], [empty(p) for p in range(1, 5)])
    chosen = written(fill.decide(0, ""))
    assert sorted(chosen) == [1, 2, 3, 4]
    assert all(is_entry_of(a) and a.value == entry(p, 3).value for p, a in chosen.items())


def test_a_batch_absent_at_one_position_is_replaced_by_nops():
    # The quorum's answers show the batch at 1..3, nothing at 4: it was chosen nowhere.
    fill = FillRound([1, 2, 3, 4], P, 3, 2, nothing_elsewhere)
    promised(fill, [entry(p, 3) for p in range(1, 4)] + [empty(4)], [empty(p) for p in range(1, 5)])
    chosen = written(fill.decide(0, ""))
    assert [chosen[p].type for p in range(1, 5)] == [pb.NOP] * 4
    assert all(batch_of(a) is None and not a.value for a in chosen.values())


def test_a_batch_beaten_at_one_position_gives_nops_where_it_won_only():
    # At 3 another value was accepted at a higher proposal: it keeps 3, the batch gets NOPs.
    fill = FillRound([1, 2, 3, 4], P, 3, 2, nothing_elsewhere)
    promised(fill, [entry(p, 3) for p in range(1, 5)], [empty(1), empty(2), single(3, 5)])
    chosen = written(fill.decide(0, ""))
    assert [chosen[p].type for p in (1, 2, 4)] == [pb.NOP] * 3
    assert chosen[3].value == b"other" and chosen[3].origin_proposal == 5


def test_two_batches_are_judged_apart():
    other = (4, 2, 5, 6)
    fill = FillRound([1, 2, 3, 4, 5, 6], P, 3, 2, nothing_elsewhere)
    promised(
        fill,
        [entry(p, 3) for p in range(1, 4)] + [empty(4)] + [entry(p, 4, other) for p in (5, 6)],
        [empty(p) for p in range(1, 7)],
    )
    chosen = written(fill.decide(0, ""))
    assert [chosen[p].type for p in range(1, 5)] == [pb.NOP] * 4
    assert is_entry_of(chosen[5], other) and is_entry_of(chosen[6], other)


def test_a_batch_crossing_the_round_end_is_promised_there_then_written_whole():
    fill = FillRound([1, 2], P, 3, 2, lambda p: Elsewhere.UNKNOWN)
    promised(fill, [entry(1, 3), entry(2, 3)], [empty(1), empty(2)])
    extension = fill.decide(0, "")
    assert isinstance(extension, pb.PromiseRequest)
    assert list(extension.positions) == [3, 4] and extension.proposal == P
    promised(fill, [entry(3, 3), entry(4, 3)], [empty(3), empty(4)])
    chosen = written(fill.decide(0, ""))
    assert sorted(chosen) == [1, 2, 3, 4] and all(is_entry_of(a) for a in chosen.values())
    assert fill.positions == [1, 2, 3, 4]


def test_an_extension_that_shows_the_batch_absent_gives_nops():
    fill = FillRound([1, 2], P, 3, 2, lambda p: Elsewhere.UNKNOWN)
    promised(fill, [entry(1, 3), entry(2, 3)], [empty(1), empty(2)])
    assert isinstance(fill.decide(0, ""), pb.PromiseRequest)
    promised(fill, [empty(3), empty(4)], [empty(3), empty(4)])  # another quorum
    chosen = written(fill.decide(0, ""))
    assert [chosen[p].type for p in range(1, 5)] == [pb.NOP] * 4


def test_extensions_repeat_while_batches_reach_further():
    further = (4, 2, 4, 6)
    fill = FillRound([1, 2], P, 3, 2, lambda p: Elsewhere.UNKNOWN)
    promised(fill, [entry(1, 3), entry(2, 3)], [empty(1), empty(2)])
    assert list(fill.decide(0, "").positions) == [3, 4]
    # At 4 a later batch won (higher proposal), reaching 6: B is broken, the new one is judged.
    promised(fill, [entry(3, 3), entry(4, 4, further)], [empty(3), empty(4)])
    assert list(fill.decide(0, "").positions) == [5, 6]
    promised(fill, [entry(5, 4, further), entry(6, 4, further)], [empty(5), empty(6)])
    chosen = written(fill.decide(0, ""))
    assert [chosen[p].type for p in range(1, 4)] == [pb.NOP] * 3
    assert all(is_entry_of(chosen[p], further) for p in range(4, 7))


def test_a_batch_starting_before_the_round_is_judged_on_what_was_settled_there():
    settled_nop: dict[int, BatchKey | Elsewhere | None] = {1: None, 2: None}
    fill = FillRound([3, 4], P, 3, 2, settled_nop.__getitem__)
    promised(fill, [entry(3, 3), entry(4, 3)], [empty(3), empty(4)])
    chosen = written(fill.decide(0, ""))
    assert [chosen[p].type for p in (3, 4)] == [pb.NOP] * 2

    settled_b: dict[int, BatchKey | Elsewhere | None] = {1: B, 2: B}  # learned as B
    fill = FillRound([3, 4], P, 3, 2, settled_b.__getitem__)
    promised(fill, [entry(3, 3), entry(4, 3)], [empty(3), empty(4)])
    chosen = written(fill.decide(0, ""))
    assert all(is_entry_of(chosen[p]) for p in (3, 4))


def test_learned_positions_are_adopted_and_the_rest_of_the_batch_written():
    fill = FillRound([1, 2, 3, 4], P, 3, 2, nothing_elsewhere)
    promised(
        fill,
        [entry(1, 3, learned=True)] + [entry(p, 3) for p in range(2, 5)],
        [empty(p) for p in range(1, 5)],
    )
    chosen = written(fill.decide(0, ""))
    assert sorted(chosen) == [2, 3, 4] and all(is_entry_of(a) for a in chosen.values())
    (adopted,) = fill.adopted
    assert adopted.position == 1 and is_entry_of(adopted)
    assert sorted(a.position for a in fill.chosen()) == [1, 2, 3, 4]


def test_a_learned_position_of_a_broken_batch_stays_learned():
    # Cannot arise under the rule (a learned entry means the batch was chosen), but a fill
    # must never write over a learned value whatever the answers say.
    fill = FillRound([1, 2, 3, 4], P, 3, 2, nothing_elsewhere)
    promised(
        fill,
        [entry(1, 3, learned=True), entry(2, 3), entry(3, 3), empty(4)],
        [empty(p) for p in range(1, 5)],
    )
    chosen = written(fill.decide(0, ""))
    assert sorted(chosen) == [2, 3, 4]
    assert [a.position for a in fill.adopted] == [1]


def test_tombstones_below_begin_do_not_break_a_batch():
    fill = FillRound([1, 2, 3, 4], P, 3, 2, nothing_elsewhere)
    promised(
        fill,
        [tombstone(1), tombstone(2), entry(3, 3), entry(4, 3)],
        [empty(p) for p in range(1, 5)],
    )
    chosen = written(fill.decide(0, ""))
    assert sorted(chosen) == [3, 4] and all(is_entry_of(a) for a in chosen.values())
    assert sorted(a.position for a in fill.adopted) == [1, 2]

    truncated: Lookup = lambda p: Elsewhere.TRUNCATED  # noqa: E731
    fill = FillRound([3, 4], P, 3, 2, truncated)
    promised(fill, [entry(3, 3), entry(4, 3)], [empty(3), empty(4)])
    chosen = written(fill.decide(0, ""))
    assert all(is_entry_of(chosen[p]) for p in (3, 4))


def test_single_entries_and_pre_batch_entries_are_batches_of_one():
    fill = FillRound([1, 2], P, 3, 2, nothing_elsewhere)
    promised(fill, [single(1, 3), empty(2)], [empty(1), empty(2)])
    chosen = written(fill.decide(0, ""))
    assert chosen[1].value == b"other" and chosen[2].type == pb.NOP
    assert batch_of(pb.Action(batch_first=0, batch_last=0)) is None
    assert batch_of(pb.Action(batch_first=5, batch_last=5)) is None


def test_the_split_fill_settles_each_position_on_its_own():
    # The test-only rule of before: the batch's entries are re-proposed where they won.
    fill = FillRound([1, 2, 3, 4], P, 3, 2)
    promised(fill, [entry(p, 3) for p in range(1, 4)] + [empty(4)], [empty(p) for p in range(1, 5)])
    chosen = written(fill.decide(0, ""))
    assert all(is_entry_of(chosen[p]) for p in (1, 2, 3)) and chosen[4].type == pb.NOP


def test_broken_batches_reports_unknown_positions_only_for_batches_still_whole():
    values = {1: entry(1, 3), 2: empty(2), 5: entry(5, 4, (4, 2, 5, 7))}
    broken, missing = broken_batches(values, lambda p: Elsewhere.UNKNOWN)
    assert broken == {B}  # 2 is empty: no need to look at 3 and 4
    assert missing == [6, 7]
