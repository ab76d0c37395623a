"""The Mesos replicated log's coordinator test scenarios, replayed on the pure core."""

from __future__ import annotations

import pytest
from paxos_sim import Sim, Violation, is_learned_message, run

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import FailureKind, Phase


def elected(sim: Sim, c: int) -> None:
    sim.elect(c)
    run(sim)
    assert sim.coords[c].leading


def test_first_election_fills_position_zero_with_nop():
    sim = Sim(3, 1)
    elected(sim, 0)
    for core in sim.cores:
        action = core.get(0)
        assert action.type == pb.NOP and core.is_learned(0)
    assert sim.coords[0].next_position == 1


def test_failover_to_a_second_coordinator_keeps_every_append():
    sim = Sim(3, 2)
    elected(sim, 0)
    sim.propose(0, 5)
    run(sim)
    assert sorted(sim.acknowledged) == [1, 2, 3, 4, 5]
    elected(sim, 1)  # the second coordinator takes over above the first one's proposal
    assert sim.coords[1].proposal > sim.coords[0].proposal
    assert sim.coords[1].next_position == 6
    sim.propose(1, 2)
    run(sim)
    assert sorted(sim.acknowledged) == [1, 2, 3, 4, 5, 6, 7]
    sim.check_acknowledged()


def test_a_demoted_coordinators_append_fails():
    sim = Sim(3, 2)
    elected(sim, 0)
    elected(sim, 1)
    assert sim.coords[0].leading  # it does not know it was superseded yet
    sim.propose(0, 1)
    run(sim)
    assert sim.coords[0].phase == Phase.IDLE
    assert not sim.acknowledged  # never reported as appended
    (failure,) = sim.failed
    assert failure.kind == FailureKind.UNKNOWN and "rejected" in failure.reason


def test_append_without_quorum_fails_on_timeout():
    sim = Sim(3, 1)
    elected(sim, 0)
    sim.propose(0, 1)
    # Only the coordinator's own replica answers: the other two are unreachable.
    run(sim, keep=lambda m: m.replica == 0)
    assert not sim.acknowledged and not sim.failed
    while sim.timers:
        sim.fire_timer(0)
    (failure,) = sim.failed
    assert failure.kind == FailureKind.TIMEOUT and "timed out" in failure.reason
    assert sim.coords[0].phase == Phase.IDLE


def test_fill_after_lost_learned_messages():
    sim = Sim(3, 2)
    elected(sim, 0)
    sim.propose(0, 4)
    run(sim, keep=lambda m: not is_learned_message(m))  # every learned message is lost
    assert sorted(sim.acknowledged) == [1, 2, 3, 4]
    assert not sim.cores[1].is_learned(1)
    elected(sim, 1)  # the new coordinator fills what its replica has not learned
    for core in sim.cores:
        assert all(core.is_learned(p) for p in range(0, 5))
    sim.check_acknowledged()


def test_many_appends_then_new_coordinator_fills_them():
    sim = Sim(5, 2)
    elected(sim, 0)
    sim.propose(0, 40)
    run(sim, keep=lambda m: not (is_learned_message(m) and m.replica == 1))
    elected(sim, 1)
    assert sim.cores[1].learned == 40
    sim.check_acknowledged()


def test_truncate_then_reads_below_begin_are_gone():
    sim = Sim(3, 1)
    elected(sim, 0)
    sim.propose(0, 5)
    run(sim)
    sim.truncate(0, 4)
    run(sim)
    for core in sim.cores:
        assert core.begin == 4
        assert core.storage.get(1) is None and core.storage.get(3) is None
        assert core.get(4).value.startswith(b"c0-")


def test_truncate_with_lost_learned_messages_then_fill():
    sim = Sim(3, 2)
    elected(sim, 0)
    sim.propose(0, 5)
    run(sim)
    sim.truncate(0, 3)
    run(sim, keep=lambda m: not is_learned_message(m))
    assert sim.cores[1].begin == 0
    elected(sim, 1)  # the fill learns the TRUNCATE and applies it
    assert sim.cores[1].begin == 3
    assert all(core.begin == 3 for core in sim.cores)


def test_truncate_with_tombstones():
    """A replica that missed a truncation fills positions below another's begin: the
    promise replies carry learned tombstones and the filler adopts them."""
    sim = Sim(3, 2)
    elected(sim, 0)
    sim.propose(0, 6)
    run(sim, keep=lambda m: not (m.replica == 1 and m.response is None))  # replica 1 misses all
    sim.truncate(0, 5)
    run(sim, keep=lambda m: not (m.replica == 1 and m.response is None))
    assert sim.cores[1].end == 0 and sim.cores[0].begin == 5
    elected(sim, 1)
    assert sim.cores[1].begin >= 5
    assert sim.cores[1].get(5).value.startswith(b"c0-")
    sim.check_acknowledged()


