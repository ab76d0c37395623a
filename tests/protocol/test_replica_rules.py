"""Every acceptor/learner rule of the pure replica core (rlog.protocol.replica)."""

from __future__ import annotations

import pytest

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore
from rlog.storage.memory import MemoryStorage


def core(status: int = pb.VOTING) -> ReplicaCore:
    storage = MemoryStorage()
    replica = ReplicaCore(storage)
    apply(replica, replica.set_status(status))
    return replica


def apply(replica: ReplicaCore, batch) -> None:
    if batch is not None:
        replica.storage.apply(batch)
        replica.persisted(batch)


def promise(replica, proposal, positions=()):
    reply = replica.on_promise(pb.PromiseRequest(proposal=proposal, positions=list(positions)))
    apply(replica, reply.persist)
    return reply.response


def write(replica, proposal, *values, first=1):
    actions = [pb.Action(position=first + i, type=pb.APPEND, value=v) for i, v in enumerate(values)]
    reply = replica.on_write(pb.WriteRequest(proposal=proposal, actions=actions))
    apply(replica, reply.persist)
    return reply.response


def learn_range(replica, proposal, first, last):
    apply(
        replica,
        replica.on_learned(
            pb.LearnedRequest(proposal=proposal, ranges=[pb.PositionRange(first=first, last=last)])
        ),
    )


def reopen(replica: ReplicaCore) -> ReplicaCore:
    return ReplicaCore(replica.storage)


def test_implicit_promise_ordering():
    r = core()
    assert promise(r, 2).verdict == pb.ACCEPT
    rejected = promise(r, 2)
    assert rejected.verdict == pb.REJECT and rejected.proposal == 2
    rejected = promise(r, 1)
    assert rejected.verdict == pb.REJECT and rejected.proposal == 2
    assert promise(r, 3).verdict == pb.ACCEPT
    assert r.promised == 3


def test_implicit_promise_reports_end():
    r = core()
    promise(r, 1)
    assert write(r, 1, b"a", b"b", b"c").verdict == pb.ACCEPT
    response = promise(r, 2)
    assert response.verdict == pb.ACCEPT and response.end == 3


def test_promise_is_persisted_before_reply():
    r = core()
    reply = r.on_promise(pb.PromiseRequest(proposal=5))
    assert reply.persist is not None and reply.persist.sync
    assert reply.persist.metadata.promised == 5


def test_explicit_promise_returns_record_before_promise():
    r = core()
    promise(r, 1)
    write(r, 1, b"x", first=4)
    response = promise(r, 2, [4, 5])
    assert response.verdict == pb.ACCEPT
    by_pos = {a.position: a for a in response.actions}
    assert by_pos[4].value == b"x" and by_pos[4].performed == 1 and by_pos[4].promised == 1
    assert by_pos[5].performed == 0
    assert r.get(4).promised == 2 and r.get(5).promised == 2


def test_explicit_promise_needs_more_than_implicit_promise():
    r = core()
    promise(r, 5)
    response = promise(r, 5, [9])
    assert response.verdict == pb.REJECT and response.proposal == 5
    assert promise(r, 6, [9]).verdict == pb.ACCEPT


def test_explicit_promise_batch_is_all_or_nothing():
    r = core()
    promise(r, 1)
    assert promise(r, 7, [3]).verdict == pb.ACCEPT
    response = promise(r, 5, [2, 3])
    assert response.verdict == pb.REJECT and response.proposal == 7
    assert r.get(2) is None  # nothing persisted for the other position


def test_explicit_promise_on_learned_position_returns_it():
    r = core()
    promise(r, 1)
    write(r, 1, b"v")
    learn_range(r, 1, 1, 1)
    response = promise(r, 1, [1])  # even a low proposal: learned is final
    assert response.verdict == pb.ACCEPT
    assert response.actions[0].learned and response.actions[0].value == b"v"


def test_write_accepts_equal_rejects_lower():
    r = core()
    promise(r, 3)
    assert write(r, 3, b"a").verdict == pb.ACCEPT
    rejected = write(r, 2, b"b", first=2)
    assert rejected.verdict == pb.REJECT and rejected.proposal == 3
    assert r.get(2) is None
    assert write(r, 4, b"c", first=2).verdict == pb.ACCEPT


def test_write_respects_explicit_promise_on_record():
    r = core()
    promise(r, 1)
    promise(r, 9, [5])
    rejected = write(r, 1, b"x", first=5)
    assert rejected.verdict == pb.REJECT and rejected.proposal == 9


def test_write_to_learned_position_same_value_ok_other_value_rejected():
    r = core()
    promise(r, 1)
    write(r, 1, b"v")
    learn_range(r, 1, 1, 1)
    assert write(r, 1, b"v").verdict == pb.ACCEPT
    assert write(r, 2, b"other").verdict == pb.REJECT
    assert r.get(1).value == b"v"


def test_write_to_learned_position_of_identical_content_from_another_write_rejected():
    """The same content is not the same entry: a write repeating a learned value counts as
    accepted only if it is the write that value came from (its origin), else two requests
    appending identical payloads could both be told they own the position."""
    r = core()
    promise(r, 1)

    def entry(origin_proposal, origin_leader):
        action = pb.Action(position=1, type=pb.APPEND, value=b"v")
        action.origin_proposal, action.origin_leader = origin_proposal, origin_leader
        return action

    apply(r, r.on_write(pb.WriteRequest(proposal=1, actions=[entry(1, 0)])).persist)
    learn_range(r, 1, 1, 1)
    assert r.get(1).origin_proposal == 1
    same = r.on_write(pb.WriteRequest(proposal=1, actions=[entry(1, 0)]))
    assert same.response.verdict == pb.ACCEPT and same.persist is None
    for origin in [(2, 1), (1, 1), (2, 0), (0, 0)]:
        other = r.on_write(pb.WriteRequest(proposal=1, actions=[entry(*origin)]))
        assert other.response.verdict == pb.REJECT, origin
    assert r.get(1).origin_proposal == 1 and r.get(1).origin_leader == 0


