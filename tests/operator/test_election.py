"""Which operator pod acts (rlog_operator.election): the Lease decisions, pure."""

from rlog_operator import election as el
from rlog_operator.election import LeaseRecord, Sighting


def record(holder="a", renewed="t1", duration=15.0, transitions=0):
    return LeaseRecord(holder, duration, renewed, transitions, version="7")


def test_no_lease_is_created():
    assert el.decide("a", None, None, 0.0) == "create"


def test_the_holder_renews():
    r = record("a")
    assert el.decide("a", r, el.seen(None, r, 0.0), 100.0) == "renew"


def test_a_live_holder_is_waited_for():
    r = record("b")
    sighting = el.seen(None, r, 10.0)
    assert el.decide("a", r, sighting, 10.0) == "wait"
    assert el.decide("a", r, sighting, 24.9) == "wait"


def test_a_holder_not_renewing_for_a_whole_duration_is_taken_over():
    r = record("b")
    sighting = el.seen(None, r, 10.0)
    assert el.decide("a", r, sighting, 25.0) == "take"


def test_a_renewal_restarts_the_count_by_the_standbys_clock():
    first = record("b", renewed="t1")
    sighting = el.seen(None, first, 10.0)
    assert el.seen(sighting, first, 20.0) is sighting  # unchanged: the first sighting stands
    renewed = record("b", renewed="t2")
    sighting = el.seen(sighting, renewed, 20.0)
    assert sighting == Sighting("b", "t2", 20.0)
    assert el.decide("a", renewed, sighting, 30.0) == "wait"
    assert el.decide("a", renewed, sighting, 35.0) == "take"


def test_a_new_holder_restarts_the_count():
    sighting = el.seen(None, record("b"), 0.0)
    sighting = el.seen(sighting, record("c"), 14.0)
    assert el.decide("a", record("c"), sighting, 20.0) == "wait"


def test_a_released_lease_is_taken_at_once():
    r = record("")
    assert el.decide("a", r, el.seen(None, r, 0.0), 0.0) == "take"


def test_the_renew_deadline_ends_before_anyone_may_take_over():
    """A holder that cannot renew stops acting (RENEW_DEADLINE) before a standby may take
    the Lease (LEASE_SECONDS after the last renewal it saw)."""
    assert el.RENEW_EVERY < el.RENEW_DEADLINE < el.LEASE_SECONDS


def test_lease_spec_counts_transitions_and_acquire_time():
    created = el.lease_spec("a", None, "T0")
    assert created["holderIdentity"] == "a" and created["leaseTransitions"] == 0
    assert created["acquireTime"] == "T0" and created["renewTime"] == "T0"
    renewed = el.lease_spec("a", record("a", transitions=3), "T1")
    assert renewed["leaseTransitions"] == 3 and "acquireTime" not in renewed
    taken = el.lease_spec("a", record("b", transitions=3), "T2")
    assert taken["leaseTransitions"] == 4 and taken["acquireTime"] == "T2"
    released = el.released_spec(record("a", transitions=4))
    assert "holderIdentity" not in released and released["leaseTransitions"] == 4
