"""Paxos rounds as pure bookkeeping: tallying replies and choosing what a fill writes.

A round (an implicit promise, an explicit promise for a batch of positions, or a write of a
batch) is sent to every replica; `Tally` counts the distinct replies and says when the round
is decided. The coordinator (coordinator.py) and catch-up drive rounds with it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.peer_version import PROTOCOL


class Outcome(enum.Enum):
    PENDING = "pending"
    ACCEPTED = "accepted"  # a quorum accepted
    REJECTED = "rejected"  # some replica holds a higher promise
    IMPOSSIBLE = "impossible"  # too many IGNORED or failed replies for a quorum of accepts


class Tally:
    """Replies of one round, one per replica (duplicates are ignored)."""

    def __init__(self, replicas: int, quorum: int) -> None:
        self.replicas = replicas
        self.quorum = quorum
        self.accepts: dict[int, pb.PromiseResponse | pb.WriteResponse] = {}
        self.unavailable: set[int] = set()  # IGNORED or transport failure
        self.rejected_by = 0  # highest promise carried by a REJECT, 0 if none

    def add(self, replica: int, response: pb.PromiseResponse | pb.WriteResponse) -> None:
        if replica in self.accepts or replica in self.unavailable:
            return
        if response.verdict == pb.ACCEPT:
            self.accepts[replica] = response
        elif response.verdict == pb.REJECT:
            # A replica that rejected will not accept this round: it counts as unavailable.
            self.unavailable.add(replica)
            self.rejected_by = max(self.rejected_by, response.proposal, 1)
        else:
            self.unavailable.add(replica)

    def fail(self, replica: int) -> None:
        if replica not in self.accepts:
            self.unavailable.add(replica)

    def record(
        self, replica: int, response: pb.PromiseResponse | pb.WriteResponse | None
    ) -> Outcome:
        """Count a reply, or a failed request (None); return the round's outcome."""
        if response is None:
            self.fail(replica)
        else:
            self.add(replica, response)
        return self.outcome

    @property
    def outcome(self) -> Outcome:
        if self.rejected_by:
            return Outcome.REJECTED
        if len(self.accepts) >= self.quorum:
            return Outcome.ACCEPTED
        if self.replicas - len(self.unavailable) < self.quorum:
            return Outcome.IMPOSSIBLE
        return Outcome.PENDING


def choose_fill_value(position: int, replies: list[pb.Action]) -> tuple[pb.Action, bool]:
    """Given a quorum's explicit-promise replies for `position` (each the record as it was
    before the promise), return the action to settle the position with, and whether it is
    already learned (then it is broadcast as learned, with no write).

    Paxos: a learned value is final; otherwise the value accepted at the highest proposal
    must be re-proposed, origin included (it is still that request's entry); with none, the
    position gets a NOP."""
    for action in replies:
        if action.learned:
            chosen = pb.Action()
            chosen.CopyFrom(action)
            chosen.position = position
            return chosen, True
    best: pb.Action | None = None
    for action in replies:
        if action.performed and (best is None or action.performed > best.performed):
            best = action
    if best is None:
        return pb.Action(position=position, type=pb.NOP), False
    fill = entry_of(best)
    fill.position = position
    return fill, False


def entry_of(action: pb.Action) -> pb.Action:
    """The proposable part of an action (what a write carries), its origin included."""
    return pb.Action(
        position=action.position,
        type=action.type,
        value=action.value,
        truncate_to=action.truncate_to,
        tombstone=action.tombstone,
        origin_proposal=action.origin_proposal,
        origin_leader=action.origin_leader,
        batch_first=action.batch_first,
        batch_last=action.batch_last,
        session=action.session,
        sequence=action.sequence,
        epoch=action.epoch,
        session_check=action.session_check,
    )


BatchKey = tuple[int, int, int, int]  # origin_proposal, origin_leader, batch_first, batch_last


def batch_of(action: pb.Action) -> BatchKey | None:
    """The client batch (one `Append` call) an entry belongs to, or None for an entry that
    is a batch of one (a single entry, a NOP, an entry stored before batches were marked).
    The origin makes it unique: one leader at a proposal places each position once."""
    if action.batch_last <= action.batch_first:
        return None
    return (action.origin_proposal, action.origin_leader, action.batch_first, action.batch_last)


class Elsewhere(enum.Enum):
    """What a fill knows of a position outside the positions it has answers for."""

    UNKNOWN = "unknown"  # no answer yet: the fill must promise it too (an extension)
    TRUNCATED = "truncated"  # below the log's beginning: no longer part of the log


# For a position outside the fill's answers: the batch of the value settled there (None: a
# value of no batch, or nothing can be chosen there below the fill's proposal), or Elsewhere.
Lookup = Callable[[int], BatchKey | Elsewhere | None]


