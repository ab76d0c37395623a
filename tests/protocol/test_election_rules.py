"""The election rules (rlog.protocol.election), one test per rule: a simulated clock, no
processes, no sleeping."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import Phase
from rlog.protocol.election import (
    Election,
    PreVote,
    Stand,
    StandDown,
    StartPreVote,
    StepDown,
)

T = 1.0
STEP = 0.01  # how often the tests tick: finer than any rule's time


@dataclass
class Local:
    """This replica's status and its coordinator, as the election reads them."""

    status: pb.Status.ValueType = pb.VOTING
    phase: Phase = Phase.IDLE
    proposal: int = 0

    @property
    def leading(self) -> bool:
        return self.phase == Phase.LEADING


def election(
    local: Local, replicas: int = 3, replica_id: int = 0, seed: int = 0, now: float = 0.0
) -> Election:
    return Election(
        replica_id,
        f"r{replica_id}",
        replicas,
        T,
        local,
        local,
        now,
        random.Random(seed),
    )


def ticks(e: Election, start: float, end: float) -> float | None:
    """Tick every STEP from `start` while before `end`; the time of the first pre-vote."""
    now = start
    while now < end:
        if e.tick(now) is not None:
            return now
        now = round(now + STEP, 6)
    return None


def status(
    replica: int, state: int = pb.VOTING, role: str = "follower", leader: str = ""
) -> pb.StatusResponse:
    return pb.StatusResponse(
        id=replica, status=state, role=role, leader=leader, address=f"r{replica}"
    )


def timed_out(e: Election, start: float = 0.0) -> float:
    """Tick from `start` until the timer fires; when it fired."""
    fired = ticks(e, start, start + 2 * T + 1)
    assert fired is not None
    return fired


# ---- the timer -------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(20))
def test_timeout_fires_in_T_to_2T_and_not_before(seed):
    e = election(Local(), seed=seed)
    fired = timed_out(e)
    assert T <= fired < 2 * T + STEP


def test_the_timeout_is_drawn_at_random():
    fired = {timed_out(election(Local(), seed=seed)) for seed in range(20)}
    assert len(fired) > 10


def test_no_candidacy_while_not_voting():
    local = Local(status=pb.RECOVERING)
    e = election(local)
    assert ticks(e, 0.0, 10 * T) is None


def test_turning_voting_restarts_the_timer_with_a_full_fresh_timeout():
    local = Local(status=pb.RECOVERING)
    e = election(local)
    assert ticks(e, 0.0, 5 * T) is None
    local.status = pb.VOTING
    fired = timed_out(e, 5 * T)
    assert fired >= 6 * T


@pytest.mark.parametrize("seed", range(5))
def test_a_heartbeat_restarts_the_timer(seed):
    would_fire = timed_out(election(Local(), seed=seed))
    e = election(Local(), seed=seed)
    heard = round(would_fire - STEP, 6)  # just before the timer would have fired
    assert ticks(e, 0.0, heard) is None
    e.on_heartbeat(heard, 1, "r1", 1)
    assert ticks(e, heard, heard + T) is None
    assert timed_out(e, heard + T) >= heard + T


@pytest.mark.parametrize("seed", range(5))
def test_an_accepted_rival_promise_restarts_the_timer(seed):
    would_fire = timed_out(election(Local(), seed=seed))
    e = election(Local(), seed=seed)
    heard = round(would_fire - STEP, 6)
    assert ticks(e, 0.0, heard) is None
    e.on_promise_accepted(heard, candidate=2)
    assert ticks(e, heard, heard + T) is None


def test_our_own_accepted_promise_does_not_restart_the_timer():
    reference = timed_out(election(Local(), seed=3))
    e = election(Local(), seed=3)
    e.tick(0.0)
    e.on_promise_accepted(0.9 * T, candidate=0)
    assert timed_out(e) == reference


def test_no_candidacy_while_the_coordinator_is_busy():
    local = Local(phase=Phase.FILLING)
    e = election(local)
    assert ticks(e, 0.0, 10 * T) is None


def test_a_demotion_backs_off_before_standing_again():
    local = Local()
    e = election(local)
    e.tick(0.0)
    assert e.on_demoted(0.0, retry_after=5 * T) is False  # lost an election: not leading
    assert ticks(e, 0.0, 5 * T) is None
    assert timed_out(e, 5 * T) == 5 * T