def test_a_fill_without_a_learned_session_entrys_check_is_the_same_write():
    """A replica that predates session secrets fills a SESSION entry without its check (it
    copies the fields it knows): an upgraded replica that learned the entry takes that
    write as the same one (same origin), and keeps the check it learned."""
    r = core()
    promise(r, 1)
    session = pb.Action(position=1, type=pb.SESSION, origin_proposal=1, session_check=b"c" * 32)
    apply(r, r.on_write(pb.WriteRequest(proposal=1, actions=[session])).persist)
    learn_range(r, 1, 1, 1)
    old_fill = pb.Action(position=1, type=pb.SESSION, origin_proposal=1)
    reply = r.on_write(pb.WriteRequest(proposal=2, actions=[old_fill]))
    assert reply.response.verdict == pb.ACCEPT and reply.persist is None
    assert r.get(1).session_check == b"c" * 32


@pytest.mark.parametrize("status", [pb.EMPTY, pb.STARTING, pb.RECOVERING])
def test_not_voting_ignores_promise_and_write_but_applies_learned(status):
    r = core(status)
    assert promise(r, 1).verdict == pb.IGNORED
    assert promise(r, 1, [1]).verdict == pb.IGNORED
    assert write(r, 1, b"a").verdict == pb.IGNORED
    action = pb.Action(position=1, type=pb.APPEND, value=b"z")
    apply(r, r.on_learned(pb.LearnedRequest(actions=[action])))
    assert r.is_learned(1) and r.get(1).value == b"z"


def test_learned_range_only_marks_matching_performed():
    r = core()
    promise(r, 1)
    write(r, 1, b"a", b"b")  # positions 1, 2 at proposal 1
    learn_range(r, 2, 1, 2)  # proposal 2 wrote these elsewhere: not ours to mark
    assert not r.is_learned(1)
    learn_range(r, 1, 1, 2)
    assert r.is_learned(1) and r.is_learned(2)


def test_learned_contiguity_and_restore_from_disk():
    r = core()
    promise(r, 1)
    write(r, 1, b"n", first=0)
    write(r, 1, b"a", b"b", b"c", first=1)
    learn_range(r, 1, 0, 1)
    learn_range(r, 1, 3, 3)
    assert r.learned == 1 and r.is_learned(3) and not r.is_learned(2)
    again = reopen(r)
    assert again.promised == 1 and again.status == pb.VOTING
    assert again.get(3).value == b"c"
    assert again.is_learned(1)
    assert not again.is_learned(2)
    assert list(again.unlearned(0, 4)) in ([2, 3, 4], [2, 4])


def test_truncate_learned_moves_begin_and_deletes():
    r = core()
    promise(r, 1)
    write(r, 1, b"a", b"b", b"c", first=1)
    truncate = pb.Action(position=4, type=pb.TRUNCATE, truncate_to=3)
    r_reply = r.on_write(pb.WriteRequest(proposal=1, actions=[truncate]))
    apply(r, r_reply.persist)
    learn_range(r, 1, 1, 4)
    assert r.begin == 3
    assert r.storage.get(1) is None and r.storage.get(2) is None
    assert r.get(3).value == b"c"
    # Promise below begin: a learned tombstone.
    response = promise(r, 5, [1])
    assert response.actions[0].tombstone and response.actions[0].learned
    assert response.begin == 3
    assert reopen(r).begin == 3


def test_learned_tombstone_moves_begin():
    r = core()
    action = pb.Action(position=7, type=pb.NOP, tombstone=True)
    apply(r, r.on_learned(pb.LearnedRequest(actions=[action])))
    assert r.begin == 8
    assert reopen(r).begin == 8


def test_write_below_begin_nop_accepted_value_rejected():
    r = core()
    apply(
        r,
        r.on_learned(
            pb.LearnedRequest(actions=[pb.Action(position=5, type=pb.TRUNCATE, truncate_to=5)])
        ),
    )
    promise(r, 1)
    ok = r.on_write(pb.WriteRequest(proposal=1, actions=[pb.Action(position=2, type=pb.NOP)]))
    assert ok.response.verdict == pb.ACCEPT
    bad = r.on_write(
        pb.WriteRequest(proposal=1, actions=[pb.Action(position=2, type=pb.APPEND, value=b"x")])
    )
    assert bad.response.verdict == pb.REJECT


@pytest.mark.parametrize("position", [2**31 - 1, 2**31, 2**32 - 1, 2**32, 10**10, 2**63])
def test_large_positions_round_trip(position):
    r = core()
    # A log that far along has truncated its prefix: a learned tombstone just below.
    apply(
        r,
        r.on_learned(
            pb.LearnedRequest(
                actions=[pb.Action(position=position - 1, type=pb.NOP, tombstone=True)]
            )
        ),
    )
    assert r.begin == position
    promise(r, 1)
    assert write(r, 1, b"big", first=position).verdict == pb.ACCEPT
    learn_range(r, 1, position, position)
    assert r.learned == position
    again = reopen(r)
    assert again.get(position).value == b"big" and again.get(position).learned
    assert again.end == position
