"""Leader election: when a replica stands, when it stands down, whom it follows.

A pure state machine, like the coordinator, but for the rules around it: the coordinator
knows how to run an election (`Coordinator.elect`), this module decides when one should run
and keeps track of the leader a replica follows. The driver (runtime/election.py, and the
simulation in tests/paxos_sim.py) feeds it events and does what the return values ask:

- `tick(now)` every few milliseconds: `StartPreVote` when the election timer fired;
- `on_pre_vote(now, statuses)` with the peers' Status answers: `Stand` (call
  `Coordinator.elect`) or `StandDown(reason)`;
- `on_heartbeat(now, ...)` for a leader's heartbeat: `StepDown(reason)` when a coordinator of
  ours that is not idle must give way (call `Coordinator.step_down`);
- `check_quorum(now)` every tick while leading: `StepDown(reason)` when a quorum has not
  answered within two election timeouts (call `Coordinator.step_down`);
- `on_peer_answered`, `on_promise_accepted`, `on_leading`, `on_demoted`, `stepped_down`,
  `listen`, `leader_gone` record events;
- `refuses(candidate, now)` and `live_leader(now)` answer questions.

Each event asks for at most one thing, to be done at once (the pre-vote is a request and
its answers inside the driver's election loop), so results are return values rather than an
outbox drained by `take()` as in the coordinator.

The rules, in the order they are checked:
- the election timer: a random timeout in [T, 2T) counted from the latest sign of another
  coordinator at work: turning VOTING (a new voter first listens a full, fresh timeout, so
  replicas that turned VOTING together do not all stand at once), a leader's heartbeat, or a
  promise this replica accepted from another candidate (electing or filling, it heartbeats
  only once it leads), or its own last pre-vote. The timer only runs while the replica is
  VOTING and its coordinator is idle, and not before the back-off after a demotion or a
  step-down has passed;
- the pre-vote: before raising its promise, a candidate asks its peers whom they follow. It
  stands down if a VOTING peer leads (alive and reachable: its heartbeats will reach us too)
  or if a leader is followed by quorum - 1 VOTING peers (it commits without us). A replica
  that merely cannot hear the leader (restarted, reconnecting, partitioned) must not raise
  its promise and then reject the healthy leader's writes. Standing down restarts the timer
  but is no heartbeat: the leader a peer named is not heard by that (counted as heard, this
  replica would name it live to the next pre-vote for another T, so two followers of a
  leader that stepped down or died could keep each other standing down, and only the old
  leader, whom their answers do not count against, could win);
- a leader gone: when every write connection the leader had opened to this replica has
  closed (its process died: the kernel closes its sockets) and no heartbeat came since, the
  timer fires after a random wait in [T/4, T/2) from then instead of [T, 2T) from the last
  heartbeat (unless this replica accepted another candidate's promise since that heartbeat:
  the candidate is at work), and this replica no longer names that leader live to a
  pre-vote nor refuses other candidates for it. The wait is longer than the heartbeat
  interval (T/5), so a live leader whose connections merely closed (reconnecting, a rotated
  certificate) voids the sign with its next heartbeat; and a pre-vote still needs the other
  followers to have seen the leader go too (each has its own connections from it), so one
  replica's view cannot depose a leader the others hear. Liveness only: a candidate still
  needs a quorum's promises. Without it a killed leader cost T to 2T of silence before
  anyone stood;
- after the pre-vote: a heartbeat or an accepted promise that arrived meanwhile, or the
  replica no longer VOTING or its coordinator no longer idle, cancels the candidacy;
- a VOTING replica that heard a live leader within T refuses other candidates' implicit
  promises, without changing its promise (keeps the leader stable; refusing is always safe);
- a heartbeat with a higher proposal than our coordinator's steps it down if it is
  electing, filling or leading: someone was elected above it, its next write would be
  rejected anyway;
- asked to step down, a leader waits 3T before it may stand again, so another replica gets
  the chance: the others' timers fire within 2T of the last heartbeat, which came before the
  step-down, and a T more leaves time for their pre-vote and election (with 2T, a loaded
  host's slower turns let the old leader stand beside them and win again);
- check-quorum (as etcd raft's CheckQuorum): a leader records when each peer last answered
  it (any Write or heartbeat reply); a leader that has not heard from a quorum, counting
  itself, within 2T steps down, and waits 3T before standing again like any step-down. A
  leader cut off from the majority thus stops calling itself leader by itself, about when
  the majority (whose timers fire T to 2T after the last heartbeat) has elected another,
  instead of leading for ever. The window is 2T, not T, like etcd's (which checks once per
  T whether each peer was heard during the last T, so it steps down T to 2T after the last
  answer): with a heartbeat every T/5, a lossy network or a slow peer must lose ten answers
  in a row, from a quorum, to depose a healthy leader. Each peer counts as heard at
  `on_leading`, so a new leader gets the full window to hear from them. Linearizable reads
  do not depend on this timing (see read_index.py); it keeps Status and elections honest.

Time is an injected clock: every call takes `now` in seconds (a monotonic clock in the node, a
simulated one in tests), not logical ticks. The timeout T, the coordinator's back-off
(`Demoted.retry_after`) and the 3T wait after a step-down are all in seconds, and the node
polls every 20 ms; with ticks every constant would be rounded to a tick count and the rules
would no longer be the same arithmetic. Randomness comes from an injected `random.Random`.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import Phase

NEVER = -math.inf
CHECK_QUORUM_TIMEOUTS = 2  # a leader steps down after this many T without a quorum's answers
STEPPED_DOWN_TIMEOUTS = 3  # a leader that stepped down stands again after this many T


class LocalReplica(Protocol):
    """What the election reads of its own replica (read-only)."""

    @property
    def status(self) -> pb.Status.ValueType: ...


class LocalCoordinator(Protocol):
    """What the election reads of its own coordinator (read-only)."""

    @property
    def phase(self) -> Phase: ...

    @property
    def proposal(self) -> int: ...

    @property
    def leading(self) -> bool: ...


# ---- outputs ---------------------------------------------------------------------------


@dataclass(frozen=True)
class StartPreVote:
    """Ask every peer's Status, then hand the answers to `Election.on_pre_vote`."""


