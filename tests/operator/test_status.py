"""Status, conditions, Events and the initialization permit (rlog_operator.status)."""

from helpers import LATER, NOW, REV_NEW, REV_OLD, UID, V134_CONFLICT, cr, pod, rs

from rlog_operator import observed, permits
from rlog_operator import status as st


def compute(body, pods, statuses, previous=None, now=NOW, revision=REV_NEW, **kw):
    return st.compute_status(body, pods, statuses, revision, previous, now, **kw)


def cond(status, type_):
    (c,) = [c for c in status["conditions"] if c["type"] == type_]
    return c


def reasons(result):
    return [e.reason for e in result.events]


def healthy(n=3, leader=0):
    pods = [pod(i) for i in range(n)]
    statuses = {f"orders-{i}": rs(i, leader=leader) for i in range(n)}
    return pods, statuses


# ---- phases ---------------------------------------------------------------------------------


def test_pending_without_pods():
    r = compute(cr(), [], {})
    assert r.status["phase"] == "Pending"
    assert r.status["initialized"] is False
    assert cond(r.status, "Ready")["status"] == "False"
    assert len(r.status["replicas"]) == 3  # one item per expected pod
    assert {i["status"] for i in r.status["replicas"]} == {"Unknown"}


def test_initializing_grants_permits_to_every_empty_replica():
    pods = [pod(i, ready=False) for i in range(3)]
    statuses = {f"orders-{i}": rs(i, "EMPTY", leader=None) for i in range(3)}
    r = compute(cr(), pods, statuses)
    assert r.status["phase"] == "Initializing"
    assert r.permit.allowed
    assert r.permit.grant == ("orders-0", "orders-1", "orders-2")
    assert r.permit.revoke == ()
    # already held: nothing to grant again
    statuses = {f"orders-{i}": rs(i, "STARTING", leader=None, permit=True) for i in range(3)}
    r = compute(cr(), pods, statuses)
    assert r.permit.grant == () and r.permit.revoke == ()


def test_ready_and_initialized_is_sticky():
    pods, statuses = healthy()
    r = compute(cr(), pods, statuses)
    s = r.status
    assert s["phase"] == "Ready"
    assert s["initialized"] is True and s["quorum"] is True
    assert s["leader"] == "orders-0"
    assert s["votingReplicas"] == 3 and s["readyReplicas"] == 3
    assert "Initialized" in reasons(r) and "LeaderElected" in reasons(r)
    assert cond(s, "Ready")["status"] == "True"
    assert cond(s, "Initialized")["status"] == "True"
    # everything gone afterwards: still initialized
    r2 = compute(cr(), [], {}, previous=s, now=LATER)
    assert r2.status["initialized"] is True
    assert r2.status["phase"] == "Degraded"
    assert cond(r2.status, "Ready")["status"] == "False"
    assert "QuorumLost" in reasons(r2)


def test_no_permit_once_initialized():
    pods, statuses = healthy()
    statuses["orders-2"] = rs(2, "EMPTY", permit=True)  # a wiped replica holding a permit
    prev = compute(cr(), *healthy()).status
    r = compute(cr(), pods, statuses, previous=prev)
    assert not r.permit.allowed
    assert r.permit.revoke == ("orders-2",)
    assert r.permit.grant == ()
    assert r.status["phase"] == "Recovering"
    assert cond(r.status, "Recovering")["status"] == "True"
    assert cond(r.status, "Degraded")["status"] == "True"
    assert "ReplicaEmpty" in reasons(r)


def test_starting_replica_keeps_its_permit_after_initialization():
    """Half-finished auto-init: one VOTING, two STARTING. Revoking would strand them."""
    pods = [pod(i) for i in range(3)]
    statuses = {
        "orders-0": rs(0, "VOTING", permit=True),
        "orders-1": rs(1, "STARTING", permit=True),
        "orders-2": rs(2, "STARTING", permit=False),
    }
    r = compute(cr(), pods, statuses)
    assert r.status["initialized"] is True
    assert r.permit.grant == ("orders-2",)
    assert r.permit.revoke == ("orders-0",)


def test_recovering_shows_catchup():
    pods, statuses = healthy()
    statuses["orders-1"] = rs(1, "RECOVERING", catchup_end=500, catchup_done=120)
    prev = compute(cr(), *healthy()).status
    r = compute(cr(), pods, statuses, previous=prev)
    assert r.status["phase"] == "Recovering"
    item = r.status["replicas"][1]
    assert item["status"] == "RECOVERING" and item["catchup"] == "120/500"
    # and back to VOTING: an Event
    r2 = compute(cr(), *healthy(), previous=r.status)
    assert r2.status["phase"] == "Ready"
    assert "ReplicaRecovered" in reasons(r2)


