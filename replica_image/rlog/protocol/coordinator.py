"""The coordinator: elect, fill, append and truncate, as a pure state machine.

Events go in through methods (`elect`, `on_reply`, `on_failure`, `on_timeout`, `propose`,
`pump`, `step_down`, `on_peer_promise`); what the coordinator wants done comes out in
`take()` as outputs: messages to send, timers to set, results for the callers. No I/O, no
clocks: the replica runtime (rlog.runtime) and the simulations in tests drive it.

Rules (the Mesos log's coordinator, tightened as docs/protocol.md describes):
- elect: proposal = max(highest seen, local promise) + 1, implicit promise to every replica;
  a quorum of ACCEPT elects; index = the highest `end` in those replies;
- fill every position in [begin, index] the local replica has not learned: explicit promise
  at proposal + 1 (a number no implicit promise of ours ever used for these positions), then
  adopt a learned value, else the value with the highest `performed`, else a NOP; a client
  batch (one request's entries) is re-proposed only if it is that value at all of its
  positions, in one write, and replaced by NOPs otherwise, so it is chosen all or none
  (one chunk promises at a time, with the positions a batch reaches beyond it);
- admit: once leading, appends wait until the runtime hands over the admission state as of
  index+1 (`admission_ready`, rebuilt from the learned entries); then each append is
  admitted, refused or answered as a duplicate at the moment it is given positions
  (admission.py), and each entry assigned is applied to that state;
- an append's values become one `pb.Run` (docs/data-path.md): its positions share every
  field but the value, so the run is built, admitted and sent once per request, not once
  per entry; other entries (SESSION, EPOCH, TRUNCATE) stay actions;
- lead: positions index+1... are written at `proposal`; appends arriving together become one
  write batch per replica, several batches in flight; a quorum of ACCEPT chooses the batch,
  then a learned message goes to every replica; each entry carries its origin (this
  proposal and leader id), so a replica counts a write to a learned position as accepted
  only if it is this very write, and a request is done only when its own entry was chosen;
- any REJECT, a heartbeat answered with a promise above our proposal (`on_peer_promise`),
  or a round that can no longer reach a quorum (IGNORED, failures) or times out, demotes:
  in-flight appends end with an unknown outcome, queued ones with "not attempted"; the next
  election waits a random back-off in [T, 2T) and goes above the highest number seen.
"""

from __future__ import annotations

import bisect
import enum
import random
from collections import deque
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from typing import Protocol

from rlog.packed import pack, run_bytes, run_count
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import (
    NO_CONDITIONS,
    AdmissionState,
    Conditions,
    Duplicate,
    Refuse,
)
from rlog.protocol.consensus import (
    BatchKey,
    Elsewhere,
    FillRound,
    Outcome,
    Tally,
    batch_of,
    entry_of,
    learned,
)
from rlog.protocol.peer_version import PROTOCOL


class LocalReplica(Protocol):
    """What the coordinator reads of its own replica (read-only)."""

    @property
    def begin(self) -> int: ...

    @property
    def promised(self) -> int: ...

    def unlearned(self, first: int, last: int) -> Iterable[int]: ...

    def get(self, position: int) -> pb.Action | None: ...


class Phase(enum.Enum):
    IDLE = "idle"
    ELECTING = "electing"
    FILLING = "filling"
    LEADING = "leading"


class FailureKind(enum.Enum):
    NOT_LEADER = "not_leader"  # never attempted: safe to retry elsewhere
    UNKNOWN = "unknown"  # written to some replicas: may or may not be chosen
    TIMEOUT = "timeout"  # no quorum answered in time: outcome unknown too


# ---- outputs ---------------------------------------------------------------------------


@dataclass
class Send:
    to: int
    message: pb.PromiseRequest | pb.WriteRequest | pb.LearnedRequest
    round: int = 0  # 0: one-way, no reply expected


@dataclass
class SetTimer:
    round: int
    delay: float


@dataclass
class Done:
    token: Hashable
    positions: list[int]
    epoch: int = 0  # the writer epoch its last entry states (an EPOCH entry: the one taken)


@dataclass
class Failed:
    token: Hashable
    kind: FailureKind
    reason: str


