"""A deterministic in-process simulation of rlog's pure protocol core.

Replicas are `ReplicaCore`s over in-memory storage; coordinators are `Coordinator`s; the
network is a pool of messages that a schedule delivers, drops, duplicates and reorders.
Replicas crash and restart from their storage. Used by the randomized tests; it performs no
I/O, so a hypothesis-found schedule replays exactly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import (
    Coordinator,
    CoordinatorConfig,
    Demoted,
    Done,
    Failed,
    Send,
    SetTimer,
)
from rlog.protocol.recover import Next, RecoverRound
from rlog.protocol.replica import ReplicaCore
from rlog.storage.memory import MemoryStorage


@dataclass
class Message:
    coordinator: int
    replica: int
    round: int
    request: pb.PromiseRequest | pb.WriteRequest | pb.LearnedRequest | None
    response: pb.PromiseResponse | pb.WriteResponse | None = None  # set: a reply


@dataclass
class Violation(AssertionError):
    text: str


@dataclass
class Sim:
    replicas: int
    coordinators: int
    seed: int = 0
    network: list[Message] = field(default_factory=list)
    timers: list[tuple[int, int]] = field(default_factory=list)
    chosen: dict[int, tuple] = field(default_factory=dict)  # position -> entry
    acknowledged: dict[int, tuple] = field(default_factory=dict)  # position -> entry
    values_sent: int = 0
    failed: list[Failed] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.storages = [MemoryStorage() for _ in range(self.replicas)]
        self.cores: list[ReplicaCore] = []
        for storage in self.storages:
            core = ReplicaCore(storage)
            storage.apply(core.set_status(pb.VOTING))
            self.cores.append(core)
        self.coords = [self._new_coordinator(i) for i in range(self.coordinators)]
        self.pending: dict[tuple[int, str], tuple] = {}

    def _new_coordinator(self, replica: int) -> Coordinator:
        config = CoordinatorConfig(fill_batch=3, max_batch_entries=3, max_inflight_batches=2)
        return Coordinator(
            replica, self.replicas, self.cores[replica], config, random.Random(self.seed + replica)
        )

    # ---- events ------------------------------------------------------------------------

    def elect(self, c: int) -> None:
        self.coords[c].elect()
        self._drain(c)

    def propose(self, c: int, count: int = 1) -> None:
        coord = self.coords[c]
        for _ in range(count):
            self.values_sent += 1
            value = f"c{c}-v{self.values_sent}".encode()
            token = (c, value.decode())
            self.pending[token] = entry(pb.Action(type=pb.APPEND, value=value))
            coord.propose(token, [pb.Action(type=pb.APPEND, value=value)])
        coord.pump()
        self._drain(c)

    def truncate(self, c: int, to: int) -> None:
        coord = self.coords[c]
        token = (c, f"truncate-{to}-{self.values_sent}")
        self.values_sent += 1
        action = pb.Action(type=pb.TRUNCATE, truncate_to=to)
        self.pending[token] = entry(action)
        coord.propose(token, [action])
        coord.pump()
        self._drain(c)

    def deliver(self, k: int, duplicate: bool = False) -> None:
        message = self.network[k] if duplicate else self.network.pop(k)
        if message.response is not None:
            coord = self.coords[message.coordinator]
            coord.on_reply(message.round, message.replica, message.response)
            self._drain(message.coordinator)
            return
        core = self.cores[message.replica]
        request = message.request
        if isinstance(request, pb.LearnedRequest):
            batch = core.on_learned(request)
            self._persist(message.replica, batch)
        else:
            if isinstance(request, pb.PromiseRequest):
                reply = core.on_promise(request)
            else:
                assert isinstance(request, pb.WriteRequest)
                reply = core.on_write(request)
            self._persist(message.replica, reply.persist)
            self.network.append(
                Message(message.coordinator, message.replica, message.round, None, reply.response)
            )
        self.check()

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
            for token in [t for t in self.pending if t[0] == replica]:
                del self.pending[token]
        self.check()

    def wipe_and_recover(self, replica: int) -> None:
        """The replica loses its disk and recovers as rlog does: a recover round among the
        others, a copy of their learned entries (Fetch), then VOTING with the adopted
        promise. The others must form a VOTING quorum."""
        self.storages[replica] = MemoryStorage()
        core = ReplicaCore(self.storages[replica])
        self.cores[replica] = core
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
        actions = source.learned_actions(decision.begin, decision.end, 1 << 30)
        self._persist(replica, core.on_learned(pb.LearnedRequest(actions=actions)))
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
                value = self.pending.pop(output.token)
                (position,) = output.positions
                if position in self.acknowledged:
                    raise Violation(f"position {position} acknowledged twice")
                self.acknowledged[position] = value
            elif isinstance(output, Failed):
                self.pending.pop(output.token, None)
                self.failed.append(output)
            elif isinstance(output, Demoted):
                pass

    # ---- invariants --------------------------------------------------------------------

    def check(self) -> None:
        """No position is ever learned with two different values, on any replica, ever."""
        for i, core in enumerate(self.cores):
            last = max(core.end, core.learned_next)
            for position in range(core.begin, last + 1):
                if not core.is_learned(position):
                    continue
                action = core.get(position)
                if action is None:
                    raise Violation(f"replica {i} learned {position} but holds nothing")
                value = entry(action)
                seen = self.chosen.setdefault(position, value)
                if seen != value:
                    raise Violation(
                        f"position {position} learned as {seen} and as {value} (replica {i})"
                    )

    def settle(self) -> Coordinator:
        """Heal the network and let one fresh coordinator take over; return it leading."""
        self.network.clear()
        self.timers.clear()
        self.coords[0] = self._new_coordinator(0)
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
        """Every value a coordinator reported appended is the learned value at its position."""
        leader_core = self.cores[0]
        for position, value in self.acknowledged.items():
            if position < leader_core.begin:
                continue  # truncated away
            if not leader_core.is_learned(position):
                raise Violation(f"acknowledged position {position} not learned after settling")
            learned = entry(leader_core.get(position))
            if learned != value:
                raise Violation(f"acknowledged {value} at {position} but learned {learned}")


def entry(action: pb.Action) -> tuple:
    return (action.type, action.value, action.truncate_to, action.tombstone)


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
