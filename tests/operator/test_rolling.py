"""The next rolling-replacement step (rlog_operator.rolling)."""

import pytest
from helpers import NOW, REV_NEW, REV_OLD, cr, pod, rs
from hypothesis import given, settings
from hypothesis import strategies as hs

from rlog_operator import rolling
from rlog_operator.constants import quorum


def step(n, pods, statuses, queue=(), pvcs=None, revision=REV_NEW, **kw):
    return rolling.next_step(cr(n), pods, statuses, revision, queue, pvcs, now=NOW, **kw)


def outdated(n, leader=0):
    pods = [pod(i, revision=REV_OLD) for i in range(n)]
    statuses = {f"orders-{i}": rs(i, leader=leader) for i in range(n)}
    return pods, statuses


def replaced(pods, statuses, name, *, status="VOTING", ready=True, leader=0):
    """The pod `name` after its replacement: a new UID on the new revision."""
    i = int(name.rsplit("-", 1)[1])
    pods = [p for p in pods if p["name"] != name] + [
        pod(i, uid=f"new-{i}", revision=REV_NEW, ready=ready)
    ]
    statuses = {**statuses, name: rs(i, status, leader=leader)}
    return pods, statuses


def run_rollout(n, leader=0, max_steps=50):
    """Drive next_step to the end, simulating the cluster: returns the delete order."""
    pods, statuses = outdated(n, leader)
    queue, deleted = [], []
    for _ in range(max_steps):
        action = step(n, pods, statuses, queue)
        queue = action.queue
        if action.kind == "none":
            return deleted, queue
        if action.kind == "step-down":
            leader = (leader + 1) % n  # another replica wins the election
            statuses = {k: rs(int(k[-1]), leader=leader) for k in statuses}
            continue
        assert action.kind == "delete-pod", action
        # safety at the moment of the delete: every other replica VOTING
        others = [s for k, s in statuses.items() if k != action.pod]
        assert all(s["status"] == "VOTING" for s in others)
        deleted.append(action.pod)
        # the new pod comes back; before VOTING the operator waits
        pods, statuses = replaced(
            pods, statuses, action.pod, status="RECOVERING", ready=False, leader=leader
        )
        wait = step(n, pods, statuses, queue)
        assert wait.kind == "wait" and "VOTING" in wait.reason
        pods, statuses = replaced(pods, statuses, action.pod, leader=leader)
    raise AssertionError("rollout did not finish")


@pytest.mark.parametrize("n", [1, 3, 5])
def test_rollout_replaces_every_pod_once_leader_last(n):
    deleted, queue = run_rollout(n, leader=0)
    assert sorted(deleted) == [f"orders-{i}" for i in range(n)]
    assert queue == []
    if n > 1:
        # followers by descending ordinal, then the old leader after its step-down
        assert deleted[: n - 1] == [f"orders-{i}" for i in range(n - 1, 0, -1)]
        assert deleted[-1] == "orders-0"


def test_nothing_to_do_when_up_to_date():
    pods = [pod(i) for i in range(3)]
    statuses = {f"orders-{i}": rs(i) for i in range(3)}
    assert step(3, pods, statuses).kind == "none"


def test_leader_steps_down_first():
    pods = [pod(0, revision=REV_OLD), pod(1), pod(2)]
    statuses = {f"orders-{i}": rs(i, leader=0) for i in range(3)}
    a = step(3, pods, statuses)
    assert a.kind == "step-down" and a.pod == "orders-0" and a.queue == []
    # still the leader after the step-down: ask again, never delete it as leader
    assert step(3, pods, statuses).kind == "step-down"
    statuses = {f"orders-{i}": rs(i, leader=1) for i in range(3)}
    a = step(3, pods, statuses)
    assert a.kind == "delete-pod" and a.pod == "orders-0" and a.uid == "uid-0"
    assert a.queue[0]["pod"] == "orders-0" and a.queue[0]["uid"] == "uid-0"


def test_leader_waits_while_followers_are_blocked():
    pods, statuses = outdated(3, leader=0)
    statuses["orders-1"] = rs(1, "RECOVERING", leader=0)
    pods[1] = pod(1, revision=REV_OLD, ready=False)
    # orders-1 is not participating: replaced first, even though others are not all VOTING
    a = step(3, pods, statuses)
    assert a.kind == "delete-pod" and a.pod == "orders-1"


