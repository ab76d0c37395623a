"""The exactly-once client's rule after a failed try (`rlog.client.retry.next_turn`), on
hand-built facts: when it re-sends the same sequence, renews the session, or gives up, and
with which error. (tests/client/test_client_sessions.py runs the same rule through a client
against a scripted server.)"""

from __future__ import annotations

import grpc
import pytest

from rlog.client.errors import (
    ConditionFailed,
    EntryTooLarge,
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
from rlog.client.retry import Next, Tries, TryFailed, next_turn

UNAVAILABLE = grpc.StatusCode.UNAVAILABLE
DEADLINE = grpc.StatusCode.DEADLINE_EXCEEDED

FIRST = Tries()  # no try before this one
LOST = OutcomeUnknownUnavailable("leadership lost", grpc.StatusCode.ABORTED, "a:1")
UNCERTAIN = Tries(count=1, uncertain=True, first_error=LOST)  # one try, outcome unknown


def failed(
    error: RlogError,
    before: Tries = FIRST,
    *,
    deadline_passed: bool = False,
    budget: float | None = 30.0,
) -> TryFailed:
    return TryFailed(error, before, deadline_passed, budget)


def expired() -> SessionExpired:
    return SessionExpired("session 100 has expired", grpc.StatusCode.FAILED_PRECONDITION, "a:1")


# ---- the session is gone -------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        expired(),
        UnknownSession("no session 7", grpc.StatusCode.NOT_FOUND, "a:1"),
        # A session opened through a leader that predates secrets, refused by a newer one.
        SessionNotYours("session 7 was opened without a secret", grpc.StatusCode.PERMISSION_DENIED),
    ],
)
def test_a_session_gone_on_a_first_try_is_renewed(error):
    turn = next_turn(failed(error))
    assert turn.next is Next.RENEW
    assert turn.tries == Tries(count=1, renewed=True)
    assert "nothing of this append was sent before" in turn.why


def test_a_renewed_session_refused_again_gives_up_with_the_servers_error():
    error = expired()
    turn = next_turn(failed(error, Tries(count=1, renewed=True)))
    assert turn.next is Next.GIVE_UP
    assert turn.error is error
    assert not isinstance(turn.error, OutcomeUnknown)


@pytest.mark.parametrize("renewed", [False, True])
def test_a_session_gone_after_an_unknown_outcome_is_an_unknown_outcome(renewed):
    error = expired()
    turn = next_turn(failed(error, Tries(count=2, uncertain=True, renewed=renewed)))
    assert turn.next is Next.GIVE_UP
    assert isinstance(turn.error, SessionExpiredOutcomeUnknown)
    assert isinstance(turn.error, OutcomeUnknown)
    assert str(turn.error) == (
        "session 100 has expired; an earlier try of this append may be in the log: outcome unknown"
    )
    assert (turn.error.code, turn.error.endpoint) == (error.code, error.endpoint)


def test_a_session_error_that_is_also_an_unknown_outcome_counts_as_a_session_error():
    error = SessionExpiredOutcomeUnknown("expired", grpc.StatusCode.FAILED_PRECONDITION)
    assert next_turn(failed(error)).next is Next.RENEW


# ---- unknown outcomes and unavailability ---------------------------------------------------


def test_a_first_try_that_did_nothing_gives_up_at_once():
    error = Unavailable("no leader", UNAVAILABLE, "a:1")
    turn = next_turn(failed(error))
    assert turn.next is Next.GIVE_UP
    assert turn.error is error
    assert not turn.unknown_outcome
    assert turn.tries == Tries(count=1)


def test_after_a_renewal_a_try_that_did_nothing_still_gives_up_at_once():
    error = Unavailable("no leader", UNAVAILABLE, "a:1")
    turn = next_turn(failed(error, Tries(count=1, renewed=True)))
    assert (turn.next, turn.error) == (Next.GIVE_UP, error)