@dataclass
class Refused:
    """Admission refused the append (a failed condition, a bad session): nothing of it
    was written."""

    token: Hashable
    refusal: Refuse


@dataclass
class Elected:
    proposal: int
    index: int


@dataclass
class Leading:
    proposal: int
    next_position: int


@dataclass
class Demoted:
    reason: str
    retry_after: float


Output = Send | SetTimer | Done | Failed | Refused | Elected | Leading | Demoted


# ---- rounds ----------------------------------------------------------------------------


@dataclass
class _Election:
    tally: Tally


Request = list[pb.Action] | pb.Run  # an append's values: a run (positions unset)


@dataclass
class _Write:
    first: int
    count: int  # positions first .. first + count - 1
    records: list[pb.Action | pb.Run]  # in position order
    tokens: list[tuple[Hashable, list[int]]]
    tally: Tally
    # The first position of each record, computed by the first `epoch_at`.
    _starts: list[int] | None = field(default=None, init=False, repr=False)

    def epoch_at(self, position: int) -> int:
        """The writer epoch the entry at `position` states."""
        if self._starts is None:
            self._starts = [r.first if isinstance(r, pb.Run) else r.position for r in self.records]
        index = bisect.bisect_right(self._starts, position) - 1
        if index < 0:
            return 0
        record = self.records[index]
        if isinstance(record, pb.Run):
            return record.head.epoch if position < record.first + run_count(record) else 0
        return record.epoch if record.position == position else 0


@dataclass
class CoordinatorConfig:
    election_timeout: float = 1.0
    fill_timeout: float = 2.0
    append_timeout: float = 10.0
    retry_backoff: float = 0.1  # T of the back-off in [T, 2T)
    max_batch_entries: int = 4096
    max_batch_bytes: int = 8 * 1024 * 1024
    max_inflight_batches: int = 4
    fill_batch: int = 256  # positions per explicit-promise round
    # TEST ONLY (RLOG_UNSAFE_SPLIT_FILL=1): fill each position on its own, several chunks in
    # parallel, as before client batches were marked: a batch accepted by a minority can
    # then be chosen in part. The randomized simulation uses it to show that it finds that.
    split_fill: bool = False
    # TEST ONLY (RLOG_UNSAFE_NO_DEDUPE=1): a session append the log already answered is
    # appended again instead of answered with its positions, so retries duplicate values.
    no_dedupe: bool = False