def test_follower_waits_for_catch_up():
    pods, statuses = outdated(3, leader=0)
    statuses["orders-0"] = rs(0, leader=0, learned=10_000)
    statuses["orders-1"] = rs(1, leader=0, learned=10_000)
    statuses["orders-2"] = rs(2, leader=0, learned=9_990)
    a = step(3, pods, statuses)  # orders-2 is within the slack: orders-2 may go
    assert a.kind == "delete-pod" and a.pod == "orders-2"
    statuses["orders-1"] = rs(1, leader=0, learned=100)  # far behind
    a = step(3, pods, statuses)  # the laggard itself may go: the others are caught up
    assert a.kind == "delete-pod" and a.pod == "orders-1"
    pods[1] = pod(1, revision=REV_NEW)  # only orders-2 is outdated: it waits for orders-1
    a = step(3, pods, statuses)
    assert a.kind == "wait" and "orders-1 is catching up" in a.reason
    statuses["orders-1"] = rs(1, leader=0, learned=100, end=10_000)  # same end: caught up
    statuses["orders-0"] = rs(0, leader=0, learned=10_000, end=10_000)
    assert step(3, pods, statuses).kind == "delete-pod"


def test_no_delete_of_a_voter_when_another_is_down():
    pods, statuses = outdated(3)
    pods[2] = pod(2, revision=REV_NEW, ready=False)
    statuses["orders-2"] = None
    a = step(3, pods, statuses)
    assert a.kind == "wait" and "orders-2 is unreachable" in a.reason


def test_crash_looping_outdated_pods_are_replaced_without_quorum():
    """A bad image: every pod crash-loops. Deleting them lowers no VOTING count."""
    pods = [pod(i, revision=REV_OLD, ready=False, stuck="CrashLoopBackOff") for i in range(3)]
    statuses = {f"orders-{i}": None for i in range(3)}
    a = step(3, pods, statuses)
    assert a.kind == "delete-pod" and a.pod == "orders-2"
    # the new pod answers but cannot turn VOTING without the others: go on with them
    pods, statuses = replaced(pods, statuses, "orders-2", status="EMPTY", ready=False)
    statuses["orders-2"] = rs(2, "VOTING", leader=None)
    pods[-1]["ready"] = False
    a2 = step(3, pods, statuses, a.queue)
    assert a2.kind == "delete-pod" and a2.pod == "orders-1"


def test_one_at_a_time_and_resume_after_restart():
    pods, statuses = outdated(3)
    a = step(3, pods, statuses)
    assert a.kind == "delete-pod" and a.pod == "orders-2"
    queue = a.queue
    # the operator restarted before the delete happened: the delete is issued again
    again = step(3, pods, statuses, queue)
    assert again.kind == "delete-pod" and again.pod == "orders-2" and again.queue == queue
    # the pod is terminating: wait
    pods_t = [p if p["name"] != "orders-2" else {**p, "deletionTimestamp": NOW} for p in pods]
    assert step(3, pods_t, statuses, queue).kind == "wait"
    # no pod yet (StatefulSet recreating it): wait, nothing else is deleted
    pods_gone = [p for p in pods if p["name"] != "orders-2"]
    w = step(3, pods_gone, {**statuses, "orders-2": None}, queue)
    assert w.kind == "wait" and w.queue == queue
    # the new pod (new UID) is RECOVERING: wait
    p2, s2 = replaced(pods, statuses, "orders-2", status="RECOVERING", ready=False)
    w = step(3, p2, s2, queue)
    assert w.kind == "wait" and "orders-2" in w.reason
    # VOTING and ready: finished, the next pod goes
    p3, s3 = replaced(pods, statuses, "orders-2")
    nxt = step(3, p3, s3, queue)
    assert nxt.kind == "delete-pod" and nxt.pod == "orders-1"
    assert [e["pod"] for e in nxt.queue] == ["orders-1"]


def test_queued_restart_rechecks_safety():
    pods, statuses = outdated(3)
    a = step(3, pods, statuses)
    statuses["orders-0"] = None  # another replica went down meanwhile
    w = step(3, pods, statuses, a.queue)
    assert w.kind == "wait" and w.queue == a.queue


def test_single_replica_restarts_with_downtime_but_never_replaces_its_volume():
    pods, statuses = outdated(1)
    a = step(1, pods, statuses)
    assert a.kind == "delete-pod" and a.pod == "orders-0"
    pods = [pod(0, annotations={"rlog.io/replace-volume": "yes"})]
    w = step(1, pods, {"orders-0": rs(0)})
    assert w.kind == "wait" and "1-replica" in w.reason