def test_degraded_when_a_replica_is_unreachable():
    pods, statuses = healthy()
    statuses["orders-2"] = None
    pods[2] = pod(2, ready=False, stuck="CrashLoopBackOff")
    r = compute(cr(), pods, statuses, previous=compute(cr(), *healthy()).status)
    assert r.status["phase"] == "Degraded"
    assert r.status["quorum"] is True
    assert r.status["replicas"][2]["status"] == "Unknown"
    assert "CrashLoopBackOff" in r.status["replicas"][2]["reason"]
    assert cond(r.status, "Ready")["status"] == "True"  # the log still serves


def test_no_quorum_is_degraded_not_ready():
    pods, statuses = healthy()
    statuses["orders-1"] = None
    statuses["orders-2"] = None
    prev = compute(cr(), *healthy()).status
    r = compute(cr(), pods, statuses, previous=prev)
    assert r.status["phase"] == "Degraded" and r.status["quorum"] is False
    assert r.status["leader"] == ""
    assert cond(r.status, "Degraded")["reason"] == "NoQuorum"
    r2 = compute(cr(), *healthy(), previous=r.status)
    assert "QuorumRestored" in reasons(r2)


def test_rolling_update_phase_and_events():
    pods, statuses = healthy()
    pods[0] = pod(0, revision=REV_OLD)
    prev = compute(cr(), *healthy()).status
    r = compute(cr(), pods, statuses, previous=prev)
    assert r.status["phase"] == "RollingUpdate"
    assert r.status["replicas"][0]["updated"] is False
    assert r.status["replicas"][1]["updated"] is True
    assert "RollingUpdateStarted" in reasons(r)
    r2 = compute(cr(), *healthy(), previous=r.status)
    assert "RollingUpdateCompleted" in reasons(r2)
    assert r2.status["phase"] == "Ready"


def test_rolling_queue_is_kept_in_status():
    queue = [{"pod": "orders-1", "uid": "old", "action": "restart"}]
    r = compute(cr(), *healthy(), rolling_update={"queue": queue, "message": "waiting"})
    assert r.status["rollingUpdate"] == {"queue": queue, "message": "waiting"}
    assert r.status["phase"] == "RollingUpdate"


def test_failed_on_foreign_log_id_or_error():
    pods, statuses = healthy()
    statuses["orders-1"] = rs(1, log_id="another")
    r = compute(cr(), pods, statuses)
    assert r.status["phase"] == "Failed" and "another log" in r.status["message"]
    assert "Failed" in reasons(r)
    r = compute(cr(), *healthy(), error="cannot create StatefulSet: forbidden")
    assert r.status["phase"] == "Failed"


def test_terminating_pod_does_not_count():
    pods, statuses = healthy()
    pods[0] = pod(0, terminating=True)
    r = compute(cr(), pods, statuses)
    assert r.status["votingReplicas"] == 2


# ---- conditions -----------------------------------------------------------------------------


def test_last_transition_time_changes_only_on_flip():
    r1 = compute(cr(), *healthy(), now=NOW)
    r2 = compute(cr(generation=2), *healthy(), previous=r1.status, now=LATER)
    assert cond(r2.status, "Ready")["lastTransitionTime"] == NOW
    assert cond(r2.status, "Ready")["observedGeneration"] == 2
    assert r2.status["observedGeneration"] == 2
    assert r2.events == []  # nothing flipped
    pods, statuses = healthy()
    statuses = {k: None for k in statuses}
    r3 = compute(cr(), pods, statuses, previous=r2.status, now=LATER)
    assert cond(r3.status, "Ready")["lastTransitionTime"] == LATER
    assert cond(r3.status, "Initialized")["lastTransitionTime"] == NOW


def test_every_condition_type_present():
    r = compute(cr(), [], {})
    assert [c["type"] for c in r.status["conditions"]] == list(st.CONDITION_TYPES)
    assert set(r.status) == set(st.STATUS_FIELDS)
    for item in compute(cr(), *healthy()).status["replicas"]:
        assert set(item) <= set(st.REPLICA_FIELDS)


# ---- initialization policy ------------------------------------------------------------------


