"""Admission: which appends a leader lets into the log, as a pure state machine.

An append may carry conditions ("only if the log's next position is P", "only if my writer
epoch is still the highest") and a (session, sequence) pair that makes its retries return
the original positions instead of appending again (exactly-once appends). Whether it is
admitted depends only on the entries before the position it would get, so the leader
decides at the moment it assigns positions (`Coordinator.pump`), against an
`AdmissionState` derived by applying the entries in position order (`apply`).

The state is a function of the log alone, so any replica can rebuild it from its learned
entries (`runtime/admission.py` scans them when it becomes the leader):
- the writer epoch: the highest EPOCH entry. Every entry but NOPs carries the epoch current
  at its position (`Action.epoch`), so the last such entry says it, even after truncation
  (the TRUNCATE entry that set the log's beginning is itself at or after it);
- the sessions opened in the window: a SESSION entry opens the session whose id is its
  position; it expires once the next position passes id + window, or when a truncation
  removes its SESSION entry. Expired sessions are forgotten, and an append in one is
  refused (SESSION_EXPIRED), never applied again;
- per session, the check of its secret (`Action.session_check`, the SHA-256 of the secret
  the leader gave its opener): the SESSION entry carries it, so every replica that learns
  the entry (a new leader, one caught up or restarted) checks appends in it the same way;
- per session, the answer (first position, count) of each sequence applied in it. A client
  says which answers it holds (`acked_below`); the leader forgets those (a soft, local
  saving: a leader that rebuilt its state still has them, and answers a replay of one with
  its positions instead of an error; neither is ever a duplicate).

Rules, in this order (`admit`):
1. a session append without its session's secret is refused (SESSION_NOT_YOURS), before
   its sequence's answer is looked up: otherwise anyone could send (session, n) for a session not
   theirs, and the owner's own append n would come back as a Duplicate of it, acknowledged
   but not in the log. A session opened before sessions had secrets (no check) takes no
   append at all. Then a session append whose sequence has an answer is a Duplicate of it
   (before the conditions: the original was admitted under them, and the next position has
   moved since); an unknown session, an expired one, a sequence of 0 or below the forgotten
   answers are refused;
2. an epoch above the log's is refused (EPOCH_FROM_FUTURE); a lower one fails the condition;
3. `if_next` below the log's beginning is refused (TRUNCATED); another one than the next
   position fails the condition;
4. otherwise the append is admitted; a refused one changes nothing.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable
from dataclasses import dataclass, field

from rlog.packed import expand, run_count
from rlog.proto import rlog_pb2 as pb
from rlog.storage.base import RunHead


@dataclass(frozen=True)
class Conditions:
    """What an append asks of admission (all optional)."""

    session: int = 0  # 0: no session (no exactly-once)
    sequence: int = 0
    acked_below: int = 0
    if_next: int | None = None
    epoch: int = 0  # 0: no epoch condition
    secret: bytes = b""  # the session's secret (OpenSession gave it to the opener)

    @property
    def any(self) -> bool:
        return bool(self.session or self.epoch or self.if_next is not None)


NO_CONDITIONS = Conditions()


class Refusal(enum.Enum):
    """Why an append was refused (the values are `rlog.wire.Reason` names)."""

    CONDITION_FAILED = "CONDITION_FAILED"
    EPOCH_FROM_FUTURE = "EPOCH_FROM_FUTURE"
    TRUNCATED = "TRUNCATED"
    UNKNOWN_SESSION = "UNKNOWN_SESSION"
    SESSION_EXPIRED = "SESSION_EXPIRED"
    SEQUENCE_FORGOTTEN = "SEQUENCE_FORGOTTEN"
    SESSION_NOT_YOURS = "SESSION_NOT_YOURS"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"


@dataclass(frozen=True)
class Admit:
    pass


@dataclass(frozen=True)
class Duplicate:
    positions: list[int]


@dataclass(frozen=True)
class Refuse:
    reason: Refusal
    message: str
    next_position: int  # the log's next position at the refusal
    epoch: int  # the log's writer epoch at the refusal
    begin: int  # the log's first position at the refusal


Verdict = Admit | Duplicate | Refuse


SESSION_SECRET_BYTES = 16  # a session's secret: 128 random bits, chosen by the leader


def session_check(secret: bytes) -> bytes:
    """What a SESSION entry records of its secret (`Action.session_check`): its SHA-256,
    so the secret is on no replica's disk and in no archive, only with the session's opener."""
    return hashlib.sha256(secret).digest()


@dataclass
class _Session:
    check: bytes  # session_check of its secret; empty: opened before sessions had secrets
    answers: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq -> (first, count)
    forgotten_below: int = 0  # answers below this sequence were dropped (acked)


def carries_epoch(entry: pb.Action) -> bool:
    """Whether an entry states the epoch current at its position (every one but NOPs)."""
    return entry.type != pb.NOP


class AdmissionState:
    """The admission state as of `next_position` (every entry below it applied)."""

    def __init__(self, window: int, next_position: int, begin: int = 0, epoch: int = 0) -> None:
        if window <= 0:
            raise ValueError("the session window must be positive")
        self.window = window
        self.next_position = next_position
        self.begin = begin
        self.epoch = epoch
        # Insertion order is id order: SESSION entries are applied in position order.
        self.sessions: dict[int, _Session] = {}

    @property
    def horizon(self) -> int:
        """Sessions with an id below this one have expired."""
        return max(self.begin, self.next_position - self.window)

    def apply(self, entry: pb.Action) -> None:
        """Apply the entry at `entry.position` (>= next_position; NOPs included)."""
        # Runs for every entry a replica learns: plain comparisons, no helper calls.
        position = entry.position
        if position >= self.next_position:
            self.next_position = position + 1
        kind = entry.type
        if kind == pb.NOP:
            pass
        elif kind == pb.APPEND:
            if entry.epoch > self.epoch:
                self.epoch = entry.epoch
            if entry.session:
                session = self.sessions.get(entry.session)
                if session is not None and entry.sequence >= session.forgotten_below:
                    answer = session.answers.get(entry.sequence)
                    session.answers[entry.sequence] = (
                        (position, 1) if answer is None else (answer[0], answer[1] + 1)
                    )
        else:
            if entry.epoch > self.epoch:
                self.epoch = entry.epoch
            if kind == pb.SESSION:
                self.sessions[position] = _Session(entry.session_check)
            elif kind == pb.TRUNCATE and entry.truncate_to > self.begin:
                self.begin = entry.truncate_to
        if self.sessions and self._oldest_session() < self.horizon:
            self._expire()

    def apply_run(self, run: pb.Run) -> None:
        """Apply the run's entries (>= next_position): for an APPEND run, one step for all
        of them (they share their epoch, session and sequence), the same as each in turn."""
        count = run_count(run)
        if run.head.type != pb.APPEND:
            for entry in expand(run):
                self.apply(entry)
            return
        if count:
            self._apply_appends(run.first, count, run.head)

    def apply_head(self, run: RunHead) -> None:
        """`apply_run` from the run's head alone (no entry's value matters here)."""
        if run.head.type == pb.APPEND:
            self._apply_appends(run.first, run.last - run.first + 1, run.head)
            return
        for position in range(run.first, run.last + 1):
            entry = pb.Action()
            entry.CopyFrom(run.head)
            entry.position = position
            self.apply(entry)

    def _apply_appends(self, first: int, count: int, head: pb.Action) -> None:
        last = first + count - 1
        if last >= self.next_position:
            self.next_position = last + 1
        if head.epoch > self.epoch:
            self.epoch = head.epoch
        if head.session:
            session = self.sessions.get(head.session)
            if session is not None and head.sequence >= session.forgotten_below:
                answer = session.answers.get(head.sequence)
                session.answers[head.sequence] = (
                    (first, count) if answer is None else (answer[0], answer[1] + count)
                )
        if self.sessions and self._oldest_session() < self.horizon:
            self._expire()

    def apply_record(self, record: pb.Action | pb.Run | RunHead) -> None:
        if isinstance(record, pb.Run):
            self.apply_run(record)
        elif isinstance(record, RunHead):
            self.apply_head(record)
        else:
            self.apply(record)

    def _oldest_session(self) -> int:
        return next(iter(self.sessions))

    def skip_to(self, position: int, begin: int) -> None:
        """Positions below `position` were truncated before they were applied: nothing of
        them matters any more (their sessions are below the new beginning, and the TRUNCATE
        entry that removed them, at or after `position`, states the epoch)."""
        self.begin = max(self.begin, begin)
        self.next_position = max(self.next_position, position)
        self._expire()

    def clone(self) -> AdmissionState:
        copy = AdmissionState(self.window, self.next_position, self.begin, self.epoch)
        for session_id, session in self.sessions.items():
            copy.sessions[session_id] = _Session(
                session.check, dict(session.answers), session.forgotten_below
            )
        return copy

    def apply_all(self, entries: Iterable[pb.Action]) -> None:
        for entry in entries:
            self.apply(entry)

    def _expire(self) -> None:
        horizon = self.horizon
        while self.sessions:
            oldest = next(iter(self.sessions))
            if oldest >= horizon:
                return
            del self.sessions[oldest]

    def acknowledge(self, session_id: int, acked_below: int) -> None:
        """The client holds every answer below `acked_below`: forget them (memory only)."""
        session = self.sessions.get(session_id)
        if session is None or acked_below <= session.forgotten_below:
            return
        session.forgotten_below = acked_below
        # Answers are kept in the order they were given, which is nearly sequence order:
        # drop from the oldest on (one a delayed append left behind goes with a later call).
        answers = session.answers
        while answers:
            oldest = next(iter(answers))
            if oldest >= acked_below:
                break
            del answers[oldest]

    def _refuse(self, reason: Refusal, message: str) -> Refuse:
        return Refuse(reason, message, self.next_position, self.epoch, self.begin)

    def admit(self, conditions: Conditions) -> Verdict:
        """The verdict on an append with these conditions if it went to `next_position`."""
        c = conditions
        if c.session:
            if c.sequence == 0:
                return self._refuse(
                    Refusal.INVALID_ARGUMENT, "a session append needs a sequence number (from 1)"
                )
            if c.sequence < c.acked_below:
                return self._refuse(
                    Refusal.INVALID_ARGUMENT,
                    f"sequence {c.sequence} is below its own acked_below {c.acked_below}",
                )
            session = self.sessions.get(c.session)
            if session is None:
                if c.session < self.horizon:
                    return self._refuse(
                        Refusal.SESSION_EXPIRED,
                        f"session {c.session} has expired (sessions last {self.window} "
                        f"positions and the log begins at {self.begin}; next position "
                        f"{self.next_position}): open a new one",
                    )
                return self._refuse(
                    Refusal.UNKNOWN_SESSION, f"session {c.session} was never opened in this log"
                )
            if not session.check:
                return self._refuse(
                    Refusal.SESSION_NOT_YOURS,
                    f"session {c.session} was opened without a secret (by a replica that "
                    "predates session secrets): it takes no appends; open a new session",
                )
            if not hmac.compare_digest(session_check(c.secret), session.check):
                return self._refuse(
                    Refusal.SESSION_NOT_YOURS,
                    f"session {c.session} is not yours: the append "
                    + ("carries no session secret" if not c.secret else "has the wrong secret")
                    + " (a session append needs the secret OpenSession gave its opener)",
                )
            answer = session.answers.get(c.sequence)
            if answer is not None:
                first, count = answer
                return Duplicate(list(range(first, first + count)))
            if c.sequence < session.forgotten_below:
                return self._refuse(
                    Refusal.SEQUENCE_FORGOTTEN,
                    f"sequence {c.sequence} of session {c.session} is from the far past: "
                    f"the client acknowledged every answer below {session.forgotten_below}",
                )
        if c.epoch > self.epoch:
            return self._refuse(
                Refusal.EPOCH_FROM_FUTURE,
                f"epoch {c.epoch} was never taken: the log's epoch is {self.epoch}",
            )
        if c.epoch and c.epoch < self.epoch:
            return self._refuse(
                Refusal.CONDITION_FAILED,
                f"condition failed: epoch {c.epoch} is fenced by epoch {self.epoch}",
            )
        if c.if_next is not None:
            if c.if_next < self.begin:
                return self._refuse(
                    Refusal.TRUNCATED,
                    f"condition on position {c.if_next}, which is truncated: "
                    f"the log begins at {self.begin}",
                )
            if c.if_next != self.next_position:
                return self._refuse(
                    Refusal.CONDITION_FAILED,
                    f"condition failed: the next position is {self.next_position}, not {c.if_next}",
                )
        return Admit()
