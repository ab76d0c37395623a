"""What an exactly-once append does after a failed try: a pure rule of what happened.

An exactly-once append is sent with (session, sequence) and re-sent with the same pair
while its outcome is unknown, until its deadline; the log answers a retry of an append it
already holds with the original positions (docs/protocol.md). After each failed try the
loop in `sessions.ExactlyOnce` gathers the facts (`TryFailed`: the error, what the earlier
tries showed, the time left) and `next_turn` says what comes next and why (`Turn`):

- `RESEND`: the same session and sequence again, after a short pause (to whichever
  endpoint the carrier goes to: the unary call moves on where that is safe);
- `RENEW`: the session is gone (expired, unknown) and nothing of this append was sent
  before: a new session and sequence, at once;
- `GIVE_UP`: raise `error`, the try's own or one that says the outcome is unknown.

The loop does the I/O (the tries, the pause, opening a session); nothing here waits or
reads a clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from rlog.client.errors import (
    OutcomeUnknown,
    OutcomeUnknownTimeout,
    OutcomeUnknownUnavailable,
    RlogError,
    SessionExpired,
    SessionExpiredOutcomeUnknown,
    SessionNotYours,
    Timeout,
    Unavailable,
    UnknownSession,
)


class Next(enum.Enum):
    RESEND = "resend"  # the same session and sequence, after `Turn.delay`
    RENEW = "renew"  # a new session and sequence, at once
    GIVE_UP = "give up"  # raise `Turn.error`


@dataclass(frozen=True, slots=True)
class Tries:
    """What the tries of one append have shown so far."""

    count: int = 0  # tries made
    uncertain: bool = False  # a try may have been applied (its outcome was unknown)
    renewed: bool = False  # the session was replaced after a first try found it gone
    first_error: RlogError | None = None  # what the first try that was re-sent ended with


@dataclass(frozen=True, slots=True)
class TryFailed:
    """The facts of one failed try."""

    error: RlogError
    before: Tries  # the tries before this one
    deadline_passed: bool  # the append's deadline has passed (never, without one)
    budget: float | None  # the seconds this try was given (None: no deadline)


@dataclass(frozen=True, slots=True)
class Turn:
    """What to do next, and why."""

    next: Next
    why: str
    tries: Tries  # the tries so far, this one included
    error: RlogError | None = None  # GIVE_UP: the error to raise (the try's own, or new)
    delay: float = 0.0  # RESEND: seconds to wait before it
    unknown_outcome: bool = False  # this try's outcome is unknown (`retried_appends` counts it)


def resend_delay(count: int) -> float:
    """The pause before re-sending after `count` tries: growing, at most half a second."""
    return min(0.05 * count, 0.5)


def next_turn(failed: TryFailed) -> Turn:
    error = failed.error
    tries = replace(failed.before, count=failed.before.count + 1)
    if isinstance(error, UnknownSession | SessionExpired | SessionNotYours):
        # (SessionNotYours reaches an honest client only for a session opened through a
        # leader that predates session secrets, during a rolling upgrade: it took no append.)
        return _session_gone(error, tries)
    if isinstance(error, OutcomeUnknown | Unavailable):
        return _unsettled(error, tries, failed)
    return Turn(
        Next.GIVE_UP,
        "the server answered the append itself (refused it, or failed it knowing it did "
        "nothing): sending it again would be answered the same",
        tries,
        error,
    )


def _session_gone(error: RlogError, tries: Tries) -> Turn:
    """The log does not know the session, or it expired, or it takes no append of ours."""
    if tries.renewed and not tries.uncertain:
        return Turn(
            Next.GIVE_UP,
            "a session opened just now was refused as well: not a question of its age",
            tries,
            error,
        )
    if tries.uncertain:
        return Turn(
            Next.GIVE_UP,
            "an earlier try may be in the log, and a new session could append it again",
            tries,
            SessionExpiredOutcomeUnknown(
                f"{error}; an earlier try of this append may be in the log: outcome unknown",
                error.code,
                error.endpoint,
            ),
        )
    return Turn(
        Next.RENEW,
        "nothing of this append was sent before: a new session is safe",
        replace(tries, renewed=True),
    )


def _unsettled(error: RlogError, tries: Tries, failed: TryFailed) -> Turn:
    """The outcome is unknown, or no leader or endpoint answered.

    A first try that certainly did nothing (no leader, no endpoint reachable) fails at
    once, as without sessions; once a try may have gone through, re-send until the
    deadline (a retry finding no leader during the election says nothing of the earlier
    try)."""
    unknown = isinstance(error, OutcomeUnknown)
    if unknown:
        tries = replace(tries, uncertain=True)
    if not tries.uncertain:
        return Turn(
            Next.GIVE_UP,
            "no try may have been applied: the append certainly did nothing, as without sessions",
            tries,
            error,
        )
    # A timed-out try that had less than a second was cut by the append's deadline.
    out_of_time = failed.deadline_passed or (
        isinstance(error, Timeout) and failed.budget is not None and failed.budget < 1
    )
    if not out_of_time:
        return Turn(
            Next.RESEND,
            "a try may have been applied and time is left: the same sequence again, which "
            "the log answers with the original positions if it holds the append",
            replace(tries, first_error=tries.first_error or error),
            delay=resend_delay(tries.count),
            unknown_outcome=unknown,
        )
    if isinstance(error, Timeout) and tries.first_error is not None:
        return Turn(
            Next.GIVE_UP,
            "the deadline cut the last try: say what the replicas said first",
            tries,
            OutcomeUnknownTimeout(
                f"not acknowledged within the append deadline after {tries.count} "
                f"tries; the first ended with: {tries.first_error}",
                error.code,
                error.endpoint,
            ),
            unknown_outcome=unknown,
        )
    if unknown:
        return Turn(
            Next.GIVE_UP,
            "out of time, and the try itself says the outcome is unknown",
            tries,
            error,
            unknown_outcome=True,
        )
    return Turn(
        Next.GIVE_UP,
        "out of time: the last try did nothing, but an earlier one may be in the log",
        tries,
        OutcomeUnknownUnavailable(
            f"{error}; an earlier try of this append may be in the log: outcome unknown",
            error.code,
            error.endpoint,
        ),
    )


__all__ = ["Next", "Tries", "TryFailed", "Turn", "next_turn", "resend_delay"]