def test_auto_initialize_false_waits_for_the_annotation():
    pods = [pod(i, ready=False) for i in range(3)]
    statuses = {f"orders-{i}": rs(i, "EMPTY", leader=None) for i in range(3)}
    r = compute(cr(auto=False), pods, statuses)
    assert r.status["phase"] == "Initializing"
    assert not r.permit.allowed and r.permit.grant == ()
    assert cond(r.status, "Initialized")["reason"] == "AwaitingInitializeAnnotation"
    assert f"rlog.io/initialize={UID}" in r.status["message"]
    # an annotation with another uid (copied manifest) is not enough
    r = compute(cr(auto=False, annotations={"rlog.io/initialize": "other"}), pods, statuses)
    assert not r.permit.allowed
    r = compute(cr(auto=False, annotations={"rlog.io/initialize": UID}), pods, statuses)
    assert r.permit.allowed and len(r.permit.grant) == 3


def test_may_initialize_rules():
    def may(**kw):
        args = {
            "initialized": False,
            "data_loss": False,
            "auto_initialize": True,
            "annotations": {},
            "uid": UID,
        }
        return permits.may_initialize(**{**args, **kw})[0]

    assert may()
    assert not may(initialized=True)
    assert not may(initialized=True, annotations={"rlog.io/initialize": UID})
    assert not may(auto_initialize=False)
    assert may(auto_initialize=False, annotations={"rlog.io/initialize": UID})
    assert not may(initialized=True, data_loss=True)
    assert may(initialized=True, data_loss=True, annotations={"rlog.io/reinitialize": UID})
    assert not may(initialized=True, data_loss=True, annotations={"rlog.io/reinitialize": "x"})


def all_empty(n=3, permit=False):
    return (
        [pod(i, ready=False) for i in range(n)],
        {f"orders-{i}": rs(i, "EMPTY", leader=None, permit=permit) for i in range(n)},
    )


def test_data_loss_when_an_initialized_log_comes_back_all_empty():
    prev = compute(cr(), *healthy()).status
    r = compute(cr(), *all_empty(), previous=prev, now=LATER)
    s = r.status
    assert s["phase"] == "DataLoss"
    assert s["initialized"] is True
    assert cond(s, "DataLoss")["status"] == "True"
    assert not r.permit.allowed and r.permit.grant == ()
    (event,) = [e for e in r.events if e.reason == "DataLoss"]
    assert event.type == "Warning" and f"rlog.io/reinitialize={UID}" in event.message
    # stays so, with no new Event, while nobody acts
    r2 = compute(cr(), *all_empty(), previous=s, now=LATER)
    assert r2.status["phase"] == "DataLoss" and "DataLoss" not in reasons(r2)
    assert cond(r2.status, "DataLoss")["lastTransitionTime"] == LATER


def test_partial_answers_are_not_data_loss():
    prev = compute(cr(), *healthy()).status
    pods, statuses = all_empty()
    statuses["orders-2"] = None  # might hold the log
    r = compute(cr(), pods, statuses, previous=prev)
    assert r.status["phase"] == "Degraded"
    assert cond(r.status, "DataLoss")["status"] == "False"


def test_reinitialize_after_data_loss():
    annotated = cr(annotations={"rlog.io/reinitialize": UID})
    prev = compute(cr(), *healthy()).status
    loss = compute(cr(), *all_empty(), previous=prev).status
    # the user acknowledges: permits go out, DataLoss stays until a VOTING quorum
    r = compute(annotated, *all_empty(), previous=loss)
    assert r.permit.allowed and len(r.permit.grant) == 3
    assert r.status["phase"] == "DataLoss"
    pods = [pod(i, ready=False) for i in range(3)]
    starting = {f"orders-{i}": rs(i, "STARTING", leader=None, permit=True) for i in range(3)}
    r = compute(annotated, pods, starting, previous=r.status)
    assert r.status["phase"] == "DataLoss" and r.permit.allowed and r.permit.revoke == ()
    # VOTING again: DataLoss clears, the annotation is removed (one-shot), permits revoked
    voting = {f"orders-{i}": rs(i, permit=True) for i in range(3)}
    r = compute(annotated, [pod(i) for i in range(3)], voting, previous=r.status)
    assert r.status["phase"] == "Ready"
    assert cond(r.status, "DataLoss")["status"] == "False"
    assert "Reinitialized" in reasons(r)
    assert r.remove_annotations == ["rlog.io/reinitialize"]
    assert not r.permit.allowed and len(r.permit.revoke) == 3


