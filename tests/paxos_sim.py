"""A deterministic in-process simulation of rlog's pure protocol core.

Replicas are `ReplicaCore`s over in-memory storage; coordinators are `Coordinator`s; the
network is a pool of messages that a schedule delivers, drops, duplicates and reorders.
Replicas crash and restart from their storage. Used by the randomized tests; it performs no
I/O, so a hypothesis-found schedule replays exactly.

Elections arise two ways: `elect` makes a coordinator stand at once (any time, the harshest
case for safety), and the election rules of rlog (`Election`, one per replica, on a simulated
clock) make them stand by timeouts: `advance` moves the clock, leading coordinators send
heartbeats into the network, each coordinator's election timer ticks and may ask for a
pre-vote, which `answer_pre_vote` answers later from the replicas' states at that moment
(heartbeats or promises delivered in between cancel the candidacy). Delivered heartbeats
reset followers' timers and step down coordinators below them; with `refuse_rivals`, a
replica that hears a live leader refuses other candidates' implicit promises, as rlog does.
Heartbeats are answered (a message back that may be lost like any other); a leader that has
not had answers (to heartbeats or writes) from a quorum within 2T steps down at its next
`advance` (check-quorum), and one answered with a promise above its proposal is demoted at
once (`Coordinator.on_peer_promise`), as rlog does.

Requests may carry several entries (`propose_batch`, one `Append` call's values); the
simulation checks at every step that a batch is never chosen in part nor scattered (every
learned position of its range holds its entry, in order) and, after `settle`, that it is
whole or absent (`check_batches`). `split_fill` turns the batch-aware fill off, as the
test-only `RLOG_UNSAFE_SPLIT_FILL=1` does, to show that the check finds the difference.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import AdmissionState
from rlog.protocol.coordinator import (
    Coordinator,
    CoordinatorConfig,
    Demoted,
    Done,
    Failed,
    Leading,
    Phase,
    Send,
    SetTimer,
)
from rlog.protocol.election import Election, Stand
from rlog.protocol.recover import Next, RecoverRound
from rlog.protocol.replica import ReplicaCore
from rlog.storage.memory import MemoryStorage


@dataclass
class Message:
    coordinator: int
    replica: int
    round: int
    request: pb.PromiseRequest | pb.WriteRequest | pb.LearnedRequest | None
    # set: a reply (LearnedResponse: to a heartbeat)
    response: pb.PromiseResponse | pb.WriteResponse | pb.LearnedResponse | None = None


@dataclass
class Violation(AssertionError):
    text: str


T = 1.0  # the simulated replicas' election timeout, in simulated seconds


class NoCoordinator:
    """What the election of a replica without a coordinator sees: one that never runs."""

    phase = Phase.IDLE
    proposal = 0
    leading = False


def address(replica: int) -> str:
    return f"r{replica}"


@dataclass
class Sim:
    replicas: int
    coordinators: int
    seed: int = 0
    network: list[Message] = field(default_factory=list)
    timers: list[tuple[int, int]] = field(default_factory=list)
    chosen: dict[int, tuple] = field(default_factory=dict)  # position -> entry + origin
    acknowledged: dict[int, tuple] = field(default_factory=dict)  # position -> entry
    # position -> origin of the acknowledged request's own write (its leader's proposal, id)
    acknowledged_origin: dict[int, tuple] = field(default_factory=dict)
    values_sent: int = 0
    payloads: list[bytes] = field(default_factory=list)  # every single append value proposed
    failed: list[Failed] = field(default_factory=list)
    refuse_rivals: bool = False
    now: float = 0.0  # the simulated clock of the election rules
    pre_votes: list[int] = field(default_factory=list)  # coordinators awaiting answers
    timed_elections: int = 0  # candidacies that came from an election timeout
    timed_leaders: int = 0  # ... and ended up leading
    refused: int = 0  # implicit promises refused because a live leader was heard
    # requests repeating a payload already learned at the position their leader writes next
    duplicates_of_learned: int = 0
    quorum_step_downs: int = 0  # leaders that stepped down by check-quorum
    split_fill: bool = False  # the test-only per-position fill (RLOG_UNSAFE_SPLIT_FILL)
    # Multi-entry requests: each batch's payloads in order, which batch and index a payload
    # is, and where a batch sits (its first position) once any of its entries is learned.
    batches: list[list[bytes]] = field(default_factory=list)
    batch_member: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    batch_base: dict[int, int] = field(default_factory=dict)
    # position -> (batch, index) of the entry a placed batch needs there
    batch_slots: dict[int, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.storages = [MemoryStorage() for _ in range(self.replicas)]
        self.cores: list[ReplicaCore] = []
        for storage in self.storages:
            core = ReplicaCore(storage)
            storage.apply(core.set_status(pb.VOTING))
            self.cores.append(core)
        self.coords = [self._new_coordinator(i) for i in range(self.coordinators)]
        self.elections = [self._new_election(i) for i in range(self.replicas)]
        self._timed: set[int] = set()  # coordinators whose candidacy came from a timeout
        self.pending: dict[tuple[int, str], tuple] = {}

    def _new_coordinator(self, replica: int) -> Coordinator:
        config = CoordinatorConfig(
            fill_batch=3, max_batch_entries=3, max_inflight_batches=2, split_fill=self.split_fill
        )
        return Coordinator(
            replica, self.replicas, self.cores[replica], config, random.Random(self.seed + replica)
        )

    def _new_election(self, replica: int) -> Election:
        """A replica's election state, fresh as in a (re)started process."""
        coordinator = self.coords[replica] if replica < self.coordinators else NoCoordinator()
        return Election(
            replica,
            address(replica),
            self.replicas,
            T,
            self.cores[replica],
            coordinator,
            self.now,
            random.Random(self.seed * 7 + 1000 + replica),
        )

    # ---- events ------------------------------------------------------------------------

    def elect(self, c: int) -> None:
        if self.coords[c].phase == Phase.IDLE:
            self._timed.discard(c)
        self.coords[c].elect()
        self._drain(c)

    def advance(self, dt: float) -> None:
        """Move the clock: leaders heartbeat, then every coordinator's election timer ticks."""
        self.now += dt
        for c, coord in enumerate(self.coords):
            if not coord.leading:
                continue
            heartbeat = pb.LearnedRequest(
                proposal=coord.proposal,
                leader=c,
                leader_address=address(c),
                leader_learned=self.cores[c].learned,
            )
            for replica in range(self.replicas):
                if replica != c:
                    self.network.append(Message(c, replica, 0, heartbeat))
        for c in range(self.coordinators):
            step_down = self.elections[c].check_quorum(self.now)
            if step_down is not None:
                self.quorum_step_downs += 1
                self.coords[c].step_down(step_down.reason)
                self._drain(c)
                self.elections[c].stepped_down(self.now)
            if self.elections[c].tick(self.now) is not None:
                self.pre_votes.append(c)

    def answer_pre_vote(self, k: int) -> None:
        """The peers' Status answers to a pending pre-vote, as they are now."""
        c = self.pre_votes.pop(k)
        statuses = [self.status(replica) for replica in range(self.replicas) if replica != c]
        if isinstance(self.elections[c].on_pre_vote(self.now, statuses), Stand):
            self.timed_elections += 1
            self._timed.add(c)
            self.coords[c].elect()
            self._drain(c)

    def status(self, replica: int) -> pb.StatusResponse:
        leading = replica < self.coordinators and self.coords[replica].leading
        return pb.StatusResponse(
            id=replica,
            status=self.cores[replica].status,
            role="leader" if leading else "follower",
            leader=self.elections[replica].live_leader(self.now),
            address=address(replica),
        )

    def propose(self, c: int, count: int = 1) -> None:
        coord = self.coords[c]
        for _ in range(count):
            self.values_sent += 1
            value = f"c{c}-v{self.values_sent}".encode()
            self.payloads.append(value)
            self._propose_append(c, (c, value.decode()), value)
        coord.pump()
        self._drain(c)

    def propose_batch(self, c: int, size: int) -> None:
        """One request of `size` entries (one `Append` call with several values)."""
        self.values_sent += 1
        batch = len(self.batches)
        values = [f"c{c}-b{batch}-{i}".encode() for i in range(size)]
        self.batches.append(values)
        for i, value in enumerate(values):
            self.batch_member[value] = (batch, i)
        actions = [pb.Action(type=pb.APPEND, value=value) for value in values]
        token = (c, f"batch{batch}")
        self.pending[token] = [entry(a) for a in actions]
        self.coords[c].propose(token, actions)
        self.coords[c].pump()
        self._drain(c)

    def propose_duplicate(self, c: int, value: bytes) -> None:
        """A new request (its own token) whose value repeats one proposed earlier, by any
        coordinator: two clients appending identical payloads. Each must be acknowledged
        only at a position holding its own entry."""
        self.values_sent += 1
        position = self.coords[c].next_position
        # (a position below a replica's begin is learned there but no longer held)
        if any(
            core.is_learned(position)
            and position >= core.begin
            and core.get(position).value == value
            for core in self.cores
        ):
            self.duplicates_of_learned += 1
        self._propose_append(c, (c, f"dup{self.values_sent}-{value.decode()}"), value)
        self.coords[c].pump()
        self._drain(c)

    def duplicate_candidates(self, c: int) -> list[bytes]:
        """Payloads worth repeating through coordinator `c`: those some replica holds at the
        position `c` writes next (a successor may have chosen it already), else the latest
        ones proposed."""
        position = self.coords[c].next_position
        held = [core.get(position) for core in self.cores]
        candidates = [a.value for a in held if a is not None and a.type == pb.APPEND]
        # A batch's payloads stay unique, so that where they are learned says where the
        # batch is (its entries are recognized by payload, never by the fields under test).
        candidates = [v for v in candidates if v not in self.batch_member]
        return candidates or self.payloads[-4:]

    def _propose_append(self, c: int, token: tuple[int, str], value: bytes) -> None:
        self.pending[token] = [entry(pb.Action(type=pb.APPEND, value=value))]
        self.coords[c].propose(token, [pb.Action(type=pb.APPEND, value=value)])

    def truncate(self, c: int, to: int) -> None:
        coord = self.coords[c]
        token = (c, f"truncate-{to}-{self.values_sent}")
        self.values_sent += 1
        action = pb.Action(type=pb.TRUNCATE, truncate_to=to)
        self.pending[token] = [entry(action)]
        coord.propose(token, [action])
        coord.pump()
        self._drain(c)

    def deliver(self, k: int, duplicate: bool = False) -> None:
        message = self.network[k] if duplicate else self.network.pop(k)
        if message.response is not None:
            self.elections[message.coordinator].on_peer_answered(self.now, message.replica)
            coord = self.coords[message.coordinator]
            if isinstance(message.response, pb.LearnedResponse):
                # A heartbeat's answer: the check-quorum counts it, and a promise above the
                # leader's proposal demotes it (runtime/election.py does the same).
                if coord.on_peer_promise(message.replica, message.response.promised):
                    self._drain(message.coordinator)
                return
            coord.on_reply(message.round, message.replica, message.response)
            self._drain(message.coordinator)
            return
        core = self.cores[message.replica]
        request = message.request
        if isinstance(request, pb.LearnedRequest):
            if request.leader_address and request.leader != message.replica:
                self._heartbeat(message.replica, request)
            batch = core.on_learned(request)
            self._persist(message.replica, batch)
            if request.leader_address:
                answer = pb.LearnedResponse(promised=core.promised)
                self.network.append(Message(message.coordinator, message.replica, 0, None, answer))
        else:
            response: pb.PromiseResponse | pb.WriteResponse
            if isinstance(request, pb.PromiseRequest):
                response = self._promise(message.replica, request)
            else:
                assert isinstance(request, pb.WriteRequest)
                reply = core.on_write(request)
                self._persist(message.replica, reply.persist)
                assert isinstance(reply.response, pb.WriteResponse)
                response = reply.response
            self.network.append(
                Message(message.coordinator, message.replica, message.round, None, response)
            )
        self.check()

    def _promise(self, replica: int, request: pb.PromiseRequest) -> pb.PromiseResponse:
        core, election = self.cores[replica], self.elections[replica]
        if (
            self.refuse_rivals
            and not request.positions
            and election.refuses(request.candidate, self.now)
        ):
            self.refused += 1
            return pb.PromiseResponse(
                verdict=pb.REJECT, proposal=core.promised, begin=core.begin, status=core.status
            )
        reply = core.on_promise(request)
        assert isinstance(reply.response, pb.PromiseResponse)
        if reply.response.verdict == pb.ACCEPT:
            election.on_promise_accepted(self.now, request.candidate)
        self._persist(replica, reply.persist)
        return reply.response

    def _heartbeat(self, replica: int, heartbeat: pb.LearnedRequest) -> None:
        step_down = self.elections[replica].on_heartbeat(
            self.now, heartbeat.leader, heartbeat.leader_address, heartbeat.proposal
        )
        if replica < self.coordinators:
            if step_down is not None:
                self.coords[replica].step_down(step_down.reason)
                self._drain(replica)
            self.coords[replica].observe(heartbeat.proposal)

    def drop(self, k: int) -> None:
        self.network.pop(k)

    def fire_timer(self, k: int) -> None:
        c, round_id = self.timers.pop(k)
        self.coords[c].on_timeout(round_id)
        self._drain(c)

    def crash(self, replica: int) -> None:
        """Restart a replica from its disk; a coordinator living there restarts too."""
        self.cores[replica] = ReplicaCore(self.storages[replica])
        if replica < self.coordinators:
            self.coords[replica] = self._new_coordinator(replica)
            self.network = [m for m in self.network if m.coordinator != replica]
            self.timers = [t for t in self.timers if t[0] != replica]
            self.pre_votes = [c for c in self.pre_votes if c != replica]
            self._timed.discard(replica)
            for token in [t for t in self.pending if t[0] == replica]:
                del self.pending[token]
        self.elections[replica] = self._new_election(replica)
        # Its connections closed with it: the others hear that the leader they followed, if
        # it was this one, is gone (runtime/leader_links.py).
        for other, election in enumerate(self.elections):
            if other != replica:
                election.leader_gone(self.now, replica)
        self.check()

    def wipe_and_recover(self, replica: int) -> None:
        """The replica loses its disk and recovers as rlog does: a recover round among the
        others, a copy of their learned entries (Fetch), then VOTING with the adopted
        promise. The others must form a VOTING quorum."""
        self.storages[replica] = MemoryStorage()
        core = ReplicaCore(self.storages[replica])
        self.cores[replica] = core
        self.elections[replica] = self._new_election(replica)
        round_ = RecoverRound(self.replicas, core.status, permit=False)
        decision = None
        for other, peer in enumerate(self.cores):
            response = pb.RecoverResponse(status=peer.status)
            if peer.status == pb.VOTING:
                response.begin, response.end = peer.begin, peer.end
                response.promised = peer.promised
            decision = round_.add(other, response) or decision
        assert decision is not None and decision.next == Next.RECOVER, round_.reason()
        self._persist(replica, core.set_status(pb.RECOVERING))
        source = self.cores[decision.sources[0]]
        records = source.learned_records(decision.begin, decision.end, 1 << 30)
        copied = pb.FetchResponse(  # as catch-up learns them: a Fetch answer, given up
            actions=[r for r in records if isinstance(r, pb.Action)],
            runs=[r for r in records if isinstance(r, pb.Run)],
            begin=source.begin,
        )
        self._persist(replica, core.on_fetched(copied))
        assert core.learned >= min(decision.end, source.learned)
        self._persist(replica, core.finish_recovery(decision.promised))
        self.check()

    def _persist(self, replica: int, batch) -> None:
        if batch is not None:
            self.storages[replica].apply(batch)
            self.cores[replica].persisted(batch)

    def _drain(self, c: int) -> None:
        for output in self.coords[c].take():
            if isinstance(output, Send):
                self.network.append(Message(c, output.to, output.round, output.message))
            elif isinstance(output, SetTimer):
                self.timers.append((c, output.round))
            elif isinstance(output, Done):
                values = self.pending.pop(output.token)
                positions = output.positions
                if len(positions) != len(values) or positions != list(
                    range(positions[0], positions[0] + len(values))
                ):
                    raise Violation(f"{output.token} acknowledged at positions {positions}")
                for position, value in zip(positions, values, strict=True):
                    if position in self.acknowledged:
                        raise Violation(f"position {position} acknowledged twice")
                    self.acknowledged[position] = value
                    self.acknowledged_origin[position] = (self.coords[c].proposal, c)
            elif isinstance(output, Failed):
                self.pending.pop(output.token, None)
                self.failed.append(output)
            elif isinstance(output, Leading):
                # No conditional or session appends here: an empty admission state is exact.
                self.coords[c].admission_ready(
                    output.proposal, AdmissionState(1 << 40, output.next_position)
                )
                self.elections[c].on_leading(self.now)
                if c in self._timed:
                    self.timed_leaders += 1
            elif isinstance(output, Demoted):
                self.elections[c].on_demoted(self.now, output.retry_after)
                self._timed.discard(c)

    # ---- invariants --------------------------------------------------------------------

    def check(self) -> None:
        """No position is ever learned with two different values (content or origin), on
        any replica, ever."""
        for i, core in enumerate(self.cores):
            last = max(core.end, core.learned_next)
            for position in range(core.begin, last + 1):
                if not core.is_learned(position):
                    continue
                action = core.get(position)
                if action is None:
                    raise Violation(f"replica {i} learned {position} but holds nothing")
                value = entry(action) + origin(action)
                seen = self.chosen.setdefault(position, value)
                if seen != value:
                    raise Violation(
                        f"position {position} learned as {seen} and as {value} (replica {i})"
                    )
                if seen is value:
                    self._check_batch_at(position, action)

    def _check_batch_at(self, position: int, action: pb.Action) -> None:
        """A position was learned for the first time: if it is a batch's entry, the batch sits
        at consecutive positions and every learned position of its range holds its entry;
        if it lies in a placed batch's range, it holds that batch's entry there."""
        member = self.batch_member.get(action.value) if action.type == pb.APPEND else None
        expected = self.batch_slots.get(position)
        if expected is not None and member != expected:
            batch, index = expected
            raise Violation(
                f"batch {batch} is chosen in part: its entry {index} belongs at {position}, "
                f"which was chosen as {entry(action)}"
            )
        if member is None:
            return
        batch, index = member
        base = position - index
        placed = self.batch_base.setdefault(batch, base)
        if placed != base:
            raise Violation(
                f"batch {batch} scattered: its entry {index} at {position}, its start at {placed}"
            )
        if expected is not None:
            return  # already placed: its range was checked then
        for i in range(len(self.batches[batch])):
            slot = base + i
            self.batch_slots[slot] = (batch, i)
            held = self.chosen.get(slot)
            if held is not None and (held[0], held[1]) != (pb.APPEND, self.batches[batch][i]):
                raise Violation(
                    f"batch {batch} is chosen in part: its entry {i} belongs at {slot}, "
                    f"which was chosen as {held[:4]}"
                )

    def check_batches(self) -> None:
        """After `settle` (the leader has learned every position up to its index): a batch
        with any entry chosen is chosen whole (positions truncated away aside)."""
        begin = self.cores[0].begin
        for slot, (batch, i) in self.batch_slots.items():
            if slot >= begin and slot not in self.chosen:
                raise Violation(
                    f"batch {batch} is chosen in part: its entry {i} at {slot} was never chosen"
                )

    def settle(self) -> Coordinator:
        """Heal the network and let one fresh coordinator take over; return it leading.
        The other coordinators step down and the clock moves past any live leader, so no
        replica refuses the newcomer."""
        self.network.clear()
        self.timers.clear()
        self.pre_votes.clear()
        for c in range(1, self.coordinators):
            self.coords[c].step_down("settling")
            self._drain(c)
        self.now += 3 * T
        self.coords[0] = self._new_coordinator(0)
        self.elections[0] = self._new_election(0)
        self._timed.discard(0)
        self.pending = {t: v for t, v in self.pending.items() if t[0] != 0}
        coord = self.coords[0]
        for _ in range(20):
            if coord.leading:
                break
            coord.elect()
            self._drain(0)
            while self.network:
                message = self.network[0]
                if message.coordinator != 0:
                    self.network.pop(0)
                    continue
                self.deliver(0)
        assert coord.leading, "a lone coordinator on a healed network must be elected"
        return coord

    def check_acknowledged(self) -> None:
        """Every value a coordinator reported appended is the learned value at its position,
        and the learned entry is that request's own write (not an identical one of another
        request)."""
        leader_core = self.cores[0]
        for position, value in self.acknowledged.items():
            if position < leader_core.begin:
                continue  # truncated away
            if not leader_core.is_learned(position):
                raise Violation(f"acknowledged position {position} not learned after settling")
            learned = entry(leader_core.get(position))
            if learned != value:
                raise Violation(f"acknowledged {value} at {position} but learned {learned}")
            written_by = origin(leader_core.get(position))
            if written_by != self.acknowledged_origin[position]:
                raise Violation(
                    f"acknowledged the write {self.acknowledged_origin[position]} at {position} "
                    f"but learned the write {written_by} (identical content, another request)"
                )


def entry(action: pb.Action) -> tuple:
    return (action.type, action.value, action.truncate_to, action.tombstone)


def origin(action: pb.Action) -> tuple:
    """The write an entry came from: two requests of identical content differ here."""
    return (action.origin_proposal, action.origin_leader)


def run(sim: Sim, keep=lambda m: True) -> None:
    """Deliver every message (and every reply they cause) in order; drop those `keep`
    refuses."""
    while sim.network:
        if keep(sim.network[0]):
            sim.deliver(0)
        else:
            sim.drop(0)


def is_learned_message(message: Message) -> bool:
    return isinstance(message.request, pb.LearnedRequest)