@dataclass(frozen=True)
class Stand:
    """Stand for election now: call `Coordinator.elect`."""

    reason: str


@dataclass(frozen=True)
class StandDown:
    """Do not stand this time; the election timer was restarted."""

    reason: str


@dataclass(frozen=True)
class StepDown:
    """Our coordinator must stop electing, filling or leading: call `Coordinator.step_down`."""

    reason: str


# ---- the pre-vote tally ----------------------------------------------------------------


class PreVote:
    """The peers' Status answers to a pre-vote, and whether they let this replica stand."""

    def __init__(self, replicas: int, address: str) -> None:
        self.replicas = replicas
        self.quorum = replicas // 2 + 1
        self.address = address  # ours: peers that follow us do not count against us
        self.answers: list[pb.StatusResponse] = []
        self.unreachable = 0

    def add(self, status: pb.StatusResponse | None) -> None:
        """Count one peer's answer (None: it did not answer)."""
        if status is None:
            self.unreachable += 1
        else:
            self.answers.append(status)

    def _voting(self) -> list[pb.StatusResponse]:
        return [s for s in self.answers if s.status == pb.VOTING]

    def leading_peer(self) -> pb.StatusResponse | None:
        """The first VOTING peer that says it leads."""
        return next((s for s in self._voting() if s.role == "leader"), None)

    def followers(self) -> Counter[str]:
        """How many VOTING peers follow each leader other than us."""
        return Counter(s.leader for s in self._voting() if s.leader and s.leader != self.address)

    def followed_leader(self) -> tuple[str, int] | None:
        """A leader that quorum - 1 peers follow: with them it has a quorum without us."""
        return next(
            ((leader, n) for leader, n in self.followers().items() if n + 1 >= self.quorum),
            None,
        )

    def stand(self) -> bool:
        return self.leading_peer() is None and self.followed_leader() is None

    def reason(self) -> str:
        """Why this replica stands or stands down: what its peers said."""
        voting = self._voting()
        heard = f"heard {len(self.answers)} of {self.replicas - 1} peers ({len(voting)} VOTING)"
        if self.unreachable:
            heard += f", {self.unreachable} unreachable"
        leader = self.leading_peer()
        if leader is not None:
            return f"{heard}; replica {leader.id} ({leader.address}) leads"
        followed = self.followed_leader()
        if followed is not None:
            name, count = followed
            return (
                f"{heard}; {count} of them follow {name}: with its leader they make a "
                f"quorum of {self.quorum} without this replica"
            )
        return f"{heard}; none leads and no leader has {self.quorum - 1} followers among them"


# ---- the state machine -----------------------------------------------------------------


