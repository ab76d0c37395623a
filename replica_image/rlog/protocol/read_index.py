"""The read index: when a leader may answer a linearizable read.

A replica that believes it leads may have been deposed without knowing it (cut off from the
majority, which elected another leader and acknowledged new appends). Before it answers a
non-stale read it confirms, after the read arrived, that a quorum still follows it: one round
of heartbeats answered by a quorum (itself included), where an answer counts only if the
peer has not promised a proposal above the leader's. The read then returns what the leader
had learned when it arrived, or more (see docs/protocol.md, "Linearizable reads").

Rounds are batched: reads that arrive while no round is in flight start one and wait for
it; reads that arrive while a round is in flight wait for the next one (the one in flight
may have been sent before they arrived). That next round is first gathered: the driver
sends it a moment after the current one ends (`Gather`), and every read that arrives
meanwhile joins it, so a stream of concurrent reads shares few rounds; a read arriving with
no round in flight or gathered is not delayed.

A pure state machine like the coordinator: the driver (runtime/read_index.py) calls `request`,
`on_answer`, `on_timeout` and `cancel`, then drains `take()`:
- `StartRound(round, proposal)`: send a heartbeat at `proposal` to every peer, feed their
  answers to `on_answer(round, ...)`, and call `on_timeout(round)` if the round is not
  over after a while (the round is then sent again, with every read still waiting);
- `Confirmed(tokens)`: leadership was confirmed after these reads arrived: serve them;
- `Gather(round)`: a next round is gathering reads: call `send_due(round)` shortly (it then
  emits its `StartRound`).
Reads give up by their own deadline (`cancel`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StartRound:
    """Heartbeat every peer at `proposal`; their answers go to `on_answer(round, ...)`."""

    round: int
    proposal: int


@dataclass(frozen=True)
class Confirmed:
    """A quorum followed this leader at `proposal` after these reads arrived: serve them
    (if the driver's coordinator still leads at `proposal`)."""

    tokens: tuple[object, ...]
    proposal: int


@dataclass(frozen=True)
class Gather:
    """Round `round` gathers the reads arriving now; call `send_due(round)` shortly."""

    round: int


ReadIndexOutput = StartRound | Confirmed | Gather


class ReadIndex:
    def __init__(self, replica_id: int, replicas: int) -> None:
        self.id = replica_id
        self.quorum = replicas // 2 + 1
        self.round = 0  # the round in flight (or gathering); 0: none
        self.gathering = False  # the round is not sent yet: reads arriving join it
        self.proposal = 0  # the round in flight's proposal
        self._rounds = 0  # the last round id handed out
        self._answered: set[int] = set()  # replicas that confirmed the round in flight
        self._in_round: list[object] = []  # reads waiting for the round in flight
        self._next: list[object] = []  # reads that arrived after it was sent
        self._outputs: list[ReadIndexOutput] = []

    def take(self) -> list[ReadIndexOutput]:
        outputs, self._outputs = self._outputs, []
        return outputs

    @property
    def waiting(self) -> int:
        """How many reads wait for a confirmation."""
        return len(self._in_round) + len(self._next)

    def request(self, token: object, proposal: int) -> None:
        """A read arrived at a leader at `proposal`: it waits for a round sent after now."""
        if self.round:
            (self._in_round if self.gathering else self._next).append(token)
            return
        self._in_round.append(token)
        self._start(proposal)

    def on_answer(self, round_id: int, peer: int, promised: int) -> None:
        """A peer answered round `round_id`'s heartbeat with its promise: it counts if it has
        not promised a higher proposal (it still lets this leader's writes through)."""
        if round_id != self.round or self.gathering or promised > self.proposal:
            return
        self._answered.add(peer)
        self._check()

    def on_timeout(self, round_id: int) -> None:
        """Round `round_id` has not reached a quorum in time: send a new round for every read
        still waiting (all arrived before it), unless none waits."""
        if round_id != self.round or self.gathering:
            return
        self._in_round.extend(self._next)
        self._next = []
        self.round = 0
        if self._in_round:
            self._start(self.proposal)

    def cancel(self, token: object) -> None:
        """A read gave up (its deadline passed, or the leader stepped down)."""
        for waiting in (self._in_round, self._next):
            if token in waiting:
                waiting.remove(token)

    def cancel_all(self) -> list[object]:
        """Leadership was lost: forget every read and the round; returns the reads."""
        tokens = self._in_round + self._next
        self._in_round, self._next = [], []
        self.round = 0
        self.gathering = False
        return tokens

    def send_due(self, round_id: int) -> None:
        """Round `round_id` has gathered its reads: send it."""
        if round_id != self.round or not self.gathering:
            return
        self.gathering = False
        if not self._in_round:  # every read gathered gave up meanwhile
            self.round = 0
            return
        self._send()

    def _start(self, proposal: int, gather: bool = False) -> None:
        self._rounds += 1
        self.round = self._rounds
        self.proposal = proposal
        if gather:
            self.gathering = True
            self._outputs.append(Gather(self.round))
            return
        self._send()

    def _send(self) -> None:
        self._answered = {self.id}  # the leader follows itself
        self._outputs.append(StartRound(self.round, self.proposal))
        self._check()

    def _check(self) -> None:
        if len(self._answered) < self.quorum:
            return
        confirmed, self._in_round = self._in_round, self._next
        self._next = []
        proposal = self.proposal
        self.round = 0
        if confirmed:
            self._outputs.append(Confirmed(tuple(confirmed), proposal))
        if self._in_round:
            # Reads that arrived during the round: their round gathers more before it leaves
            # (not with a single replica: it confirms at once, with no messages to save).
            self._start(proposal, gather=self.quorum > 1)