def test_a_step_down_waits_three_election_timeouts():
    local = Local(phase=Phase.LEADING)
    e = election(local)
    e.tick(0.0)
    e.on_leading(0.0)
    local.phase = Phase.IDLE
    assert e.on_demoted(0.0, retry_after=0.1) is True  # was leading
    e.stepped_down(0.0)  # the timer alone would fire in [T, 2T)
    assert ticks(e, 0.0, 3 * T) is None
    assert e.tick(3 * T) == StartPreVote()


@pytest.mark.parametrize("seed", range(20))
def test_after_a_step_down_a_follower_stands_a_full_timeout_before_the_old_leader(seed):
    """The followers' timers count from the last heartbeat, which came before the step-down;
    the old leader's wait leaves each of them at least T for its pre-vote and election."""
    follower = election(Local(), replica_id=1, seed=seed)
    last_heartbeat = 5 * T
    follower.on_heartbeat(last_heartbeat, 0, "r0", 1)
    fired = timed_out(follower, last_heartbeat)
    local = Local(phase=Phase.LEADING)
    old = election(local, seed=seed)
    old.on_leading(0.0)
    local.phase = Phase.IDLE
    old.on_demoted(last_heartbeat, retry_after=0.1)
    old.stepped_down(last_heartbeat)  # asked at once after its last heartbeat
    assert ticks(old, last_heartbeat, fired + T) is None


# ---- the pre-vote ----------------------------------------------------------------------


def pre_vote(e: Election, statuses) -> Stand | StandDown:
    fired = timed_out(e)
    return e.on_pre_vote(fired, statuses)


def test_the_pre_vote_stands_down_when_a_peer_leads():
    e = election(Local())
    outcome = pre_vote(e, [status(1, role="leader"), None])
    assert isinstance(outcome, StandDown)
    assert "replica 1 (r1) leads" in outcome.reason


def test_the_pre_vote_stands_down_when_a_leader_has_quorum_minus_one_followers():
    e = election(Local(), replicas=5)
    outcome = pre_vote(e, [status(1, leader="r4"), status(2, leader="r4"), None, None])
    assert isinstance(outcome, StandDown)
    assert "2 of them follow r4" in outcome.reason


def test_the_pre_vote_stands_with_fewer_followers_of_a_leader():
    e = election(Local(), replicas=5)
    outcome = pre_vote(e, [status(1, leader="r4"), status(2, leader="r3"), None, None])
    assert isinstance(outcome, Stand)
    assert "2 unreachable" in outcome.reason


def test_the_pre_vote_stands_when_nobody_answers():
    assert isinstance(pre_vote(election(Local()), [None, None]), Stand)


def test_the_pre_vote_ignores_non_voting_peers_and_peers_that_follow_us():
    e = election(Local())
    outcome = pre_vote(
        e,
        [status(1, state=pb.RECOVERING, role="leader"), status(2, leader="r0")],
    )
    assert isinstance(outcome, Stand)


def test_standing_down_after_the_pre_vote_restarts_the_timer():
    e = election(Local())
    fired = timed_out(e)
    assert isinstance(e.on_pre_vote(fired, [status(1, role="leader"), None]), StandDown)
    assert ticks(e, fired, fired + T) is None


def test_standing_down_does_not_make_the_leader_our_peers_named_live():
    """A peer's word that it follows r2 is no heartbeat of r2: if it counted as one, this
    replica would name r2 live to the next peer's pre-vote for another T, and two followers
    of a leader that stepped down (or died) could keep each other standing down, leaving
    the old leader, whose followers do not count against it, the only one able to win."""
    e = election(Local())
    e.on_heartbeat(0.0, 2, "r2", 1)  # r2's last heartbeat
    fired = timed_out(e)
    assert fired >= T  # r2 is no longer live here
    outcome = e.on_pre_vote(fired, [status(1, leader="r2"), status(2)])
    assert isinstance(outcome, StandDown)  # r1 (its clock behind ours) still follows r2
    assert e.live_leader(fired) == ""
    assert not e.refuses(1, fired)
    # so r1's own pre-vote, a moment later, hears that nobody follows r2 here
    r1 = election(Local(), replica_id=1)
    r1.on_heartbeat(0.0, 2, "r2", 1)
    r1_fired = timed_out(r1, 0.0)
    tally = [
        pb.StatusResponse(
            id=0,
            status=pb.VOTING,
            role="follower",
            leader=e.live_leader(fired + 0.01),
            address="r0",
        ),
        status(2),
    ]
    assert isinstance(r1.on_pre_vote(max(r1_fired, fired + 0.01), tally), Stand)