def test_data_loss_without_annotation_grants_nothing_even_to_starting():
    prev = compute(cr(), *healthy()).status
    loss = compute(cr(), *all_empty(), previous=prev).status
    pods = [pod(i, ready=False) for i in range(3)]
    statuses = {f"orders-{i}": rs(i, "STARTING", leader=None) for i in range(3)}
    r = compute(cr(), pods, statuses, previous=loss)
    assert r.status["phase"] == "DataLoss"
    assert r.permit.grant == ()


# ---- helpers --------------------------------------------------------------------------------


def test_pod_info_from_a_pod_object():
    k8s_pod = {
        "metadata": {
            "name": "orders-1",
            "uid": "u1",
            "labels": {"controller-revision-hash": REV_NEW},
            "annotations": {"rlog.io/replace-volume": "yes"},
        },
        "spec": {
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data-orders-1"}}]
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"state": {"waiting": {"reason": "CrashLoopBackOff"}}}],
        },
    }
    info = observed.pod_info(k8s_pod)
    assert info["name"] == "orders-1" and info["ready"] is True
    assert observed.revision_of(info) == REV_NEW
    assert info["stuck"] == "CrashLoopBackOff"
    assert info["pvc"] == "data-orders-1"
    assert info["deletionTimestamp"] is None
    pending = observed.pod_info(
        {
            "metadata": {"name": "orders-2"},
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "message": V134_CONFLICT,
                    }
                ],
            },
        }
    )
    assert pending["unschedulable"] == V134_CONFLICT
    assert pending["ready"] is False


def test_leader_of():
    statuses = {f"orders-{i}": rs(i, leader=1) for i in range(3)}
    assert observed.leader_of(statuses) == "orders-1"
    statuses["orders-1"] = None  # the leader unreachable, the others still point at it
    assert observed.leader_of(statuses) == "orders-1"
    assert observed.leader_of({"orders-0": None}) == ""


def test_a_refused_replicas_change_fails_and_withholds_grants():
    refusal = "spec.replicas cannot change (3 -> 5)"
    pods = [pod(i, ready=False) for i in range(3)]
    statuses = {f"orders-{i}": rs(i, "EMPTY", leader=None) for i in range(3)}
    r = compute(cr(), pods, statuses, refused=refusal)
    assert r.status["phase"] == "Failed" and r.status["message"] == refusal
    assert reasons(r) == ["Failed"]
    assert r.permit.allowed and r.permit.grant == ()
    assert r.permit.withheld == ("orders-0", "orders-1", "orders-2")


# ---- fresh status: write only what changed ---------------------------------------------------


def test_an_unchanged_observation_writes_nothing_even_later():
    """Observing every second must not write every second: the same observation at a later
    time yields the same status (no timestamp churn), hence an empty patch."""
    pods, statuses = healthy()
    first = compute(cr(), pods, statuses, now=NOW).status
    again = compute(cr(), pods, statuses, previous=first, now=LATER).status
    assert st.status_patch(first, again) == {}


def test_a_position_change_writes_only_the_replicas():
    pods, statuses = healthy()
    first = compute(cr(), pods, statuses, now=NOW).status
    statuses = {**statuses, "orders-1": {**statuses["orders-1"], "end": 99, "learned": 99}}
    again = compute(cr(), pods, statuses, previous=first, now=LATER).status
    patch = st.status_patch(first, again)
    assert list(patch) == ["replicas"]
    (item,) = [i for i in patch["replicas"] if i["name"] == "orders-1"]
    assert item["end"] == 99 and item["learned"] == 99


def test_a_state_change_writes_the_state_and_what_follows_from_it():
    pods, statuses = healthy()
    first = compute(cr(), pods, statuses, now=NOW).status
    statuses = {**statuses, "orders-2": None}
    again = compute(cr(), pods, statuses, previous=first, now=LATER).status
    patch = st.status_patch(first, again)
    assert {"replicas", "phase", "votingReplicas", "conditions"} <= set(patch)
    assert "leader" not in patch and "initialized" not in patch
    assert st.status_patch({}, again) == again  # a first observation writes everything


# ---- pause -----------------------------------------------------------------------------------


def test_paused_log_reports_it_and_grants_nothing():
    pods = [pod(i, ready=False) for i in range(3)]
    statuses = {f"orders-{i}": rs(i, "EMPTY", leader=None) for i in range(3)}
    assert compute(cr(), pods, statuses).permit.grant  # not paused: permits go out
    r = compute(cr(), pods, statuses, paused=True)
    assert r.status["paused"] is True
    assert r.permit.grant == () and r.permit.revoke == ()
    assert r.status["phase"] == "Initializing"  # the observation itself goes on
    assert compute(cr(), pods, statuses).status["paused"] is False
