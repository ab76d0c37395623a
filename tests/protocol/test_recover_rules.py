"""The recover protocol's decisions (rlog.protocol.recover) and the promise adoption that closes the
Mesos hazard of a wiped replica voting with promised = 0."""

from __future__ import annotations

import pytest
from paxos_sim import Sim, Violation, is_learned_message, run

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.recover import Next, RecoverRound

V, S, E, R = pb.VOTING, pb.STARTING, pb.EMPTY, pb.RECOVERING


def decide(local, replies, permit=True, replicas=None):
    round_ = RecoverRound(replicas or len(replies), local, permit)
    decision = None
    for i, status in enumerate(replies):
        response = pb.RecoverResponse(status=status)
        if status == V:
            response.begin, response.end, response.promised = i, 10 + i, 5 + i
        decision = decision or round_.add(i, response)
    return decision, round_


def test_voting_quorum_sends_a_replica_recovering_with_min_begin_max_end_max_promise():
    decision, _ = decide(E, [E, V, V])
    assert decision.next == Next.RECOVER
    assert (decision.begin, decision.end, decision.promised) == (1, 12, 7)
    assert decision.sources == (1, 2)


def test_all_empty_with_permit_goes_starting_then_voting():
    assert decide(E, [E, E, E])[0].next == Next.STARTING
    assert decide(E, [E, S, S])[0].next == Next.STARTING
    assert decide(S, [S, S, S])[0].next == Next.VOTING
    assert decide(S, [S, V, S])[0].next == Next.VOTING


def test_no_permit_stays_empty_and_says_why():
    decision, round_ = decide(E, [E, E, E], permit=False)
    assert decision is None
    assert "no initialization permit" in round_.reason()


def test_auto_init_waits_for_every_replica():
    decision, round_ = decide(E, [E, E], replicas=3)
    assert decision is None
    assert "1 unreachable" in round_.reason()


@pytest.mark.parametrize("replicas", [3, 5, 7])
def test_uses_the_real_replica_count(replicas):
    quorum = replicas // 2 + 1
    statuses = [V] * (quorum - 1) + [E] * (replicas - quorum + 1)
    assert decide(E, statuses)[0] is None
    statuses = [V] * quorum + [E] * (replicas - quorum)
    assert decide(E, statuses)[0].next == Next.RECOVER


def test_stuck_mix_after_a_disk_lost_mid_bootstrap_is_reported():
    decision, round_ = decide(E, [V, S, E])
    assert decision is None
    reason = round_.reason()
    assert "1 VOTING" in reason and "1 STARTING" in reason and "1 EMPTY" in reason
    assert "cannot initialize nor recover" in reason


def test_a_recovering_replica_ignores_promises_and_writes():
    decision, _ = decide(R, [R, V, V])
    assert decision.next == Next.RECOVER


def stale_coordinator_scenario() -> Sim:
    """5 replicas. Y (coordinator 1) is elected at proposal 1, then X (coordinator 0) at 2;
    Y does not know. Three replicas lose their disks one after another and recover. Then
    both coordinators append at position 1 (Y's learned messages are lost)."""
    sim = Sim(5, 2)
    sim.elect(1)
    run(sim)
    sim.elect(0)
    run(sim)
    assert sim.coords[0].leading and sim.coords[1].leading
    assert sim.coords[1].proposal < sim.coords[0].proposal
    for replica in (2, 3, 4):
        sim.wipe_and_recover(replica)
    sim.propose(1, 1)  # the stale coordinator first; the recovered replicas answer first
    sim.network.sort(key=lambda m: m.replica in (0, 1))
    run(sim, keep=lambda m: not (is_learned_message(m) and m.coordinator == 1))
    sim.propose(0, 1)
    run(sim)
    return sim


def test_recovered_replicas_adopt_the_quorums_promise():
    sim = stale_coordinator_scenario()
    # The stale coordinator's write was rejected by every replica; only X's value is there.
    assert [f.kind.value for f in sim.failed] == ["unknown"]
    assert sorted(sim.acknowledged) == [1]
    assert sim.acknowledged[1][1].startswith(b"c0-")
    for core in sim.cores:
        assert core.promised >= sim.coords[0].proposal
    sim.check_acknowledged()


def test_without_adoption_two_values_would_be_acknowledged(monkeypatch):
    """The same scenario with adoption disabled loses an acknowledged append: this is the
    hazard the adoption closes (and proves this test can fail)."""
    from rlog.protocol.replica import ReplicaCore

    def no_adoption(self, promised):
        return self.set_status(pb.VOTING)

    monkeypatch.setattr(ReplicaCore, "finish_recovery", no_adoption)
    with pytest.raises(Violation):
        stale_coordinator_scenario()


def test_replicas_refusing_this_builds_protocol_are_named_in_the_reason():
    """A newer build with a higher --min-peer-protocol refused our Recover: the reason says
    to upgrade this replica, not that the peers are unreachable."""
    round_ = RecoverRound(3, E, False)
    round_.add(0, pb.RecoverResponse(status=E))
    round_.newer[1] = "Recover refused: ..."
    round_.newer[2] = "Recover refused: ..."
    assert "replicas 1, 2 refuse this build's peer protocol" in round_.reason()
    assert "upgrade this replica" in round_.reason()