def test_an_unknown_outcome_is_resent_with_time_left():
    turn = next_turn(failed(LOST))
    assert turn.next is Next.RESEND
    assert turn.unknown_outcome
    assert turn.tries == Tries(count=1, uncertain=True, first_error=LOST)
    assert turn.delay == pytest.approx(0.05)


def test_no_leader_after_an_unknown_outcome_is_resent_and_the_first_error_kept():
    error = Unavailable("no leader", UNAVAILABLE, "b:1")
    turn = next_turn(failed(error, UNCERTAIN))
    assert turn.next is Next.RESEND
    assert not turn.unknown_outcome  # this try did nothing: not counted as a retry
    assert turn.tries == Tries(count=2, uncertain=True, first_error=LOST)
    assert turn.delay == pytest.approx(0.1)


def test_the_pause_before_a_resend_grows_to_half_a_second():
    turn = next_turn(failed(LOST, Tries(count=30, uncertain=True, first_error=LOST)))
    assert (turn.next, turn.delay) == (Next.RESEND, 0.5)


def test_a_timed_out_try_with_a_second_or_more_left_is_resent():
    error = OutcomeUnknownTimeout("no quorum in time", DEADLINE, "a:1")
    assert next_turn(failed(error, UNCERTAIN, budget=1.0)).next is Next.RESEND
    assert next_turn(failed(error, UNCERTAIN, budget=None)).next is Next.RESEND


def test_a_try_cut_by_the_deadline_says_what_the_first_try_ended_with():
    error = OutcomeUnknownTimeout("not acknowledged within 0.4 s", DEADLINE, "b:1")
    turn = next_turn(failed(error, Tries(count=2, uncertain=True, first_error=LOST), budget=0.4))
    assert turn.next is Next.GIVE_UP
    assert turn.unknown_outcome
    assert isinstance(turn.error, OutcomeUnknownTimeout)
    assert str(turn.error) == (
        "not acknowledged within the append deadline after 3 tries; the first ended with: "
        "leadership lost"
    )
    assert (turn.error.code, turn.error.endpoint) == (DEADLINE, "b:1")


def test_a_first_try_cut_by_the_deadline_gives_up_with_its_own_error():
    error = OutcomeUnknownTimeout("not acknowledged within 0.4 s", DEADLINE, "a:1")
    turn = next_turn(failed(error, budget=0.4))
    assert (turn.next, turn.error) == (Next.GIVE_UP, error)
    assert turn.unknown_outcome


def test_an_unknown_outcome_past_the_deadline_gives_up_with_its_own_error():
    turn = next_turn(failed(LOST, UNCERTAIN, deadline_passed=True))
    assert (turn.next, turn.error) == (Next.GIVE_UP, LOST)
    assert turn.unknown_outcome


def test_no_leader_past_the_deadline_after_an_unknown_outcome_is_an_unknown_outcome():
    error = Unavailable("no leader", UNAVAILABLE, "c:1")
    turn = next_turn(failed(error, UNCERTAIN, deadline_passed=True))
    assert turn.next is Next.GIVE_UP
    assert isinstance(turn.error, OutcomeUnknownUnavailable)
    assert str(turn.error) == (
        "no leader; an earlier try of this append may be in the log: outcome unknown"
    )
    assert (turn.error.code, turn.error.endpoint) == (UNAVAILABLE, "c:1")
    assert not turn.unknown_outcome


# ---- the server's own verdict --------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        ConditionFailed("if_next 5, next is 7", grpc.StatusCode.FAILED_PRECONDITION),
        EntryTooLarge("too large", grpc.StatusCode.INVALID_ARGUMENT),
        Timeout("timed out", DEADLINE),  # a plain timeout, not an unknown outcome
        RlogError("the client is closed"),
    ],
)
@pytest.mark.parametrize("before", [FIRST, UNCERTAIN])
def test_any_other_error_gives_up_as_it_is(error, before):
    turn = next_turn(failed(error, before))
    assert (turn.next, turn.error) == (Next.GIVE_UP, error)
    assert not turn.unknown_outcome