def test_standing_clears_the_leader_and_waits_a_fresh_timeout_before_the_next_attempt():
    e = election(Local())
    e.on_heartbeat(0.0, 1, "r1", 1)
    fired = timed_out(e)
    assert isinstance(e.on_pre_vote(fired, [None, None]), Stand)
    assert e.leader_id is None
    assert e.live_leader(fired) == ""
    assert ticks(e, fired, fired + T) is None


def test_one_pre_vote_at_a_time():
    e = election(Local())
    fired = timed_out(e)
    assert ticks(e, fired, fired + 3 * T) is None


def test_the_pre_vote_tally_reason_says_what_peers_said():
    tally = PreVote(3, "r0")
    tally.add(status(1))
    tally.add(None)
    assert tally.stand()
    assert tally.reason() == (
        "heard 1 of 2 peers (1 VOTING), 1 unreachable; "
        "none leads and no leader has 1 followers among them"
    )


def test_a_heartbeat_during_the_pre_vote_cancels_the_candidacy():
    e = election(Local())
    fired = timed_out(e)
    e.on_heartbeat(fired + 0.1, 2, "r2", 5)
    outcome = e.on_pre_vote(fired + 0.2, [None, None])
    assert isinstance(outcome, StandDown)
    assert "during the pre-vote" in outcome.reason


def test_an_accepted_promise_during_the_pre_vote_cancels_the_candidacy():
    e = election(Local())
    fired = timed_out(e)
    e.on_promise_accepted(fired + 0.1, candidate=1)
    assert isinstance(e.on_pre_vote(fired + 0.2, [None, None]), StandDown)


def test_a_busy_coordinator_or_a_lost_vote_cancels_the_candidacy():
    local = Local()
    e = election(local)
    fired = timed_out(e)
    local.phase = Phase.ELECTING
    assert e.on_pre_vote(fired, [None, None]) == StandDown("the coordinator is electing")
    local.phase = Phase.IDLE
    fired = timed_out(e, fired)
    local.status = pb.RECOVERING
    assert e.on_pre_vote(fired, [None, None]) == StandDown("no longer VOTING")


def test_a_restarted_loop_forgets_the_pre_vote_and_listens_afresh():
    e = election(Local())
    fired = timed_out(e)
    e.restart_timer()
    assert ticks(e, fired, fired + T) is None
    assert timed_out(e, fired) >= fired + T


# ---- refusing rivals -------------------------------------------------------------------


def test_rivals_are_refused_while_a_live_leader_is_heard():
    e = election(Local())
    e.on_heartbeat(0.0, 1, "r1", 1)
    assert e.refuses(2, 0.5 * T)
    assert not e.refuses(2, T)  # the leader is no longer live


def test_the_leaders_own_candidacy_is_never_refused():
    e = election(Local())
    e.on_heartbeat(0.0, 1, "r1", 1)
    assert not e.refuses(1, 0.5 * T)


def test_rivals_are_not_refused_without_a_leader_or_when_not_voting():
    local = Local()
    e = election(local)
    assert not e.refuses(2, 0.0)
    e.on_heartbeat(0.0, 1, "r1", 1)
    local.status = pb.RECOVERING
    assert not e.refuses(2, 0.1)


def test_a_leader_refuses_rivals_only_while_it_leads():
    local = Local(phase=Phase.LEADING)
    e = election(local)
    e.on_leading(0.0)
    assert e.refuses(2, 100 * T)  # no heartbeat needed: it is the leader
    local.phase = Phase.IDLE
    assert not e.refuses(2, 100 * T)


# ---- the live leader -------------------------------------------------------------------


def test_the_live_leader_expires_after_one_election_timeout():
    e = election(Local())
    assert e.live_leader(0.0) == ""
    e.on_heartbeat(0.0, 1, "r1", 1)
    assert e.live_leader(0.99 * T) == "r1"
    assert e.live_leader(T) == ""


