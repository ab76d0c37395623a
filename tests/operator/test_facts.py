"""The facts of one observation (rlog_operator.facts.gather), one rule per test."""

import dataclasses

import pytest
from helpers import REV_NEW, REV_OLD, UID, cr, facts, pod, rs

from rlog_operator.facts import condition_true, gather


def healthy(n=3):
    return [pod(i) for i in range(n)], {f"orders-{i}": rs(i) for i in range(n)}


def observe(body=None, pods=None, statuses=None, previous=None, revision=REV_NEW, **kw):
    if pods is None and statuses is None:
        pods, statuses = healthy()
    return gather(body or cr(), pods or [], statuses or {}, revision, previous, **kw)


def test_the_log_from_its_cr():
    f = observe(cr(replicas=5, auto=False, annotations={"a": "b"}, generation=4), [], {})
    assert f.uid == UID and f.generation == 4
    assert f.names == tuple(f"orders-{i}" for i in range(5)) and f.size == 5
    assert f.quorum_size == 3
    assert f.auto_initialize is False and f.annotations == {"a": "b"}
    assert f.update_revision == REV_NEW


def test_a_healthy_log():
    f = observe()
    assert f.voting == ("orders-0", "orders-1", "orders-2")
    assert f.reached == f.voting and f.ready == f.voting
    assert f.down == () and f.recovering == () and f.foreign == () and f.outdated == ()
    assert f.quorum is True and f.leader == "orders-0"
    assert f.initialized is True and f.was_initialized is False
    assert f.data_loss is False and f.failure == ""
    assert f.count("VOTING") == 3 and f.count("EMPTY") == 0
    assert f.summary() == "3 VOTING"


def test_states_and_counts():
    pods, statuses = healthy()
    statuses["orders-0"] = rs(0, "EMPTY")
    statuses["orders-1"] = rs(1, "RECOVERING")
    statuses["orders-2"] = None
    f = observe(pods=pods, statuses=statuses)
    assert f.states == {"orders-0": "EMPTY", "orders-1": "RECOVERING", "orders-2": "Unknown"}
    assert f.count("EMPTY") == 1 and f.count("RECOVERING") == 1 and f.count("Unknown") == 1
    assert f.summary() == "1 RECOVERING, 1 EMPTY, 1 Unknown"
    assert f.reached == ("orders-0", "orders-1") and f.down == ("orders-2",)
    assert f.recovering == ("orders-0", "orders-1")


def test_a_terminating_pod_does_not_answer():
    pods, statuses = healthy()
    pods[1] = pod(1, terminating=True)
    f = observe(pods=pods, statuses=statuses)
    assert f.replicas["orders-1"] is None and f.states["orders-1"] == "Unknown"
    assert f.voting == ("orders-0", "orders-2") and f.down == ("orders-1",)


def test_pods_of_other_ordinals_are_ignored():
    pods, statuses = healthy()
    pods.append(pod(3))
    statuses["orders-3"] = rs(3)
    f = observe(pods=pods, statuses=statuses)
    assert set(f.pods) == set(f.names) and "orders-3" not in f.replicas


def test_no_quorum_no_leader():
    pods, statuses = healthy()
    statuses["orders-1"] = statuses["orders-2"] = None
    f = observe(pods=pods, statuses=statuses)
    assert f.voting == ("orders-0",) and f.quorum is False and f.leader == ""


def test_initialized_is_sticky():
    assert observe(pods=[], statuses={}).initialized is False
    f = observe(pods=[], statuses={}, previous={"initialized": True})
    assert f.initialized is True and f.was_initialized is True


def all_empty():
    return [pod(i) for i in range(3)], {f"orders-{i}": rs(i, "EMPTY") for i in range(3)}


def test_data_loss_is_an_initialized_log_all_empty():
    pods, statuses = all_empty()
    assert observe(pods=pods, statuses=statuses).data_loss is False  # a new log
    f = observe(pods=pods, statuses=statuses, previous={"initialized": True})
    assert f.data_loss is True and f.was_data_loss is False


def test_partial_answers_are_no_data_loss():
    pods, statuses = all_empty()
    statuses["orders-2"] = None
    assert observe(pods=pods, statuses=statuses, previous={"initialized": True}).data_loss is False


def test_data_loss_stays_until_a_voting_quorum():
    held = {"initialized": True, "conditions": [{"type": "DataLoss", "status": "True"}]}
    pods, statuses = all_empty()
    statuses["orders-2"] = None
    f = observe(pods=pods, statuses=statuses, previous=held)
    assert f.was_data_loss is True and f.data_loss is True
    f = observe(previous=held)  # every replica VOTING again
    assert f.was_data_loss is True and f.data_loss is False


def test_foreign_replicas():
    pods, statuses = healthy()
    statuses["orders-2"] = rs(2, log_id="another")
    f = observe(pods=pods, statuses=statuses)
    assert f.foreign == ("orders-2",)
    assert "orders-2 belong to another log" in f.failure and UID in f.failure


def test_outdated_pods_mean_rolling():
    pods, statuses = healthy()
    pods[2] = pod(2, revision=REV_OLD)
    f = observe(pods=pods, statuses=statuses)
    assert f.outdated == ("orders-2",) and f.rolling is True
    # no update revision known: nothing is outdated
    assert observe(pods=pods, statuses=statuses, revision="").outdated == ()


def test_a_queued_replacement_means_rolling():
    queue = [{"pod": "orders-1", "uid": "uid-1", "action": "restart"}]
    f = observe(rolling_update={"queue": queue, "message": "replacing orders-1"})
    assert f.rolling is True and f.outdated == ()
    assert f.rolling_queue == tuple(queue) and f.rolling_message == "replacing orders-1"
    assert observe().rolling is False


def test_failure_error_first_then_refusal_then_foreign():
    pods, statuses = healthy()
    statuses["orders-2"] = rs(2, log_id="another")
    assert observe(pods=pods, statuses=statuses, error="boom", refused="no").failure == "boom"
    assert observe(pods=pods, statuses=statuses, refused="no").failure == "no"
    f = observe(refused="spec.replicas cannot change")
    assert f.refused == "spec.replicas cannot change" and f.error == ""


def test_facts_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        facts().quorum = False  # type: ignore[misc]


def test_condition_true():
    status = {"conditions": [{"type": "DataLoss", "status": "True"}, {"type": "Ready"}]}
    assert condition_true(status, "DataLoss") is True
    assert condition_true(status, "Ready") is False
    assert condition_true({}, "DataLoss") is False
