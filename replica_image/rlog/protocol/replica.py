"""The replica: Paxos acceptor and learner rules as a pure state machine.

`ReplicaCore` takes a request and returns the response plus the `WriteBatch` that must be on
disk before the response leaves (etcd-raft style: no I/O here). It reads stored actions
through the `Storage` interface, and keeps what it has decided but not yet seen persisted in
an overlay, so that requests handled while a group commit is in flight see their
predecessors' effects. The server applies the batches (one fsync for many) and only then
sends the responses. The pure operations on records (spans, checks, the pending records
layered over the stored) are `records`.

Rules (the Mesos log's acceptor with rlog's tightenings, docs/protocol.md):
- not VOTING: promises and writes get IGNORED; learned messages are always applied;
- the promise guarding position p is max(metadata.promised, record.promised): an implicit
  promise needs proposal > metadata.promised, an explicit one proposal > that guard, a write
  proposal >= that guard (an equal number is the same coordinator's ballot);
- positions below begin answer a promise with a learned NOP tombstone;
- a learned position is final: a write repeating its value (the same write, `same_value`) is
  accepted without a disk write, any other write is rejected, even one of identical content;
- a batch of positions is all-or-nothing: one rejected position rejects the batch.

Runs (docs/data-path.md, "The replica over runs"): a run is the per-position actions
`packed.expand` gives, held and stored as one record. The rules above stay per position; a
run takes one check when that check decides every position alike: a write whose run lies
entirely above `end` (nothing stored or pending there) meets only the implicit promise; a
learned range meets a run whose positions all carry the same `performed`. Anything else (a
write over stored positions, an explicit promise inside a run) takes the per-position path,
and what it stores inside a run replaces those positions only.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from rlog.packed import action_at, clip, expand, offsets_of, run_bytes, run_count, run_last
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.consensus import entry_of
from rlog.protocol.records import (
    Head,
    R,
    Record,
    any_within,
    as_learned,
    cut,
    first_of,
    layer,
    same_value,
    span,
    tombstone,
    well_formed,
)
from rlog.storage import Storage, WriteBatch
from rlog.storage.base import RunHead, head_of


@dataclass
class _PendingRun:
    """A run decided but maybe not yet durable: `run` as it stands now (truncation clips
    it), `source` the run object of the WriteBatch that persists it."""

    run: pb.Run
    source: pb.Run


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
        # Decided but maybe not yet durable; cleared by `persisted`. An action here wins
        # over a pending run at its position (it was decided later), which wins over storage.
        self._overlay: dict[int, pb.Action] = {}
        self._runs: list[_PendingRun] = []  # in position order, never overlapping
        last = storage.last_position()
        self.end = max(last or 0, self.meta.begin - 1 if self.meta.begin else 0)
        # Learned bookkeeping: every position < learned_next is learned (or truncated);
        # learned_above holds learned positions beyond the first gap.
        self.learned_next = max(self.meta.learned_below, self.meta.begin)
        self.learned_above: set[int] = set()
        if last is not None and last >= self.learned_next:
            for record in storage.scan_records(self.learned_next, last):
                if isinstance(record, pb.Run):
                    if record.head.learned:
                        self._learn_span(*span(record))
                elif record.learned:
                    self._learn_span(record.position, record.position)
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

    def _pending_run_at(self, position: int) -> pb.Run | None:
        index = bisect.bisect_right(self._runs, position, key=lambda p: p.run.first) - 1
        if index < 0:
            return None
        run = self._runs[index].run
        return run if run_last(run) >= position else None

    def get(self, position: int) -> pb.Action | None:
        """The action at `position` as this replica currently holds it, learned flag included."""
        action = self._overlay.get(position)
        if action is None:
            run = self._pending_run_at(position) if self._runs else None
            if run is not None:
                action = action_at(run, position)
            else:
                action = self.storage.get(position)
                if action is None:
                    return None
        if not action.learned and self.is_learned(position):
            copy = pb.Action()
            copy.CopyFrom(action)
            copy.learned = True
            return copy
        return action

    def records(self, first: int, last: int) -> Iterator[Record]:
        """What this replica holds at [first, last], in position order, clipped to it: the
        stored records with what is decided but not yet on disk put over them. Learned
        flags are as stored (see `learned_records`)."""
        runs: list[Record] = [clip(run, first, last) for run in self._pending_runs(first, last)]
        return self._over(self.storage.scan_records(first, last), runs, first, last)

    def record_heads(self, first: int, last: int) -> Iterator[Head]:
        """`records` without the values: every run as its RunHead (a stored run's values
        are never read: the learned bookkeeping and the admission state need its head and
        positions only, and a batch's values would otherwise be read back from the disk
        for them, once each, after every group commit)."""
        runs: list[Head] = [
            cut(head_of(run), first, last) for run in self._pending_runs(first, last)
        ]
        return self._over(self.storage.scan_heads(first, last), runs, first, last)

    def _pending_runs(self, first: int, last: int) -> list[pb.Run]:
        return [p.run for p in self._runs if p.run.first <= last and run_last(p.run) >= first]

    def _over(self, stored: Iterator[R], runs: list[R], first: int, last: int) -> Iterator[R]:
        """`stored` with the pending runs (clipped to [first, last]) and then the overlay's
        actions there put over it."""
        merged = layer(stored, runs) if runs else stored
        if self._overlay:
            actions = [self._overlay[p] for p in sorted(self._overlay) if first <= p <= last]
            if actions:
                return layer(merged, actions)
        return merged

    def _pending_touches(self, lo: int, hi: int) -> bool:
        """Whether anything decided but not yet on disk lies at [lo, hi].

        Never a scan of everything held: a catch-up holds one run per learned span until its
        write is durable, tens of thousands for a log of small appends, and a scan per run
        made a catch-up quadratic (a replica on a fresh volume spent minutes at full CPU with
        its event loop blocked, answering nothing)."""
        if self._overlay and any_within(self._overlay, lo, hi):
            return True
        # The held runs are in position order and never overlap, so the one starting last
        # at or before `hi` is the only one that can reach `lo`.
        index = bisect.bisect_right(self._runs, hi, key=lambda p: p.run.first) - 1
        return index >= 0 and run_last(self._runs[index].run) >= lo

    def unlearned(self, first: int, last: int) -> Iterator[int]:
        """Positions in [first, last] (not below begin) that this replica has not learned."""
        for position in range(max(first, self.learned_next, self.begin), last + 1):
            if position not in self.learned_above:
                yield position

    def _learned_through(self, lo: int, hi: int) -> int:
        """The highest position p in [lo, hi] with every position of [lo, p] learned (lo - 1
        if lo is not learned)."""
        if hi < self.learned_next:
            return hi
        position = max(lo, self.learned_next)
        while position <= hi and position in self.learned_above:
            position += 1
        return position - 1

    def learned_records(
        self,
        first: int,
        last: int,
        limit: int,
        max_bytes: int = 1 << 62,
        max_records: int | None = None,
    ) -> list[Record]:
        """Consecutive learned records from `first` (or begin) on, in order, clipped to
        [first, last]: stored runs as runs (their bytes as stored), other positions as
        actions, all with the learned flag. Stops at `last`, at `limit` positions, at
        `max_records` records, before `max_bytes` of values are passed (always at least one
        record: a first run bigger than that is cut to the values that fit, at least one), or
        at the first position this replica has not learned. Reads storage lazily, merged with
        what is decided but not yet on disk."""
        out: list[Record] = []
        first = max(first, self.begin)
        if last < first or limit <= 0:
            return out
        position, count, size = first, 0, 0
        for record in self.records(first, last):
            lo, hi = span(record)
            if lo != position:
                break  # a position holding nothing: not learned here
            through = min(self._learned_through(lo, hi), lo + limit - count - 1)
            if through < lo:
                break
            if isinstance(record, pb.Run):
                record = clip(record, lo, through)
                if size + run_bytes(record) > max_bytes and through > lo:
                    if out:
                        # It goes whole in the next batch: cut here, it would be read from
                        # storage and cut again for the rest.
                        break
                    # A big run: only the values that fit (at least one), so a message of
                    # records stays bounded in bytes.
                    fit = bisect.bisect_right(
                        offsets_of(record.data, record.offsets), max_bytes - size
                    )
                    through = lo + max(fit - 1, 1) - 1
                    record = clip(record, lo, through)
                size += run_bytes(record)
            else:
                size += len(record.value)
            out.append(as_learned(record))
            count += through - lo + 1
            position = through + 1
            if through < hi or count >= limit or size >= max_bytes:
                break
            if max_records is not None and len(out) >= max_records:
                break
        return out

    def learned_heads(self, first: int, last: int, limit: int) -> list[Head]:
        """`learned_records` without the values (runs as their RunHeads, learned flags as
        stored): consecutive learned records from `first` (or begin), clipped to [first,
        last], at most `limit` positions, up to the first position not learned here."""
        out: list[Head] = []
        first = max(first, self.begin)
        if last < first or limit <= 0:
            return out
        position, count = first, 0
        for record in self.record_heads(first, last):
            lo, hi = span(record)
            if lo != position:
                break
            through = min(self._learned_through(lo, hi), lo + limit - count - 1)
            if through < lo:
                break
            out.append(cut(record, lo, through))
            count += through - lo + 1
            position = through + 1
            if through < hi or count >= limit:
                break
        return out

    def learned_actions(
        self, first: int, last: int, limit: int, max_bytes: int = 1 << 62
    ) -> list[pb.Action]:
        """`learned_records`, one action per position (for callers that want them)."""
        out: list[pb.Action] = []
        for record in self.learned_records(first, last, limit, max_bytes):
            if isinstance(record, pb.Run):
                out.extend(expand(record))
            else:
                out.append(record)
        return out

    def persisted(self, batch: WriteBatch) -> None:
        """The batch is on disk: drop its records from the overlay (unless since replaced)."""
        for action in batch.actions:
            if self._overlay.get(action.position) is action:
                del self._overlay[action.position]
        if batch.runs and self._runs:
            done = {id(r) for r in batch.runs}  # by identity; a set, not a scan per run
            self._runs = [p for p in self._runs if id(p.source) not in done]

    def _hold_run(self, run: pb.Run) -> None:
        pending = _PendingRun(run, run)
        if not self._runs or self._runs[-1].run.first < run.first:
            self._runs.append(pending)  # the common case: appending at the end
        else:
            bisect.insort(self._runs, pending, key=lambda p: p.run.first)
        self.end = max(self.end, run_last(run))

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
        proposal = request.proposal
        incoming_records: Sequence[Record] = request.actions
        if request.runs:
            incoming_records = sorted([*request.actions, *request.runs], key=first_of)
        accepted: list[pb.Action] = []
        accepted_runs: list[pb.Run] = []
        if not well_formed(incoming_records):
            # Never sent by a correct leader: take nothing of the batch.
            return Reply(pb.WriteResponse(verdict=pb.IGNORED, status=self.status), None)
        for record in incoming_records:
            if isinstance(record, pb.Run):
                if run_count(record) == 0:
                    continue
                if record.first > self.end and record.first >= self.begin:
                    # Nothing stored or pending at any of its positions: each one's guard is
                    # the implicit promise, and none is learned.
                    if proposal < self.meta.promised:
                        return Reply(self._reject_write(self.meta.promised), None)
                    head = entry_of(record.head)
                    head.promised = head.performed = proposal
                    run = pb.Run()
                    run.CopyFrom(record)  # one copy of the values (a constructor makes two)
                    run.DiscardUnknownFields()  # only the fields this build knows are stored
                    run.head.CopyFrom(head)
                    accepted_runs.append(run)
                    continue
                positions: Iterable[pb.Action] = expand(record)
            else:
                positions = (record,)
            for incoming in positions:
                position = incoming.position
                if position < self.begin:
                    if incoming.type == pb.NOP:
                        continue  # a tombstone's position is already settled as a NOP
                    return Reply(self._reject_write(max(self.meta.promised, proposal)), None)
                stored = self.get(position)
                if stored is not None and stored.learned:
                    if same_value(stored, incoming):
                        continue
                    return Reply(self._reject_write(max(self.meta.promised, proposal)), None)
                guard = self._guard(position, stored)
                if proposal < guard:
                    return Reply(self._reject_write(guard), None)
                action = entry_of(incoming)  # the proposable part, origin included
                action.promised = action.performed = proposal
                accepted.append(action)
        for action in accepted:
            self._overlay[action.position] = action
            self.end = max(self.end, action.position)
        for run in accepted_runs:
            self._hold_run(run)
        response = pb.WriteResponse(verdict=pb.ACCEPT, proposal=proposal, status=self.meta.status)
        if not accepted and not accepted_runs:
            return Reply(response, None)
        return Reply(response, WriteBatch(actions=accepted, runs=accepted_runs))

    def _reject_write(self, promised: int) -> pb.WriteResponse:
        return pb.WriteResponse(verdict=pb.REJECT, proposal=promised, status=self.meta.status)

    # ---- learner -----------------------------------------------------------------------

    def on_learned(self, request: pb.LearnedRequest) -> WriteBatch | None:
        """Apply chosen positions. Always applied, whatever the status (that is how a
        recovering replica receives data). Learned state is re-derivable (by fill or fetch),
        so its batch needs no fsync."""
        if not well_formed([*request.actions, *request.runs]):
            return None  # never sent by a correct leader: take nothing of it
        before = self.learned_next
        truncate_to = 0
        for learned_span in request.ranges:
            lo = max(learned_span.first, self.begin, self.learned_next)
            if learned_span.last < lo:
                continue
            for found in self.record_heads(lo, learned_span.last):
                if isinstance(found, RunHead):
                    # One write put the whole run: one performed for all its positions.
                    if found.head.performed == request.proposal:
                        self._learn_span(found.first, found.last)
                    continue
                position = found.position
                if self.is_learned(position) or found.performed != request.proposal:
                    continue  # missed this write: the value comes later by fill or fetch
                self._learn_span(position, position)
                truncate_to = max(truncate_to, self._truncation(found))
        return self._learn_records(request.actions, request.runs, False, before, truncate_to)

    def on_fetched(self, answer: pb.FetchResponse) -> WriteBatch | None:
        """Learn what a Fetch answer holds (its records are learned at the peer, so
        chosen), in order after what this replica learned so far: a `begin` past our first
        unlearned position says the peer truncated below it, which a tombstone below `begin`
        applies in one step. The caller gives the answer up: its runs are held as they are,
        not copied (a catch-up moves the whole log through here)."""
        actions: Sequence[pb.Action] = answer.actions
        if answer.begin > self.begin and answer.begin > self.learned_next:
            actions = [tombstone(answer.begin - 1), *actions]
        if not well_formed([*actions, *answer.runs]):
            return None  # never sent by a correct peer: take nothing of it
        return self._learn_records(actions, answer.runs, True, self.learned_next, 0)

    def _learn_records(
        self,
        actions: Sequence[pb.Action],
        runs: Sequence[pb.Run],
        owned: bool,
        before: int,
        truncate_to: int,
    ) -> WriteBatch | None:
        """Learn chosen records (`owned`: the runs are the caller's to give, held without a
        copy); the batch that stores them, or None if nothing changed since `before`."""
        stored: list[pb.Action] = []
        stored_runs: list[pb.Run] = []
        full: Sequence[Record] = actions
        if runs:
            full = sorted([*actions, *runs], key=first_of)
        for record in full:
            if isinstance(record, pb.Run):
                held = self._learned_run(record, owned)
                if held is not None:
                    stored_runs.extend(held)
                    continue
                expanded: Iterable[pb.Action] = expand(record)
            else:
                expanded = (record,)
            for action in expanded:
                position = action.position
                if position < self.begin or self.is_learned(position):
                    continue
                learned = pb.Action()
                learned.CopyFrom(action)
                learned.learned = True
                stored.append(learned)
                self._overlay[position] = learned
                self.end = max(self.end, position)
                self._learn_span(position, position)
                truncate_to = max(truncate_to, self._truncation(learned))
        self._advance_learned()
        if not stored and not stored_runs and truncate_to <= self.begin:
            if self.learned_next == before:
                return None
        batch = WriteBatch(actions=stored, runs=stored_runs, sync=False)
        if truncate_to > self.begin:
            self._truncate(truncate_to, batch)
        self.meta.learned_below = self.learned_next
        batch.metadata = self._meta_copy()
        return batch

    def _learned_run(self, run: pb.Run, owned: bool) -> list[pb.Run] | None:
        """Hold a full learned run as one record if no position of it is learned or pending
        here: what to store (nothing if every position is learned already); None: the
        caller takes it position by position. `owned`: the run is ours to keep and mark."""
        first, last = max(run.first, self.begin, self.learned_next), run_last(run)
        if last < first:
            return []
        if self.learned_above and any_within(self.learned_above, first, last):
            return None
        if self._pending_touches(first, last):
            return None
        clipped = clip(run, first, last)
        learned: pb.Run
        if owned and clipped is run:
            run.head.learned = True  # given to us: marked in place, not copied
            learned = run
        else:
            marked = as_learned(clipped)
            assert isinstance(marked, pb.Run)
            learned = marked
            if learned is run:  # the request's own message: keep an independent copy
                learned = pb.Run()
                learned.CopyFrom(run)
        self._hold_run(learned)
        self._learn_span(first, last)
        return [learned]

    def _learn_span(self, lo: int, hi: int) -> None:
        """Positions [lo, hi] are learned (the caller runs `_advance_learned` after)."""
        if lo > self.learned_next:
            self.learned_above.update(range(lo, hi + 1))
            return
        if hi < self.learned_next:
            return
        was = self.learned_next
        self.learned_next = hi + 1  # the common case: learned in order, a jump
        above = self.learned_above
        if above:
            if len(above) <= hi + 1 - was:
                self.learned_above = {p for p in above if p > hi}
            else:
                for position in range(was, hi + 1):
                    above.discard(position)

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
        clipped_runs = []
        for run in batch.runs:
            if run_last(run) < to:
                continue
            clipped = clip(run, to, run_last(run))
            for pending in self._runs:
                if pending.source is run:
                    pending.source = clipped  # `persisted` gets the batch's clipped run
            clipped_runs.append(clipped)
        batch.runs = clipped_runs
        for position in [p for p in self._overlay if p < to]:
            del self._overlay[position]
        kept = []
        for pending in self._runs:
            if run_last(pending.run) >= to:
                pending.run = clip(pending.run, to, run_last(pending.run))
                kept.append(pending)
        self._runs = kept
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

    def forget_corrupt(self, key: int) -> WriteBatch:
        """A stored record at `key` failed its checksum: drop it and stop voting until the
        replica has caught up again (docs/faults.md). What the record held is unknown (its
        header cannot be trusted either), so every position from `key` on counts as not
        learned here: recovery copies what a quorum learned and settles the rest by Paxos,
        exactly as for a replica that lost its disk, whose safety argument (docs/recovery.md)
        covers losing part of one."""
        self.learned_next = min(self.learned_next, max(key, self.meta.begin))
        self.learned_above = {p for p in self.learned_above if p < key}
        self._advance_learned()
        self.meta.learned_below = min(self.meta.learned_below, self.learned_next)
        if self.meta.status == pb.VOTING:
            self.meta.status = pb.RECOVERING
        return WriteBatch(drop_records=[key], metadata=self._meta_copy())

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