# ---- volume replacement -----------------------------------------------------------------------


def pvcs(n, **over):
    out = {
        f"data-orders-{i}": {"name": f"data-orders-{i}", "uid": f"pvc-{i}", "phase": "Bound"}
        for i in range(n)
    }
    for name, extra in over.items():
        out[name] = {**out[name], **extra}
    return out


def test_replace_volume_on_annotation():
    pods = [pod(i) for i in range(3)]
    pods[1] = pod(1, annotations={"rlog.io/replace-volume": "true"})
    statuses = {f"orders-{i}": rs(i) for i in range(3)}
    claims = pvcs(3)
    a = step(3, pods, statuses, pvcs=claims)
    assert a.kind == "delete-pvc-and-pod"
    assert (a.pod, a.uid, a.pvc, a.pvc_uid) == ("orders-1", "uid-1", "data-orders-1", "pvc-1")
    (entry,) = a.queue
    assert entry["action"] == "replace-volume" and entry["pvcUid"] == "pvc-1"
    # claim terminating (held by the pod), pod still there: delete the pod
    claims = pvcs(3, **{"data-orders-1": {"deletionTimestamp": NOW}})
    b = step(3, pods, statuses, a.queue, pvcs=claims)
    assert b.kind == "delete-pod" and b.pod == "orders-1"
    # pod gone, claim still terminating: wait for it to go
    gone = [p for p in pods if p["name"] != "orders-1"]
    w = step(3, gone, {**statuses, "orders-1": None}, a.queue, pvcs=claims)
    assert w.kind == "wait" and "terminating" in w.reason
    # a new claim and a new pod, EMPTY then recovering: wait; VOTING: done
    fresh = pvcs(3, **{"data-orders-1": {"uid": "pvc-new"}})
    p2, s2 = replaced(pods, statuses, "orders-1", status="EMPTY", ready=False)
    assert step(3, p2, s2, a.queue, pvcs=fresh).kind == "wait"
    p3, s3 = replaced(pods, statuses, "orders-1")
    done = step(3, p3, s3, a.queue, pvcs=fresh)
    assert done.kind == "none" and done.queue == []


def test_replace_volume_needs_a_voting_quorum_of_others():
    pods = [pod(i) for i in range(3)]
    pods[2] = pod(
        2,
        phase="Pending",
        ready=False,
        unschedulable="0/1 nodes: 1 node(s) had volume node affinity conflict",
    )
    statuses = {"orders-0": rs(0), "orders-1": None, "orders-2": None}
    w = step(3, pods, statuses, pvcs=pvcs(3))
    assert w.kind == "wait" and "VOTING quorum" in w.reason
    statuses["orders-1"] = rs(1)
    a = step(3, pods, statuses, pvcs=pvcs(3))
    assert a.kind == "delete-pvc-and-pod" and a.pod == "orders-2"


def test_lost_claim_is_replaced():
    pods = [pod(i) for i in range(3)]
    pods[0] = pod(0, phase="Pending", ready=False)
    statuses = {"orders-0": None, "orders-1": rs(1, leader=1), "orders-2": rs(2, leader=1)}
    a = step(3, pods, statuses, pvcs=pvcs(3, **{"data-orders-0": {"volumeLost": True}}))
    assert a.kind == "delete-pvc-and-pod" and a.pod == "orders-0"


def test_no_delete_while_a_claim_is_terminating():
    pods, statuses = outdated(3)
    w = step(3, pods, statuses, pvcs=pvcs(3, **{"data-orders-0": {"deletionTimestamp": NOW}}))
    assert w.kind == "wait" and "data-orders-0" in w.reason


def test_as_status():
    a = step(3, *outdated(3))
    assert a.as_status() == {"queue": a.queue, "message": a.reason}


# ---- property: never below quorum ----------------------------------------------------------

STATES = ["VOTING", "VOTING", "VOTING", "RECOVERING", "EMPTY", "STARTING", None]


