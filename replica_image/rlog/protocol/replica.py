"""The replica: Paxos acceptor and learner rules as a pure state machine.

`ReplicaCore` takes a request and returns the response plus the `WriteBatch` that must be on
disk before the response leaves (etcd-raft style: no I/O here). It reads stored actions
through the `Storage` interface, and keeps what it has decided but not yet seen persisted in
an overlay, so that requests handled while a group commit is in flight see their
predecessors' effects. The server applies the batches (one fsync for many) and only then
sends the responses.

Rules (the Mesos log's acceptor with rlog's tightenings, docs/protocol.md):
- not VOTING: promises and writes get IGNORED; learned messages are always applied;
- the promise guarding position p is max(metadata.promised, record.promised): an implicit
  promise needs proposal > metadata.promised, an explicit one proposal > that guard, a write
  proposal >= that guard (an equal number is the same coordinator's ballot);
- positions below begin answer a promise with a learned NOP tombstone;
- a learned position is final: a write repeating its value (the same write, `same_value`) is
  accepted without a disk write, any other write is rejected, even one of identical content;
- a batch of positions is all-or-nothing: one rejected position rejects the batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.consensus import entry_of
from rlog.storage import Storage, WriteBatch


def same_value(a: pb.Action, b: pb.Action) -> bool:
    """Whether two actions propose the same log entry (ignoring Paxos bookkeeping): the same
    content from the same write (`origin_*`). Identical content appended by two requests is
    two different entries."""
    return (
        a.type == b.type
        and a.value == b.value
        and a.truncate_to == b.truncate_to
        and a.tombstone == b.tombstone
        and a.origin_proposal == b.origin_proposal
        and a.origin_leader == b.origin_leader
        and a.batch_first == b.batch_first
        and a.batch_last == b.batch_last
        and a.session == b.session
        and a.sequence == b.sequence
        and a.epoch == b.epoch
    )


def tombstone(position: int) -> pb.Action:
    return pb.Action(position=position, type=pb.NOP, tombstone=True, learned=True)


@dataclass
class Reply:
    """A response and what must be durable before it is sent (None: nothing to persist)."""

    response: pb.PromiseResponse | pb.WriteResponse | pb.Empty
    persist: WriteBatch | None


class ReplicaCore:
    """Acceptor and learner state of one replica, over its storage."""

    def __init__(self, storage: Storage) -> None:
        self.storage = storage
        self.meta = storage.metadata()
        # Decided but maybe not yet durable; cleared by `persisted`.
        self._overlay: dict[int, pb.Action] = {}
        last = storage.last_position()
        self.end = max(last or 0, self.meta.begin - 1 if self.meta.begin else 0)
        # Learned bookkeeping: every position < learned_next is learned (or truncated);
        # learned_above holds learned positions beyond the first gap.
        self.learned_next = max(self.meta.learned_below, self.meta.begin)
        self.learned_above: set[int] = set()
        if last is not None and last >= self.learned_next:
            for action in storage.scan(self.learned_next, last):
                if action.learned:
                    self.learned_above.add(action.position)
        self._advance_learned()

    # ---- state -------------------------------------------------------------------------

    @property
    def status(self) -> pb.Status.ValueType:
        return self.meta.status

    @property
    def begin(self) -> int:
        return self.meta.begin

    @property
    def promised(self) -> int:
        return self.meta.promised

    @property
    def learned(self) -> int:
        """Highest position learned with no gap below it (0 when nothing is learned)."""
        return max(self.learned_next - 1, 0)

    def is_learned(self, position: int) -> bool:
        return position < self.learned_next or position in self.learned_above

    def get(self, position: int) -> pb.Action | None:
        """The action at `position` as this replica currently holds it, learned flag included."""
        action = self._overlay.get(position)
        if action is None:
            action = self.storage.get(position)
            if action is None:
                return None
        if not action.learned and self.is_learned(position):
            copy = pb.Action()
            copy.CopyFrom(action)
            copy.learned = True
            return copy
        return action

    def unlearned(self, first: int, last: int) -> Iterator[int]:
        """Positions in [first, last] (not below begin) that this replica has not learned."""
        for position in range(max(first, self.learned_next, self.begin), last + 1):
            if position not in self.learned_above:
                yield position

    def learned_actions(
        self, first: int, last: int, limit: int, max_bytes: int = 1 << 62
    ) -> list[pb.Action]:
        """Consecutive learned actions from `first` (or begin) on, in order, stopping at
        `last`, at `limit` actions, once `max_bytes` of values are collected (always at least
        one action), or at the first position this replica has not learned. Reads storage
        lazily, merged with what is decided but not yet on disk."""
        out: list[pb.Action] = []
        first = max(first, self.begin)
        if last < first:
            return out
        pending = sorted(p for p in self._overlay if first <= p <= last)
        stored = iter(self.storage.scan(first, last))
        next_stored = next(stored, None)
        size = 0
        for position in range(first, last + 1):
            if not self.is_learned(position):
                break  # a gap: the caller continues from here later
            while next_stored is not None and next_stored.position < position:
                next_stored = next(stored, None)
            action = self._overlay.get(position) if pending else None
            if action is None:
                if next_stored is None or next_stored.position != position:
                    break
                action = next_stored
            if not action.learned:
                copy = pb.Action()
                copy.CopyFrom(action)
                copy.learned = True
                action = copy
            out.append(action)
            size += len(action.value)
            if len(out) >= limit or size >= max_bytes:
                break
        return out

    def persisted(self, batch: WriteBatch) -> None:
        """The batch is on disk: drop its actions from the overlay (unless since replaced)."""
        for action in batch.actions:
            if self._overlay.get(action.position) is action:
                del self._overlay[action.position]

    # ---- acceptor ----------------------------------------------------------------------

    def _guard(self, position: int, record: pb.Action | None) -> int:
        return max(self.meta.promised, record.promised if record is not None else 0)

    def on_promise(self, request: pb.PromiseRequest) -> Reply:
        if self.meta.status != pb.VOTING:
            return Reply(pb.PromiseResponse(verdict=pb.IGNORED, status=self.meta.status), None)
        if not request.positions:
            return self._implicit_promise(request)
        return self._explicit_promise(request)

    def _implicit_promise(self, request: pb.PromiseRequest) -> Reply:
        if request.proposal <= self.meta.promised:
            return Reply(self._reject_promise(self.meta.promised), None)
        self.meta.promised = request.proposal
        response = pb.PromiseResponse(
            verdict=pb.ACCEPT,
            proposal=request.proposal,
            end=self.end,
            begin=self.begin,
            status=self.meta.status,
        )
        return Reply(response, WriteBatch(metadata=self._meta_copy()))

    def _explicit_promise(self, request: pb.PromiseRequest) -> Reply:
        before: list[pb.Action] = []
        updated: list[pb.Action] = []
        highest_guard = 0
        for position in request.positions:
            if position < self.begin:
                before.append(tombstone(position))
                continue
            record = self.get(position)
            if record is not None and record.learned:
                before.append(record)  # final: no promise needed, the filler adopts it
                continue
            guard = self._guard(position, record)
            if request.proposal <= guard:
                highest_guard = max(highest_guard, guard)
                continue
            before.append(record if record is not None else pb.Action(position=position))
            promised = pb.Action()
            if record is not None:
                promised.CopyFrom(record)
            promised.position = position
            promised.promised = request.proposal
            updated.append(promised)
        if highest_guard:
            return Reply(self._reject_promise(highest_guard), None)
        for action in updated:
            self._overlay[action.position] = action
            self.end = max(self.end, action.position)
        response = pb.PromiseResponse(
            verdict=pb.ACCEPT,
            proposal=request.proposal,
            actions=before,
            begin=self.begin,
            end=self.end,
            status=self.meta.status,
        )
        return Reply(response, WriteBatch(actions=updated) if updated else None)

    def _reject_promise(self, promised: int) -> pb.PromiseResponse:
        return pb.PromiseResponse(
            verdict=pb.REJECT, proposal=promised, begin=self.begin, status=self.meta.status
        )

    def on_write(self, request: pb.WriteRequest) -> Reply:
        if self.meta.status != pb.VOTING:
            return Reply(pb.WriteResponse(verdict=pb.IGNORED, status=self.meta.status), None)
        accepted: list[pb.Action] = []
        for incoming in request.actions:
            position = incoming.position
            if position < self.begin:
                if incoming.type == pb.NOP:
                    continue  # a tombstone's position is already settled as a NOP
                return Reply(self._reject_write(max(self.meta.promised, request.proposal)), None)
            record = self.get(position)
            if record is not None and record.learned:
                if same_value(record, incoming):
                    continue
                return Reply(self._reject_write(max(self.meta.promised, request.proposal)), None)
            guard = self._guard(position, record)
            if request.proposal < guard:
                return Reply(self._reject_write(guard), None)
            action = entry_of(incoming)  # the proposable part, origin included
            action.promised = action.performed = request.proposal
            accepted.append(action)
        for action in accepted:
            self._overlay[action.position] = action
            self.end = max(self.end, action.position)
        response = pb.WriteResponse(
            verdict=pb.ACCEPT, proposal=request.proposal, status=self.meta.status
        )
        return Reply(response, WriteBatch(actions=accepted) if accepted else None)

    def _reject_write(self, promised: int) -> pb.WriteResponse:
        return pb.WriteResponse(verdict=pb.REJECT, proposal=promised, status=self.meta.status)

    # ---- learner -----------------------------------------------------------------------

    def on_learned(self, request: pb.LearnedRequest) -> WriteBatch | None:
        """Apply chosen positions. Always applied, whatever the status (that is how a
        recovering replica receives data). Learned state is re-derivable (by fill or fetch),
        so its batch needs no fsync."""
        stored: list[pb.Action] = []
        truncate_to = 0
        for span in request.ranges:
            for position in range(max(span.first, self.begin), span.last + 1):
                if self.is_learned(position):
                    continue
                record = self.get(position)
                if record is None or record.performed != request.proposal:
                    continue  # missed this write: the value comes later by fill or fetch
                self.learned_above.add(position)
                truncate_to = max(truncate_to, self._truncation(record))
        for action in request.actions:
            position = action.position
            if position < self.begin or self.is_learned(position):
                continue
            learned = pb.Action()
            learned.CopyFrom(action)
            learned.learned = True
            stored.append(learned)
            self._overlay[position] = learned
            self.end = max(self.end, position)
            self.learned_above.add(position)
            truncate_to = max(truncate_to, self._truncation(learned))
        before = self.learned_next
        self._advance_learned()
        if not stored and truncate_to <= self.begin and self.learned_next == before:
            return None
        batch = WriteBatch(actions=stored, sync=False)
        if truncate_to > self.begin:
            self._truncate(truncate_to, batch)
        self.meta.learned_below = self.learned_next
        batch.metadata = self._meta_copy()
        return batch

    @staticmethod
    def _truncation(action: pb.Action) -> int:
        """The begin a learned action implies (0 if none)."""
        if action.type == pb.TRUNCATE:
            return action.truncate_to
        if action.type == pb.NOP and action.tombstone:
            return action.position + 1
        return 0

    def _truncate(self, to: int, batch: WriteBatch) -> None:
        self.meta.begin = to
        batch.delete_below = to
        batch.actions = [a for a in batch.actions if a.position >= to]
        for position in [p for p in self._overlay if p < to]:
            del self._overlay[position]
        self.learned_above = {p for p in self.learned_above if p >= to}
        self.end = max(self.end, to - 1)
        self._advance_learned()

    def _advance_learned(self) -> None:
        self.learned_next = max(self.learned_next, self.meta.begin)
        while self.learned_next in self.learned_above:
            self.learned_above.discard(self.learned_next)
            self.learned_next += 1

    # ---- status ------------------------------------------------------------------------

    def finish_recovery(self, promised: int) -> WriteBatch:
        """Turn VOTING after catch-up, adopting the highest promise of the VOTING replicas
        recovered from: a replica that lost its disk must not vote with promised = 0 for a
        proposal lower than one the log already promised (a Mesos hazard)."""
        self.meta.promised = max(self.meta.promised, promised)
        return self.set_status(pb.VOTING)

    def stamp(self, log_id: str, replica_id: int) -> WriteBatch:
        """Mark the data dir as belonging to this log and replica."""
        self.meta.log_id = log_id
        self.meta.replica_id = replica_id
        self.meta.stamped = True
        return WriteBatch(metadata=self._meta_copy())

    def set_status(self, status: pb.Status.ValueType) -> WriteBatch:
        self.meta.status = status
        return WriteBatch(metadata=self._meta_copy())

    def _meta_copy(self) -> pb.Metadata:
        meta = pb.Metadata()
        meta.CopyFrom(self.meta)
        return meta