def broken_batches(
    values: Mapping[int, pb.Action], elsewhere: Lookup
) -> tuple[set[BatchKey], list[int]]:
    """The batch rule (docs/protocol.md, "Atomic batches"). `values` holds each answered
    position's value by the classic rule (`choose_fill_value`). A batch that is that value
    somewhere may be proposed only if it is that value at every position of its range that
    is still in the log; otherwise it was chosen nowhere, and the positions where it won
    get a NOP. Returns the batches to replace by NOPs, and the positions (outside `values`)
    still to be promised before the batches that reach them can be judged."""
    judged: set[BatchKey] = set()
    broken: set[BatchKey] = set()
    missing: set[int] = set()
    for action in values.values():
        key = batch_of(action)
        if key is None or key in judged:
            continue
        judged.add(key)
        unknown: list[int] = []
        for position in range(key[2], key[3] + 1):
            here = values.get(position)
            found: BatchKey | Elsewhere | None
            if here is not None:
                found = Elsewhere.TRUNCATED if here.tombstone else batch_of(here)
            else:
                found = elsewhere(position)
            if found is Elsewhere.TRUNCATED:
                continue
            if found is Elsewhere.UNKNOWN:
                unknown.append(position)
            elif found != key:
                broken.add(key)
                break
        if key not in broken:
            missing.update(unknown)
    return broken, sorted(missing)


class FillRound:
    """Settle a batch of positions by Paxos (the Mesos fill): an explicit promise for all of
    them, then one write of each position that no reply showed learned (the value accepted
    at the highest proposal, or a NOP). Used by the coordinator after its election and by
    catch-up. Pure: the caller sends the requests and feeds the replies back.

    With `elsewhere` (the batch rule), a client batch is chosen all or none: a batch the
    answers show reaching outside the positions is judged on all of its positions, those
    outside being looked up in `elsewhere` or, when unknown, promised in an extension stage
    (repeated until no batch reaches further); all positions then go out in one write, so a
    batch re-proposed here travels whole. Without it (None: the test-only split fill), each
    position is settled on its own, as before batches were marked."""

    def __init__(
        self,
        positions: list[int],
        proposal: int,
        replicas: int,
        quorum: int,
        elsewhere: Lookup | None = None,
    ) -> None:
        self.positions = list(positions)  # every position of the round, extensions included
        self.promising = list(positions)  # the positions of the current promise stage
        self.proposal = proposal
        self.replicas = replicas
        self.quorum = quorum
        self.elsewhere = elsewhere
        self.tally = Tally(replicas, quorum)
        self.values: dict[int, pb.Action] = {}  # answered positions: value by the classic rule
        self.adopted: list[pb.Action] = []  # learned somewhere already: no write
        self.writing: list[pb.Action] | None = None  # None until the promise stages are decided

    def promise_request(self, candidate: int, log_id: str) -> pb.PromiseRequest:
        return pb.PromiseRequest(
            proposal=self.proposal,
            positions=self.promising,
            candidate=candidate,
            log_id=log_id,
            protocol=PROTOCOL,
        )

    def add(self, replica: int, response: pb.PromiseResponse | pb.WriteResponse | None) -> Outcome:
        """Count a reply (None: the request failed) of the current stage."""
        if response is not None and isinstance(response, pb.WriteResponse) != (
            self.writing is not None
        ):
            return self.tally.outcome  # a reply of the other stage
        return self.tally.record(replica, response)

    def decide(self, leader: int, log_id: str) -> pb.PromiseRequest | pb.WriteRequest | None:
        """After a quorum of promises: either promise more positions (an extension: a batch
        reaches positions not answered yet; send it, same proposal, and call again after its
        quorum), or choose each position's value and return the write to send (same
        proposal), or None when every position was already learned."""
        replies: dict[int, list[pb.Action]] = {p: [] for p in self.promising}
        for reply in self.tally.accepts.values():
            if isinstance(reply, pb.PromiseResponse):
                for action in reply.actions:
                    if action.position in replies:
                        replies[action.position].append(action)
        for position in self.promising:
            self.values[position] = choose_fill_value(position, replies[position])[0]
        self.tally = Tally(self.replicas, self.quorum)
        if self.elsewhere is not None:
            broken, missing = broken_batches(self.values, self.elsewhere)
            if missing:
                self.promising = missing
                self.positions.extend(missing)
                return self.promise_request(leader, log_id)
            for position, action in self.values.items():
                if not action.learned and batch_of(action) in broken:
                    self.values[position] = pb.Action(position=position, type=pb.NOP)
        self.writing = []
        for position in sorted(self.values):
            action = self.values[position]
            (self.adopted if action.learned else self.writing).append(action)
        if not self.writing:
            return None
        return pb.WriteRequest(
            proposal=self.proposal,
            actions=[entry_of(a) for a in self.writing],
            leader=leader,
            log_id=log_id,
            protocol=PROTOCOL,
        )

    def chosen(self) -> list[pb.Action]:
        """Every position's settled value, as learned actions (after a successful write)."""
        return [learned(a) for a in self.adopted + (self.writing or [])]


def learned(action: pb.Action) -> pb.Action:
    """A copy of `action` marked learned, without Paxos bookkeeping (for learned messages)."""
    copy = pb.Action()
    copy.CopyFrom(action)
    copy.learned = True
    copy.promised = 0
    copy.performed = 0
    return copy