def test_a_leader_is_its_own_live_leader():
    local = Local(phase=Phase.LEADING)
    e = election(local)
    e.on_leading(0.0)
    assert e.live_leader(100 * T) == "r0"


# ---- stepping down ---------------------------------------------------------------------


@pytest.mark.parametrize("phase", [Phase.ELECTING, Phase.FILLING, Phase.LEADING])
def test_a_higher_proposal_heartbeat_steps_a_busy_coordinator_down(phase):
    local = Local(phase=phase, proposal=4)
    e = election(local)
    assert e.on_heartbeat(0.0, 1, "r1", 5) == StepDown("a leader with a higher proposal is live")
    local.phase = Phase.IDLE  # the driver stepped the coordinator down
    assert (e.leader_id, e.live_leader(0.0)) == (1, "r1")


def test_a_lower_or_equal_proposal_heartbeat_does_not_step_down():
    local = Local(phase=Phase.LEADING, proposal=4)
    e = election(local)
    e.on_leading(0.0)
    assert e.on_heartbeat(0.0, 1, "r1", 4) is None
    assert e.leader_id == 0  # a leader does not follow a stale one


def test_an_idle_coordinator_follows_without_stepping_down():
    e = election(Local(proposal=0))
    assert e.on_heartbeat(0.0, 1, "r1", 7) is None
    assert e.leader_id == 1


def test_a_leader_deposed_by_a_heartbeat_follows_the_new_leader():
    local = Local(phase=Phase.LEADING, proposal=4)
    e = election(local)
    e.on_leading(0.0)
    assert e.on_heartbeat(1.0, 1, "r1", 5) is not None
    local.phase = Phase.IDLE  # the driver stepped the coordinator down
    assert e.on_demoted(1.0, retry_after=0.1) is True
    assert (e.leader_id, e.live_leader(1.5)) == (1, "r1")


def test_losing_an_election_keeps_the_leader_heard():
    e = election(Local())
    e.on_heartbeat(0.0, 1, "r1", 1)
    assert e.on_demoted(0.1, retry_after=0.1) is False
    assert e.live_leader(0.2) == "r1"


# ---- check-quorum ----------------------------------------------------------------------


def leader(replicas: int = 3) -> tuple[Local, Election]:
    local = Local(phase=Phase.LEADING, proposal=4)
    e = election(local, replicas=replicas)
    e.on_leading(0.0)
    return local, e


def test_a_new_leader_counts_its_peers_as_heard_for_two_election_timeouts():
    _, e = leader()
    assert e.check_quorum(1.99 * T) is None
    assert isinstance(e.check_quorum(2 * T), StepDown)


def test_a_leader_that_hears_a_quorum_within_the_timeout_keeps_leading():
    _, e = leader()
    now = 0.0
    while now < 10 * T:
        e.on_peer_answered(now, 1)  # one peer: with ourselves, 2 of 3
        assert e.check_quorum(now + 1.5 * T) is None
        now += 1.5 * T


def test_a_leader_that_has_not_heard_a_quorum_within_the_timeout_steps_down():
    _, e = leader(replicas=5)
    e.on_peer_answered(1.5 * T, 1)
    e.on_peer_answered(1.5 * T, 2)
    assert e.check_quorum(3.4 * T) is None  # 3 of 5, peer 1 and 2 heard 1.9 T ago
    e.on_peer_answered(3.4 * T, 1)
    step = e.check_quorum(3.5 * T)  # peer 2 last answered 2T ago: 2 of 5
    assert isinstance(step, StepDown)
    assert "heard from 2 of 5" in step.reason


def test_answers_from_ourselves_do_not_count_twice():
    _, e = leader()
    e.on_peer_answered(1.9 * T, 0)
    assert isinstance(e.check_quorum(2.5 * T), StepDown)


def test_check_quorum_only_applies_while_leading():
    local = Local(phase=Phase.FILLING, proposal=4)
    e = election(local)
    assert e.check_quorum(100 * T) is None  # not leading yet
    local.phase = Phase.LEADING
    e.on_leading(100 * T)
    local.phase = Phase.IDLE  # stepped down or demoted meanwhile
    assert e.check_quorum(200 * T) is None


def test_a_single_replica_never_steps_down_for_quorum():
    _, e = leader(replicas=1)
    assert e.check_quorum(100 * T) is None