class Coordinator:
    def __init__(
        self,
        replica_id: int,
        replicas: int,
        local: LocalReplica,
        config: CoordinatorConfig | None = None,
        rng: random.Random | None = None,
        log_id: str = "",
    ) -> None:
        self.id = replica_id
        self.replicas = replicas
        self.quorum = replicas // 2 + 1
        self.local = local
        self.config = config or CoordinatorConfig()
        self.rng = rng or random.Random()
        self.log_id = log_id
        self.phase = Phase.IDLE
        self.proposal = 0
        self.highest_seen = 0
        self.index = 0  # highest position known to hold a record at election
        self.next_position = 0  # where the next append goes (when leading)
        # The last position of any batch acknowledged (chosen) so far. Batches in flight
        # together may be chosen out of order, so this can be past the local replica's
        # contiguous learned position; a linearizable read must wait for that to catch up.
        self.acknowledged_end = 0
        self._outbox: list[Output] = []
        self._round_seq = 0
        self._election: tuple[int, _Election] | None = None
        self._fills: dict[int, FillRound] = {}
        self._to_fill: deque[int] = deque()
        # Positions a fill's extension took from `_to_fill` (skipped when it comes to them),
        # and the batch of each position this election's fill settled (None: no batch).
        self._claimed: set[int] = set()
        self._filled: dict[int, BatchKey | None] = {}
        self._writes: dict[int, _Write] = {}
        self._queue: deque[tuple[Hashable, Request, Conditions]] = deque()
        # The admission state as of next_position; None until the runtime provides it for
        # this leadership (appends stay queued until then).
        self.admission: AdmissionState | None = None

    # ---- plumbing ----------------------------------------------------------------------

    def take(self) -> list[Output]:
        out, self._outbox = self._outbox, []
        return out

    def _new_round(self) -> int:
        self._round_seq += 1
        return self._round_seq

    def _broadcast(
        self, message: pb.PromiseRequest | pb.WriteRequest | pb.LearnedRequest, round_id: int = 0
    ) -> None:
        for replica in range(self.replicas):
            self._outbox.append(Send(replica, message, round_id))

    @property
    def leading(self) -> bool:
        return self.phase == Phase.LEADING

    @property
    def busy(self) -> bool:
        """Whether an election or fill is under way (the driver must not start another)."""
        return self.phase in (Phase.ELECTING, Phase.FILLING)

    def observe(self, proposal: int) -> None:
        """Remember a proposal number seen elsewhere (e.g. in a rival's heartbeat)."""
        self.highest_seen = max(self.highest_seen, proposal)

    # ---- election ----------------------------------------------------------------------

    def elect(self) -> None:
        if self.phase != Phase.IDLE:
            return
        self.phase = Phase.ELECTING
        self.proposal = max(self.highest_seen, self.local.promised, self.proposal) + 1
        self.highest_seen = self.proposal
        round_id = self._new_round()
        self._election = (round_id, _Election(Tally(self.replicas, self.quorum)))
        self._broadcast(
            pb.PromiseRequest(
                proposal=self.proposal, candidate=self.id, log_id=self.log_id, protocol=PROTOCOL
            ),
            round_id,
        )
        self._outbox.append(SetTimer(round_id, self.config.election_timeout))

    def _on_election_reply(
        self, election: _Election, replica: int, response: pb.PromiseResponse | None
    ) -> None:
        outcome = election.tally.record(replica, response)
        if outcome == Outcome.PENDING:
            return
        self._election = None
        if outcome != Outcome.ACCEPTED:
            self._demote(self._round_failure("election", election.tally))
            return
        self.index = max(
            r.end for r in election.tally.accepts.values() if isinstance(r, pb.PromiseResponse)
        )
        self._outbox.append(Elected(self.proposal, self.index))
        self.phase = Phase.FILLING
        self._to_fill = deque(self.local.unlearned(0, self.index))
        self._pump_fills()

    # ---- fill --------------------------------------------------------------------------

    @property
    def fill_proposal(self) -> int:
        return self.proposal + 1

    def _pump_fills(self) -> None:
        while self._to_fill and self._may_start_fill():
            positions: list[int] = []
            while self._to_fill and len(positions) < self.config.fill_batch:
                position = self._to_fill.popleft()
                if position not in self._claimed:
                    positions.append(position)
            if not positions:
                continue
            elsewhere = None if self.config.split_fill else self._settled_elsewhere
            fill = FillRound(positions, self.fill_proposal, self.replicas, self.quorum, elsewhere)
            self._send_fill_stage(fill, fill.promise_request(self.id, self.log_id))
        if not self._to_fill and not self._fills and self.phase == Phase.FILLING:
            self.phase = Phase.LEADING
            self.next_position = self.index + 1
            self._claimed.clear()
            self._filled.clear()
            self._outbox.append(Leading(self.proposal, self.next_position))
            self.pump()

    def _may_start_fill(self) -> bool:
        if len(self._fills) >= self.config.max_inflight_batches:
            return False
        if self.config.split_fill:
            return True
        # The batch rule: a round's extensions may take any queued position, and one proposal
        # must never carry two values at a position, so one round at a time promises; rounds
        # whose values are decided only write, and the next round may promise meanwhile.
        return all(fill.writing is not None for fill in self._fills.values())

    def _send_fill_stage(self, fill: FillRound, request: pb.PromiseRequest) -> None:
        round_id = self._new_round()
        self._fills[round_id] = fill
        self._broadcast(request, round_id)
        self._outbox.append(SetTimer(round_id, self.config.fill_timeout))

    def _settled_elsewhere(self, position: int) -> BatchKey | Elsewhere | None:
        """What this fill knows of a position outside the current round (the batch rule)."""
        if position < self.local.begin:
            return Elsewhere.TRUNCATED
        if position > self.index:
            # The election's quorum held no record there when it promised our proposal, so
            # nothing was chosen there below the fill's (none lies between); we append there.
            return None
        if position in self._filled:
            return self._filled[position]
        record = self.local.get(position)
        if record is not None and record.learned:
            return Elsewhere.TRUNCATED if record.tombstone else batch_of(record)
        return Elsewhere.UNKNOWN  # still queued: the round promises it as an extension

    def _on_fill_reply(
        self,
        round_id: int,
        fill: FillRound,
        replica: int,
        response: pb.PromiseResponse | pb.WriteResponse | None,
    ) -> None:
        outcome = fill.add(replica, response)
        if outcome == Outcome.PENDING:
            return
        if outcome != Outcome.ACCEPTED:
            self._demote(self._round_failure("fill", fill.tally))
            return
        if fill.writing is None:
            decided = fill.decide(self.id, self.log_id)
            if isinstance(decided, pb.PromiseRequest):
                # A batch reaches beyond the round: promise those positions too (a new
                # round id, so late replies of the previous stage are not counted).
                self._claimed.update(decided.positions)
                del self._fills[round_id]
                self._send_fill_stage(fill, decided)
                return
            for position, action in fill.values.items():
                self._filled[position] = batch_of(action)
            if fill.adopted:
                self._broadcast(self._learned(actions=[learned(a) for a in fill.adopted]))
            if decided is not None:
                self._broadcast(decided, round_id)
                self._pump_fills()  # the next round may promise while this one writes
                return
        else:
            self._broadcast(self._learned(actions=[learned(a) for a in fill.writing]))
        del self._fills[round_id]
        self._pump_fills()

    # ---- appends -----------------------------------------------------------------------

    def propose(
        self, token: Hashable, entries: Request, conditions: Conditions = NO_CONDITIONS
    ) -> None:
        """Queue entries (positions are assigned, and admission decided, when the batch is
        formed): an append's values as a run (`first` and `head` unset), or actions (a list
        of APPEND actions is taken as the run of their values)."""
        if self.phase != Phase.LEADING:
            self._outbox.append(Failed(token, FailureKind.NOT_LEADER, "not the leader"))
            return
        if isinstance(entries, list) and entries and all(a.type == pb.APPEND for a in entries):
            data, offsets = pack([a.value for a in entries])
            entries = pb.Run(data=data, offsets=offsets)
        self._queue.append((token, entries, conditions))

    def admission_ready(self, proposal: int, state: AdmissionState) -> bool:
        """The runtime's admission state as of `next_position` for the leadership at
        `proposal`; False (ignored) if that leadership is over."""
        if self.phase != Phase.LEADING or proposal != self.proposal:
            return False
        if state.next_position != self.next_position:
            raise ValueError(
                f"admission state at {state.next_position}, leader at {self.next_position}"
            )
        self.admission = state
        self.pump()
        return True

    def pump(self) -> None:
        """Form write batches from the queue while fewer than the maximum are in flight."""
        if self.phase != Phase.LEADING or self.admission is None:
            return
        admission = self.admission
        while self._queue and len(self._writes) < self.config.max_inflight_batches:
            # Records are placed straight into the request: a run appended to a repeated
            # field later is copied by serializing and parsing it (three copies of its
            # bytes), one made in place by a single deep copy.
            request = pb.WriteRequest(
                proposal=self.proposal, leader=self.id, log_id=self.log_id, protocol=PROTOCOL
            )
            records: list[pb.Action | pb.Run] = []
            tokens: list[tuple[Hashable, list[int]]] = []
            size = count = 0
            first = self.next_position
            while self._queue:
                token, entries, conditions = self._queue[0]
                if isinstance(entries, pb.Run):
                    entry_count, entry_size = run_count(entries), run_bytes(entries)
                else:
                    entry_count = len(entries)
                    entry_size = sum(len(a.value) for a in entries)
                if count and (
                    count + entry_count > self.config.max_batch_entries
                    or size + entry_size > self.config.max_batch_bytes
                ):
                    break
                self._queue.popleft()
                if not entry_count:
                    self._outbox.append(Done(token, []))  # nothing to place
                    continue
                if conditions.any:
                    verdict = admission.admit(conditions)
                    if isinstance(verdict, Refuse):
                        self._outbox.append(Refused(token, verdict))
                        continue
                    if isinstance(verdict, Duplicate) and not self.config.no_dedupe:
                        self._answer_duplicate(token, verdict.positions, first, tokens)
                        continue
                    if conditions.session and conditions.acked_below:
                        admission.acknowledge(conditions.session, conditions.acked_below)
                start = self.next_position
                # A request's entries travel in one write and carry their bounds, so that a
                # fill can choose them all or none (single entries: 0/0, a batch of one).
                bounds = (start, start + entry_count - 1) if entry_count > 1 else (0, 0)
                if isinstance(entries, pb.Run):
                    if entry_count:
                        run = request.runs.add()
                        self._append_run(run, entries, start, bounds, conditions)
                        records.append(run)
                else:
                    for offset, action in enumerate(entries):
                        entry = self._entry(action, start + offset, bounds, conditions)
                        request.actions.append(entry)
                        records.append(request.actions[-1])
                self.next_position += entry_count
                tokens.append((token, list(range(start, self.next_position))))
                size += entry_size
                count += entry_count
            if not records:
                continue  # every append taken was refused or a duplicate
            round_id = self._new_round()
            self._writes[round_id] = _Write(
                first, count, records, tokens, Tally(self.replicas, self.quorum)
            )
            self._broadcast(request, round_id)
            self._outbox.append(SetTimer(round_id, self.config.append_timeout))

    def _append_run(
        self,
        run: pb.Run,
        values: pb.Run,
        first: int,
        bounds: tuple[int, int],
        conditions: Conditions,
    ) -> None:
        """`run` := an append's values placed at `first` (one head for all of them), applied
        to the admission state."""
        assert self.admission is not None
        head = pb.Action(
            type=pb.APPEND,
            # Marks the entries as this write's own: (proposal, leader) is unique, since
            # one coordinator at most is elected at a proposal.
            origin_proposal=self.proposal,
            origin_leader=self.id,
            batch_first=bounds[0],
            batch_last=bounds[1],
            # The epoch as of these entries, so a scan of the log's last entries finds it.
            epoch=self.admission.epoch,
            session=conditions.session,
            sequence=conditions.sequence if conditions.session else 0,
        )
        run.CopyFrom(values)  # one copy of the values (a constructor from .data makes two)
        run.first = first
        run.head.CopyFrom(head)
        self.admission.apply_run(run)

    def _entry(
        self, action: pb.Action, position: int, bounds: tuple[int, int], conditions: Conditions
    ) -> pb.Action:
        """A non-append entry (SESSION, EPOCH, TRUNCATE) placed at `position`, applied to the
        admission state."""
        assert self.admission is not None
        entry = entry_of(action)
        entry.position = position
        entry.origin_proposal = self.proposal
        entry.origin_leader = self.id
        entry.batch_first, entry.batch_last = bounds
        # EPOCH: the epoch it takes.
        epoch = self.admission.epoch
        entry.epoch = epoch + 1 if entry.type == pb.EPOCH else epoch
        if conditions.session and entry.type == pb.APPEND:
            entry.session = conditions.session
            entry.sequence = conditions.sequence
        self.admission.apply(entry)
        return entry

    def _answer_duplicate(
        self,
        token: Hashable,
        positions: list[int],
        batch_first: int,
        batch_tokens: list[tuple[Hashable, list[int]]],
    ) -> None:
        """A retry of an append already given `positions`: it is done when the original is
        (at once if the original is chosen already)."""
        if positions and positions[0] >= batch_first:
            batch_tokens.append((token, positions))  # the original is in the batch being formed
            return
        for write in self._writes.values():
            if positions and write.first <= positions[0] < write.first + write.count:
                write.tokens.append((token, positions))
                return
        self._outbox.append(Done(token, positions))

    def _on_write_reply(
        self, round_id: int, write: _Write, replica: int, response: pb.WriteResponse | None
    ) -> None:
        outcome = write.tally.record(replica, response)
        if outcome == Outcome.PENDING:
            return
        if outcome != Outcome.ACCEPTED:
            self._demote(self._round_failure("write", write.tally))
            return
        del self._writes[round_id]
        last = write.first + write.count - 1
        self.acknowledged_end = max(self.acknowledged_end, last)
        self._broadcast(self._learned(ranges=[pb.PositionRange(first=write.first, last=last)]))
        for token, positions in write.tokens:
            epoch = write.epoch_at(positions[-1]) if positions else 0
            self._outbox.append(Done(token, positions, epoch))
        self.pump()

    def _learned(
        self, ranges: list[pb.PositionRange] | None = None, actions: list[pb.Action] | None = None
    ) -> pb.LearnedRequest:
        return pb.LearnedRequest(
            proposal=self.proposal,
            ranges=ranges or [],
            actions=actions or [],
            leader=self.id,
            log_id=self.log_id,
            protocol=PROTOCOL,
        )

    # ---- events ------------------------------------------------------------------------

    def on_reply(
        self, round_id: int, replica: int, response: pb.PromiseResponse | pb.WriteResponse
    ) -> None:
        if response.verdict == pb.REJECT:
            self.highest_seen = max(self.highest_seen, response.proposal)
        self._dispatch(round_id, replica, response)

    def on_failure(self, round_id: int, replica: int) -> None:
        """The request to `replica` for this round failed in transport (counts as no reply)."""
        self._dispatch(round_id, replica, None)

    def _dispatch(
        self, round_id: int, replica: int, response: pb.PromiseResponse | pb.WriteResponse | None
    ) -> None:
        if self._election is not None and self._election[0] == round_id:
            if response is None or isinstance(response, pb.PromiseResponse):
                self._on_election_reply(self._election[1], replica, response)
        elif round_id in self._fills:
            self._on_fill_reply(round_id, self._fills[round_id], replica, response)
        elif round_id in self._writes:
            if response is None or isinstance(response, pb.WriteResponse):
                self._on_write_reply(round_id, self._writes[round_id], replica, response)
        # else: a late reply to a finished round

    def on_timeout(self, round_id: int) -> None:
        if self._election is not None and self._election[0] == round_id:
            self._election = None
            self._demote("election timed out without a quorum")
        elif round_id in self._fills:
            self._demote("fill timed out without a quorum")
        elif round_id in self._writes:
            self._demote("append timed out without a quorum", timed_out=True)

    def on_peer_promise(self, replica: int, promised: int) -> bool:
        """A peer's answer to this leader's heartbeat carried its promise. Above our
        proposal, the peer rejects our writes from now on (a rival candidate raised it and was
        refused, and the peer follows us anyway): demote now, as its rejected write would, so
        the next election goes above it. Leading on, this leader could neither confirm a read
        nor commit without that peer, and the first append would learn it by failing (Raft
        lets a higher term in any answer depose a leader for the same reason). Returns
        whether it demoted."""
        if self.phase == Phase.IDLE or promised <= self.proposal:
            return False
        self.highest_seen = max(self.highest_seen, promised)
        self._demote(
            f"replica {replica} promised proposal {promised}, above this leader's "
            f"{self.proposal}: electing above it"
        )
        return True

    def step_down(self, reason: str = "asked to step down") -> None:
        if self.phase != Phase.IDLE:
            self._demote(reason)

    # ---- demotion ----------------------------------------------------------------------

    def _round_failure(self, what: str, tally: Tally) -> str:
        if tally.rejected_by:
            return f"{what} rejected: a replica promised proposal {tally.rejected_by}"
        return (
            f"{what} cannot reach a quorum: {len(tally.unavailable)} of {self.replicas} "
            "replicas ignored it or failed"
        )

    def _demote(self, reason: str, timed_out: bool = False) -> None:
        in_flight_kind = FailureKind.TIMEOUT if timed_out else FailureKind.UNKNOWN
        for write in self._writes.values():
            for token, _ in write.tokens:
                self._outbox.append(
                    Failed(token, in_flight_kind, f"leadership lost during the append: {reason}")
                )
        for token, _, _ in self._queue:
            self._outbox.append(
                Failed(token, FailureKind.NOT_LEADER, f"not attempted: leadership lost: {reason}")
            )
        self._writes.clear()
        self._queue.clear()
        self._fills.clear()
        self._to_fill.clear()
        self._claimed.clear()
        self._filled.clear()
        self._election = None
        self.admission = None
        self.phase = Phase.IDLE
        lo = self.config.retry_backoff
        self._outbox.append(Demoted(reason, self.rng.uniform(lo, 2 * lo)))
