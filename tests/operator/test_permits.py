"""Who gets the initialization permit and when (rlog_operator.permits), one rule per test."""

from helpers import NAMES, UID, facts, rs

from rlog_operator import permits
from rlog_operator.permits import PermitDecision, Policy


def may(**kw):
    args = {
        "initialized": False,
        "data_loss": False,
        "auto_initialize": True,
        "annotations": {},
        "uid": UID,
    }
    return permits.may_initialize(**{**args, **kw})


# ---- the policy -------------------------------------------------------------------------------


def test_a_new_log_with_auto_initialize():
    assert may() == Policy(True, "a new log (spec.autoInitialize)")


def test_a_new_log_without_auto_initialize_needs_the_annotation_with_its_uid():
    assert may(auto_initialize=False) == Policy(
        False,
        f"spec.autoInitialize is false: set the annotation rlog.io/initialize={UID} "
        "to initialize the log",
    )
    assert may(auto_initialize=False, annotations={"rlog.io/initialize": UID}) == Policy(
        True, "a new log (annotation rlog.io/initialize)"
    )
    # copied from another log's manifest: not this log's uid
    assert not may(auto_initialize=False, annotations={"rlog.io/initialize": "other"}).allowed
    # no uid yet: no annotation value can match
    assert not may(auto_initialize=False, uid="", annotations={"rlog.io/initialize": ""}).allowed


def test_an_initialized_log_is_never_initialized_again():
    assert may(initialized=True) == Policy(False, "the log is initialized")
    assert may(initialized=True, annotations={"rlog.io/initialize": UID}).allowed is False
    assert may(initialized=True, annotations={"rlog.io/reinitialize": UID}).allowed is False


def test_the_data_loss_hold_and_its_acknowledgement():
    held = may(initialized=True, data_loss=True, auto_initialize=True)
    assert held == Policy(
        False,
        "every replica is EMPTY in a log that was initialized: suspected data loss; "
        f"set the annotation rlog.io/reinitialize={UID} to start an empty log",
    )
    acked = may(initialized=True, data_loss=True, annotations={"rlog.io/reinitialize": UID})
    assert acked == Policy(True, "re-initialization acknowledged by rlog.io/reinitialize")
    assert not may(data_loss=True, annotations={"rlog.io/reinitialize": "x"}).allowed
    # the first-initialization annotation does not acknowledge a loss
    assert not may(data_loss=True, annotations={"rlog.io/initialize": UID}).allowed


def test_policy_reads_the_facts():
    assert permits.policy(facts(initialized=False)) == Policy(
        True, "a new log (spec.autoInitialize)"
    )
    assert permits.policy(facts()) == Policy(False, "the log is initialized")


# ---- who should hold it -----------------------------------------------------------------------


def test_while_allowed_empty_and_starting_replicas_hold_it():
    new = facts(initialized=False)
    assert permits.should_hold(new, True, "EMPTY") is True
    assert permits.should_hold(new, True, "STARTING") is True
    assert permits.should_hold(new, True, "VOTING") is False
    assert permits.should_hold(new, True, "RECOVERING") is False
    assert permits.should_hold(new, False, "EMPTY") is False


def test_a_starting_replica_of_an_initialized_log_keeps_it():
    assert permits.should_hold(facts(), False, "STARTING") is True
    assert permits.should_hold(facts(), False, "EMPTY") is False  # it recovers instead
    assert permits.should_hold(facts(data_loss=True), False, "STARTING") is False


# ---- the decision -----------------------------------------------------------------------------


def replicas(*states, permit=False):
    return {
        name: (rs(i, state, permit=permit) if state else None)
        for i, (name, state) in enumerate(zip(NAMES, states, strict=True))
    }


def test_grants_to_every_answering_empty_replica_of_a_new_log():
    f = facts(initialized=False, replicas=replicas("EMPTY", "EMPTY", None), reached=NAMES[:2])
    decision = permits.decide(f)
    assert decision == PermitDecision(
        allowed=True,
        policy="a new log (spec.autoInitialize)",
        grant=("orders-0", "orders-1"),
        answering=2,
    )
    assert decision.reason() == ""


def test_revokes_from_holders_that_should_not_hold_it():
    decision = permits.decide(facts(replicas=replicas("VOTING", "EMPTY", "VOTING", permit=True)))
    assert decision.grant == () and decision.revoke == NAMES
    assert decision.allowed is False and decision.policy == "the log is initialized"


def test_holders_keep_it():
    f = facts(initialized=False, replicas=replicas("STARTING", "STARTING", "STARTING", permit=True))
    decision = permits.decide(f)
    assert decision.grant == () and decision.revoke == () and decision.holding == NAMES
    assert decision.reason() == "orders-0, orders-1, orders-2 already hold the permit"


def test_grants_are_withheld_while_a_replicas_change_is_refused():
    refusal = "spec.replicas cannot change (3 -> 5)"
    f = facts(initialized=False, refused=refusal, replicas=replicas("EMPTY", "EMPTY", "EMPTY"))
    decision = permits.decide(f)
    assert decision.grant == () and decision.withheld == NAMES and decision.refusal == refusal
    assert decision.reason() == f"not granting orders-0, orders-1, orders-2: {refusal}"
    # revocations still go out
    f = facts(refused=refusal, replicas=replicas("VOTING", "VOTING", "VOTING", permit=True))
    decision = permits.decide(f)
    assert decision.revoke == NAMES and decision.withheld == () and decision.refusal == ""


def test_reason_when_not_allowed():
    decision = permits.decide(facts())
    assert decision.grant == () and decision.revoke == ()
    assert decision.reason() == "the log is initialized"
    held = permits.decide(facts(data_loss=True, replicas=replicas("EMPTY", "EMPTY", "EMPTY")))
    assert held.reason().startswith("every replica is EMPTY in a log that was initialized")


def test_reason_when_allowed_but_nobody_to_grant():
    nobody = facts(initialized=False, replicas=replicas(None, None, None), reached=())
    assert permits.decide(nobody).reason() == "no replica answers"
    recovering = facts(initialized=False, replicas=replicas("RECOVERING", None, None))
    assert permits.decide(recovering).reason() == "no answering replica is EMPTY or STARTING"