@hs.composite
def cluster(draw):
    n = draw(hs.sampled_from([3, 5, 7]))
    leader = draw(hs.integers(0, n - 1))
    pods, statuses, claims = [], {}, {}
    for i in range(n):
        state = draw(hs.sampled_from(STATES))
        present = draw(hs.booleans()) or draw(hs.booleans())  # mostly present
        annotations = {"rlog.io/replace-volume": "y"} if draw(hs.integers(0, 5)) == 0 else {}
        if present:
            pods.append(
                pod(
                    i,
                    revision=draw(hs.sampled_from([REV_OLD, REV_NEW])),
                    ready=state == "VOTING" and draw(hs.booleans()),
                    terminating=draw(hs.integers(0, 8)) == 0,
                    annotations=annotations,
                )
            )
        learned = draw(hs.integers(0, 5000))
        statuses[f"orders-{i}"] = (
            None if state is None else rs(i, state, leader=leader, learned=learned)
        )
        claims[f"data-orders-{i}"] = {
            "name": f"data-orders-{i}",
            "uid": f"pvc-{i}",
            "phase": "Bound",
            "volumeLost": draw(hs.integers(0, 6)) == 0,
        }
    return n, pods, statuses, claims


def voting_after(n, pods, statuses, gone):
    present = {p["name"] for p in pods if not p["deletionTimestamp"]}
    return sum(
        1
        for name, s in statuses.items()
        if name != gone and name in present and s is not None and s["status"] == "VOTING"
    )


@settings(max_examples=300, deadline=None)
@given(cluster())
def test_never_below_a_voting_quorum(c):
    n, pods, statuses, claims = c
    a = step(n, pods, statuses, pvcs=claims)
    if a.kind not in ("delete-pod", "delete-pvc-and-pod"):
        return
    target = statuses[a.pod]
    target_voting = target is not None and target["status"] == "VOTING"
    rest = voting_after(n, pods, statuses, a.pod)
    if target_voting or a.kind == "delete-pvc-and-pod":
        # a voter (or a volume) goes only with the rest forming a VOTING quorum
        assert rest >= quorum(n), (a, rest)
    if target_voting:
        assert rest == n - 1  # every other replica VOTING
    # never the leader while it leads
    if target_voting and target["role"] == "leader":
        raise AssertionError(f"deleted the leader {a.pod}")
    assert len(a.queue) == 1  # one at a time


@settings(max_examples=200, deadline=None)
@given(hs.data())
def test_volume_replacement_never_below_a_voting_quorum(data):
    """Mostly-VOTING clusters where volumes are lost or replacement is asked for."""
    n = data.draw(hs.sampled_from([3, 5, 7]))
    pods, statuses, claims = [], {}, {}
    for i in range(n):
        state = data.draw(hs.sampled_from(["VOTING"] * 4 + ["EMPTY", None]))
        ask = data.draw(hs.integers(0, 3)) == 0
        pods.append(
            pod(
                i,
                ready=state == "VOTING",
                annotations={"rlog.io/replace-volume": "y"} if ask else {},
            )
        )
        statuses[f"orders-{i}"] = None if state is None else rs(i, state, leader=0)
        claims[f"data-orders-{i}"] = {
            "name": f"data-orders-{i}",
            "uid": f"pvc-{i}",
            "phase": data.draw(hs.sampled_from(["Bound", "Bound", "Lost"])),
        }
    a = step(n, pods, statuses, pvcs=claims)
    if a.kind == "delete-pvc-and-pod":
        rest = voting_after(n, pods, statuses, a.pod)
        assert rest >= quorum(n)
        target = statuses[a.pod]
        if target is not None and target["status"] == "VOTING":
            assert rest == n - 1 and target["role"] != "leader"


def test_a_replacement_that_crash_loops_or_fails_its_restore_says_how():
    pods, statuses = outdated(3)
    a = step(3, pods, statuses)
    assert a.kind == "delete-pod"
    pods, statuses = replaced(pods, statuses, a.pod, ready=False)
    statuses[a.pod] = None
    new = pods[-1]
    new.update(stuck="CrashLoopBackOff", crashLoop="rlog: error: no (exit code 2)")
    waiting = step(3, pods, statuses, a.queue)
    assert waiting.kind == "wait"
    assert waiting.reason.endswith("to be VOTING (CrashLoopBackOff: rlog: error: no (exit code 2))")
    new.update(restoreFailed="rlog: error: restore incomplete (exit code 1)")
    waiting = step(3, pods, statuses, a.queue)
    assert waiting.reason.endswith(
        "(restore failed: rlog: error: restore incomplete (exit code 1))"
    )