def test_racing_elections_converge_to_one_leader():
    sim = Sim(5, 3)
    for c in range(3):
        sim.coords[c].elect()
        sim._drain(c)
    run(sim)
    leading = [c for c in range(3) if sim.coords[c].leading]
    assert len(leading) <= 1
    for _ in range(10):
        if any(c.leading for c in sim.coords):
            break
        sim.elect(0)
        run(sim)
    assert sum(c.leading for c in sim.coords) == 1


def test_a_leader_whose_follower_promised_higher_is_demoted_by_the_heartbeat_answer():
    """A rival's candidacy raised replica 1's promise above the leader's proposal and failed
    (only its own acceptor promised). Replica 1 rejects the leader's writes from then on;
    the leader learns it from the next heartbeat's answer, before any client append, and
    the next election goes above that promise."""
    sim = Sim(3, 2)
    elected(sim, 0)
    leader_proposal = sim.coords[0].proposal
    sim.coords[1].elect()  # replica 1 stands; only its own replica hears it
    sim._drain(1)
    run(sim, keep=lambda m: m.replica == 1 and m.coordinator == 1)
    while sim.timers:
        sim.fire_timer(0)  # its election times out: demoted, promise left raised
    assert sim.coords[1].phase == Phase.IDLE
    raised = sim.cores[1].promised
    assert raised > leader_proposal and sim.coords[0].leading
    sim.advance(0.2)  # the leader heartbeats; replica 1 answers with its promise
    run(sim)
    assert sim.coords[0].phase == Phase.IDLE and not sim.failed  # no append paid for it
    elected(sim, 0)
    assert sim.coords[0].proposal > raised
    sim.propose(0, 2)
    run(sim)
    assert len(sim.acknowledged) == 2
    sim.check_acknowledged()


def test_a_heartbeat_answer_at_or_below_the_leaders_proposal_changes_nothing():
    sim = Sim(3, 1)
    elected(sim, 0)
    proposal = sim.coords[0].proposal
    assert not sim.coords[0].on_peer_promise(1, proposal)
    assert not sim.coords[0].on_peer_promise(2, 0)  # an older build's empty answer
    assert sim.coords[0].leading


def superseded_leader_at_position_one() -> Sim:
    """Coordinator 0 leads at proposal 1 (its election filled position 0), then coordinator
    1 is elected at proposal 2 without coordinator 0 hearing of it: both will write their
    next entry at position 1."""
    sim = Sim(3, 2)
    elected(sim, 0)
    elected(sim, 1)
    assert sim.coords[0].leading and sim.coords[0].proposal == 1
    assert sim.coords[1].proposal == 2
    assert sim.coords[0].next_position == sim.coords[1].next_position == 1
    return sim


def test_a_superseded_leader_is_not_acknowledged_for_an_identical_truncation():
    """The schedule the randomized test found: the new leader's TRUNCATE is chosen and
    learned at position 1; the superseded leader then proposes a TRUNCATE with the same
    `truncate_to` at position 1. Every replica holds position 1 learned with an identical
    value, and used to accept the old leader's write for that alone, so both requests were
    reported done at position 1 while only the first was ever written."""
    sim = superseded_leader_at_position_one()
    sim.truncate(1, 1)
    run(sim)
    assert list(sim.acknowledged) == [1]
    assert all(core.is_learned(1) for core in sim.cores)
    sim.truncate(0, 1)  # the same action, another request, a stale leader
    run(sim)
    assert list(sim.acknowledged) == [1]
    assert sim.coords[0].phase == Phase.IDLE
    (failure,) = sim.failed
    assert failure.kind == FailureKind.UNKNOWN and "rejected" in failure.reason


def test_two_clients_appending_the_same_value_are_never_told_the_same_position():
    """The same race with appends: two clients append identical payloads through two
    coordinators. Acknowledging both at position 1 would lose one append (each client is
    told its entry is at 1; the log holds one entry)."""
    sim = superseded_leader_at_position_one()
    sim.propose(1, 1)
    run(sim)
    assert list(sim.acknowledged) == [1]
    sim.propose_duplicate(0, sim.payloads[0])  # a different request with the value now learned at 1
    run(sim)
    assert list(sim.acknowledged) == [1]
    (failure,) = sim.failed
    assert failure.kind == FailureKind.UNKNOWN