class Election:
    def __init__(
        self,
        replica_id: int,
        address: str,
        replicas: int,
        timeout: float,
        replica: LocalReplica,
        coordinator: LocalCoordinator,
        now: float,
        rng: random.Random | None = None,
    ) -> None:
        self.id = replica_id
        self.address = address
        self.replicas = replicas
        self.election_timeout = timeout  # T
        self.replica = replica
        self.coordinator = coordinator
        self.rng = rng or random.Random()
        self.leader_id: int | None = None  # this replica while it leads
        self.leader_address = ""
        self.last_heard = now  # the leader's last heartbeat (or when we began to listen for it)
        self.candidate_heard = NEVER  # the last promise we accepted from another candidate
        self.pre_voted = NEVER  # our last pre-vote: the timer counts afresh from it
        self.retry_at = NEVER  # no candidacy before (back-off after a demotion, step-down)
        self.timeout = self._fresh_timeout()
        self.voting_since: float | None = None  # None: not VOTING at the last tick
        self._leading = False  # between `on_leading` and `on_demoted`
        self._pre_vote: tuple[float, float] | None = None  # (started, quiet since then)
        self.peer_answered: dict[int, float] = {}  # while leading: each peer's last answer
        self.leading_since = NEVER  # when `on_leading` was last called
        self.gone_at = NEVER  # when the leader's write connections all closed
        self.gone_wait = 0.0  # the wait after `gone_at` before the timer fires

    def _fresh_timeout(self) -> float:
        return self.rng.uniform(self.election_timeout, 2 * self.election_timeout)

    def gone(self) -> bool:
        """The leader followed closed every write connection to us and sent no heartbeat
        since (`leader_gone`)."""
        return (
            self.gone_at != NEVER
            and self.gone_at >= self.last_heard
            and self.leader_id is not None
            and self.leader_id != self.id
        )

    def quiet_since(self) -> float:
        """The last sign of another coordinator at work: a leader's heartbeat, or a
        candidate's promise this replica accepted (it is electing or filling and will
        heartbeat once leading)."""
        return max(self.last_heard, self.candidate_heard)

    # ---- the election timer and the pre-vote -------------------------------------------

    def restart_timer(self) -> None:
        """Forget the timer's progress and any pre-vote under way: the next tick counts a
        full, fresh timeout, as for a new voter (the driver's election loop restarted)."""
        self.voting_since = None
        self._pre_vote = None
        self.timeout = self._fresh_timeout()

    def tick(self, now: float) -> StartPreVote | None:
        """Advance the timer; `StartPreVote` when it fired and this replica may stand."""
        if self.replica.status != pb.VOTING:
            self.voting_since = None
            return None
        if self.voting_since is None:
            # A new voter (auto-initialization, catch-up, start) first listens for a leader
            # for a full, fresh timeout: replicas that turned VOTING together must not all
            # stand at once, nor one that missed the first heartbeats.
            self.voting_since = now
            self.timeout = self._fresh_timeout()
        if self._pre_vote is not None:
            return None  # one pre-vote at a time
        if self.coordinator.phase != Phase.IDLE:
            return None
        if now < self.retry_at:
            return None
        quiet_since = max(self.quiet_since(), self.voting_since, self.pre_voted)
        due = quiet_since + self.timeout
        rival_at_work = self.candidate_heard > self.last_heard
        if self.gone() and self.pre_voted < self.gone_at and not rival_at_work:
            # the first attempt after the leader went (a new voter still listens a full
            # timeout first), unless a candidate's promise was accepted since the leader's
            # last heartbeat: that candidate is electing or filling and heartbeats once it
            # leads. Standing now would raise this replica's promise above its proposal,
            # and its writes here would fail (`Coordinator.on_peer_promise`).
            due = min(due, max(self.gone_at + self.gone_wait, self.voting_since + self.timeout))
        if now < due:
            return None
        self._pre_vote = (now, quiet_since)
        return StartPreVote()

    def on_pre_vote(
        self, now: float, statuses: Iterable[pb.StatusResponse | None]
    ) -> Stand | StandDown:
        """The peers' answers to the pre-vote `tick` asked for (None: a peer that did not
        answer): stand, or stand down with the reason."""
        if self._pre_vote is None:
            return StandDown("no pre-vote under way")
        started, quiet_since = self._pre_vote
        self._pre_vote = None
        tally = PreVote(self.replicas, self.address)
        for status in statuses:
            tally.add(status)
        if not tally.stand():
            # Peers follow a live leader: listen for it a fresh timeout (its heartbeats, not
            # their word, make it live here: `last_heard` stays)
            self.pre_voted = now
            self.timeout = self._fresh_timeout()
            return StandDown(tally.reason())
        cancelled = self._cancelled(quiet_since)
        if cancelled:
            self.timeout = self._fresh_timeout()
            return StandDown(cancelled)
        self.leader_id = None
        self.leader_address = ""
        self.timeout = self._fresh_timeout()
        self.pre_voted = started  # the next attempt waits a fresh timeout
        return Stand(tally.reason())

    def _cancelled(self, quiet_since: float) -> str:
        """Why a candidacy the pre-vote allowed no longer holds ("" if it does)."""
        if self.quiet_since() > quiet_since:
            return "a heartbeat or a candidate's promise arrived during the pre-vote"
        if self.replica.status != pb.VOTING:
            return "no longer VOTING"
        if self.coordinator.phase != Phase.IDLE:
            return f"the coordinator is {self.coordinator.phase.value}"
        return ""

    # ---- other coordinators at work ----------------------------------------------------

    def on_heartbeat(
        self, now: float, leader: int, leader_address: str, proposal: int
    ) -> StepDown | None:
        """A heartbeat of another replica's leader: follow it, and `StepDown` if our
        coordinator is electing, filling or leading below it."""
        step = None
        if self.coordinator.phase != Phase.IDLE and proposal > self.coordinator.proposal:
            # Someone was elected above us (while we lead, or still elect or fill): our
            # next write would be rejected anyway.
            step = StepDown("a leader with a higher proposal is live")
        if step is not None or not self.coordinator.leading:
            self.leader_id = leader
            self.leader_address = leader_address
            self.last_heard = now
        return step

    def on_promise_accepted(self, now: float, candidate: int) -> None:
        """This replica accepted a promise: another candidate's defers our own candidacy
        (record it before the promise is persisted, so none starts meanwhile)."""
        if candidate != self.id:
            self.candidate_heard = now

    def refuses(self, candidate: int, now: float) -> bool:
        """Whether to refuse a candidate's implicit promise: a VOTING replica that hears a
        live leader refuses other candidates (without changing its promise), keeping the
        leader stable. Always safe: a refusal only withholds a vote."""
        if self.replica.status != pb.VOTING or self.leader_id is None:
            return False
        if candidate == self.leader_id:
            return False
        if self.leader_id == self.id:
            return self.coordinator.leading
        if self.gone():
            return False
        return now - self.last_heard < self.election_timeout

    def live_leader(self, now: float) -> str:
        """The leader's address if this replica leads or heard it within T; empty
        otherwise (a stale leader must not look alive to a pre-vote)."""
        if self.coordinator.leading:
            return self.address
        if self.leader_id is None or self.gone():
            return ""
        if now - self.last_heard >= self.election_timeout:
            return ""
        return self.leader_address

    def leader_gone(self, now: float, leader: int) -> None:
        """Every write connection `leader` had opened to this replica closed (the driver
        counts them). Heard of a leader we do not follow, or while we lead: nothing."""
        if leader != self.leader_id or leader == self.id or self.gone():
            return
        self.gone_at = now
        self.gone_wait = self.rng.uniform(self.election_timeout / 4, self.election_timeout / 2)

    def listen(self, now: float) -> None:
        """Count the leader last heard as heard now (a replica that just turned VOTING
        first listens for it)."""
        self.last_heard = now

    # ---- our own coordinator's leadership ----------------------------------------------

    def on_leading(self, now: float) -> None:
        """Our coordinator leads (its `Leading` output)."""
        self.leader_id = self.id
        self.leader_address = self.address
        self._leading = True
        self.peer_answered = {}
        self.leading_since = now

    def on_peer_answered(self, now: float, peer: int) -> None:
        """A peer answered our coordinator (a Write or heartbeat reply, whatever the
        verdict): it is reachable, for the check-quorum."""
        if peer != self.id:
            self.peer_answered[peer] = now

    def check_quorum(self, now: float) -> StepDown | None:
        """While leading: `StepDown` if fewer than a quorum (counting ourselves) answered
        within the last 2T. A peer not heard from since we lead counts as heard when we
        started leading."""
        if not self._leading or not self.coordinator.leading:
            return None
        window = CHECK_QUORUM_TIMEOUTS * self.election_timeout
        since = now - window
        heard = 1 + sum(
            1
            for peer in range(self.replicas)
            if peer != self.id and self.peer_answered.get(peer, self.leading_since) > since
        )
        quorum = self.replicas // 2 + 1
        if heard >= quorum:
            return None
        return StepDown(
            f"check-quorum: heard from {heard} of {self.replicas} replicas (counting this "
            f"one) within {window:g} s (two election timeouts); a quorum is {quorum}"
        )

    def on_demoted(self, now: float, retry_after: float) -> bool:
        """Our coordinator stopped electing, filling or leading (its `Demoted` output):
        stand again no sooner than `retry_after`. Returns whether it was leading (demoted)
        rather than losing an election or a fill."""
        was_leading, self._leading = self._leading, False
        if self.leader_id == self.id:
            self.leader_id = None
            self.leader_address = ""
        self.retry_at = now + retry_after
        return was_leading

    def stepped_down(self, now: float) -> None:
        """Our leader stepped down (on request, or check-quorum): give another replica the
        chance, stand again no sooner than 3T (module docstring)."""
        self.retry_at = now + STEPPED_DOWN_TIMEOUTS * self.election_timeout