def test_leading_again_forgets_old_answers():
    local, e = leader()
    e.on_peer_answered(0.5 * T, 1)
    local.phase = Phase.IDLE
    e.on_demoted(0.6 * T, retry_after=0.1)
    local.phase = Phase.LEADING
    e.on_leading(10 * T)
    assert e.check_quorum(11.5 * T) is None  # a fresh window from leading again
    assert isinstance(e.check_quorum(12 * T), StepDown)


# ---- a leader gone: its write connections closed -------------------------------------------


def following(seed: int = 0, heard: float = 5.0) -> Election:
    """Replica 0, VOTING since 0 and a follower of replica 1, whose heartbeats came every
    T/5 until `heard` (ticked until then)."""
    e = election(Local(), seed=seed)
    now = 0.0
    while now < heard:
        e.on_heartbeat(now, 1, "r1", 1)
        assert ticks(e, now, round(now + T / 5, 6)) is None
        now = round(now + T / 5, 6)
    e.on_heartbeat(heard, 1, "r1", 1)
    return e


@pytest.mark.parametrize("seed", range(10))
def test_a_leader_gone_fires_the_timer_within_a_quarter_to_half_a_timeout(seed):
    e = following(seed)
    e.leader_gone(5.1, leader=1)
    fired = timed_out(e, 5.1)
    assert 5.1 + T / 4 <= fired < 5.1 + T / 2 + STEP  # not T to 2T after the heartbeat


@pytest.mark.parametrize("seed", range(5))
def test_a_heartbeat_after_the_connections_closed_voids_the_sign(seed):
    e = following(seed)
    e.leader_gone(5.1, leader=1)
    e.on_heartbeat(5.2, 1, "r1", 1)  # the leader is alive: it reconnected, or will
    assert ticks(e, 5.2, 5.2 + T) is None
    assert e.live_leader(5.3) == "r1"


@pytest.mark.parametrize("after", [True, False], ids=["promise after", "promise before"])
def test_a_candidates_promise_since_the_last_heartbeat_voids_the_shortcut(after):
    """Another follower saw the leader go first and stands: once this replica has accepted
    its promise, it waits a full timeout from that promise (the candidate heartbeats once it
    leads) rather than stand T/4 to T/2 after the sign, above the candidate's proposal,
    whose writes it would then reject."""
    e = following(seed=3)
    if after:
        e.leader_gone(5.1, leader=1)
        e.on_promise_accepted(5.12, candidate=2)
        promised = 5.12
    else:
        e.on_promise_accepted(5.1, candidate=2)
        e.leader_gone(5.12, leader=1)
        promised = 5.1
    assert timed_out(e, 5.12) >= promised + T


def test_a_gone_leader_is_not_named_live_and_rivals_are_not_refused_for_it():
    e = following()
    assert e.live_leader(5.1) == "r1" and e.refuses(2, 5.1)
    e.leader_gone(5.1, leader=1)
    assert e.live_leader(5.11) == ""
    assert not e.refuses(2, 5.11)


def test_a_sign_about_another_replica_or_while_leading_changes_nothing():
    e = following(seed=1)
    reference = timed_out(following(seed=1), 5.0)
    e.leader_gone(5.1, leader=2)  # not the leader we follow
    assert timed_out(e, 5.0) == reference
    leader = election(Local(phase=Phase.LEADING), seed=1)
    leader.on_leading(0.0)
    leader.leader_gone(0.1, leader=0)
    assert leader.live_leader(0.2) == "r0"


def test_after_a_stand_down_the_next_attempt_waits_a_full_fresh_timeout():
    """The other follower still heard the leader: the sign was this replica's alone, so it
    does not keep asking every quarter timeout."""
    e = following(seed=2)
    e.leader_gone(5.1, leader=1)
    fired = timed_out(e, 5.1)
    outcome = e.on_pre_vote(fired, [status(1, role="leader")])
    assert isinstance(outcome, StandDown)
    assert ticks(e, fired, fired + T) is None


def test_a_new_voter_still_listens_a_full_timeout_first():
    local = Local(status=pb.RECOVERING)
    e = election(local)
    e.on_heartbeat(0.1, 1, "r1", 1)
    local.status = pb.VOTING
    assert e.tick(0.2) is None  # turned VOTING at 0.2
    e.leader_gone(0.3, leader=1)
    assert timed_out(e, 0.3) >= 0.2 + T