def test_an_old_leaders_value_finished_by_a_fill_is_still_its_own():
    """The acknowledgement a write to a learned position may still earn: the old leader's
    own write, chosen by a newer coordinator's fill before the old leader heard a quorum.
    Then the value at the position is the old leader's request, so acknowledging it is
    right (and rejecting it would only turn a success into an unknown outcome)."""
    sim = Sim(3, 2)
    elected(sim, 0)
    sim.propose(0, 1)
    # The write reaches replica 0 only; the copies to replicas 1 and 2 wait in the network.
    delayed = [m for m in sim.network if m.replica != 0]
    sim.network = [m for m in sim.network if m.replica == 0]
    run(sim, keep=lambda m: m.response is None)  # replica 0 accepts; its reply is lost
    assert not sim.acknowledged
    # Coordinator 1 (on replica 1) is elected with replica 0 in its quorum, so it fills
    # position 1 with the old leader's value (its origin too), and every replica learns it.
    elected(sim, 1)
    for core in sim.cores:
        assert core.is_learned(1)
        assert (core.get(1).origin_proposal, core.get(1).origin_leader) == (1, 0)
    sim.network.extend(delayed)  # the old leader's write now reaches replicas 1 and 2
    run(sim)
    assert list(sim.acknowledged) == [1]
    sim.check_acknowledged()


def test_a_later_batch_can_be_acknowledged_before_an_earlier_one_is_learned():
    """Two batches in flight: the second may be chosen (and its appends acknowledged)
    while the first is still unanswered, so the leader's contiguous learned position lags
    what it acknowledged; `acknowledged_end` says how far a read must wait for."""
    sim = Sim(3, 1)
    elected(sim, 0)
    coord = sim.coords[0]
    sim.propose(0, 3)  # the first batch (max 3 entries): positions 1-3
    sim.propose(0, 3)  # the second batch: positions 4-6
    first_batch = [
        k
        for k, m in enumerate(sim.network)
        if isinstance(m.request, pb.WriteRequest) and m.request.runs[0].first == 1
    ]
    held = [sim.network[k] for k in first_batch]
    sim.network = [m for k, m in enumerate(sim.network) if k not in first_batch]
    run(sim)
    assert sorted(sim.acknowledged) == [4, 5, 6]
    assert coord.acknowledged_end == 6
    assert sim.cores[0].learned < 4  # the leader has not learned position 1 to 3 yet
    sim.network.extend(held)
    run(sim)
    assert coord.acknowledged_end == 6 and sim.cores[0].learned == 6


def minority_batch_then_new_leader(split_fill: bool, tail_quorum: tuple[int, int]) -> Sim:
    """Leader 0 writes a 5-entry batch (positions 1..5) that only replica 2 accepts, then
    coordinator 1 is elected by replicas 1 and 2 and fills 1..5 in chunks of 3: promises
    for positions 1..3 are answered by replicas 1 and 2 (which sees the batch), those for
    4 and 5 by `tail_quorum`."""
    sim = Sim(3, 2, split_fill=split_fill)
    elected(sim, 0)
    sim.propose_batch(0, 5)
    run(sim, keep=lambda m: m.replica == 2)  # the write reaches replica 2 alone
    assert not sim.acknowledged

    def answered_by(request: pb.PromiseRequest) -> tuple[int, ...]:
        if request.positions and min(request.positions) >= 4:
            return tail_quorum
        return (1, 2)

    sim.elect(1)
    run(
        sim,
        keep=lambda m: (
            m.coordinator == 1
            and (
                not isinstance(m.request, pb.PromiseRequest) or m.replica in answered_by(m.request)
            )
        ),
    )
    assert sim.coords[1].leading and sim.coords[1].next_position == 6
    return sim


def test_a_minority_batch_is_filled_whole_when_the_tail_quorum_sees_it():
    sim = minority_batch_then_new_leader(split_fill=False, tail_quorum=(1, 2))
    held = [sim.cores[1].get(p) for p in range(1, 6)]
    assert [a.value for a in held] == sim.batches[0]
    assert all(sim.cores[1].is_learned(p) for p in range(1, 6))
    sim.check_batches()


def test_a_minority_batch_is_dropped_whole_when_the_tail_quorum_does_not_see_it():
    # Positions 1..3 show the batch, 4 and 5 (promised by replicas 0 and 1) do not: it was
    # chosen nowhere, and the fill replaces all five entries by NOPs, never the first three
    # alone.
    sim = minority_batch_then_new_leader(split_fill=False, tail_quorum=(0, 1))
    held = [sim.cores[1].get(p) for p in range(1, 6)]
    assert [a.type for a in held] == [pb.NOP] * 5
    assert all(sim.cores[1].is_learned(p) for p in range(1, 6))
    sim.check_batches()


def test_the_split_fill_chooses_a_minority_batch_in_part():
    # The test-only per-position fill of before: the first chunk re-proposes the batch's
    # first three entries, the second (promised by another quorum) fills 4 and 5 with NOPs.
    with pytest.raises(Violation, match="chosen in part"):
        minority_batch_then_new_leader(split_fill=True, tail_quorum=(0, 1))
