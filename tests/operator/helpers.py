"""Builders of observed pods and replica statuses for the operator's pure-function tests."""

UID = "11111111-2222-3333-4444-555555555555"
REV_OLD = "orders-5d4f"
REV_NEW = "orders-7c9a"
NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:05:00Z"


def cr(replicas=3, auto=True, annotations=None, generation=1):
    return {
        "metadata": {
            "name": "orders",
            "namespace": "shop",
            "uid": UID,
            "generation": generation,
            "annotations": dict(annotations or {}),
        },
        "spec": {"replicas": replicas, "storage": {"size": "1Gi"}, "autoInitialize": auto},
    }


def pod(i, *, ready=True, revision=REV_NEW, uid=None, phase="Running", terminating=False, **extra):
    p = {
        "name": f"orders-{i}",
        "uid": uid or f"uid-{i}",
        "phase": phase,
        "ready": ready,
        "labels": {"controller-revision-hash": revision},
        "annotations": {},
        "deletionTimestamp": "2026-01-01T00:00:00Z" if terminating else None,
        "stuck": "",
        "unschedulable": "",
        "pvc": f"data-orders-{i}",
    }
    p.update(extra)
    return p


def rs(i, status="VOTING", *, leader=0, learned=100, end=None, permit=False, log_id=UID, **extra):
    s = {
        "id": i,
        "status": status,
        "role": "leader" if (status == "VOTING" and i == leader) else "follower",
        "leader": f"orders-{leader}.orders-headless.shop.svc:7000" if leader is not None else None,
        "begin": 0,
        "end": learned if end is None else end,
        "learned": learned,
        "promised": 1,
        "log_id": log_id,
        "replicas": 3,
        "permit": permit,
        "reason": "",
        "catchup_begin": 0,
        "catchup_end": 0,
        "catchup_done": 0,
    }
    s.update(extra)
    return s


NAMES = ("orders-0", "orders-1", "orders-2")


def facts(**overrides):
    """Hand-built Facts of a healthy 3-replica log (orders-0 leads), with `overrides`.

    Fields are independent here: a test sets exactly the facts its rule reads."""
    from rlog_operator.facts import Facts, ReplicaHealth

    base = {
        "uid": UID,
        "generation": 1,
        "names": NAMES,
        "quorum_size": 2,
        "auto_initialize": True,
        "annotations": {},
        "update_revision": REV_NEW,
        "pods": {name: pod(i) for i, name in enumerate(NAMES)},
        "replicas": {name: rs(i) for i, name in enumerate(NAMES)},
        "states": dict.fromkeys(NAMES, "VOTING"),
        "voting": NAMES,
        "reached": NAMES,
        "ready": NAMES,
        "down": (),
        "recovering": (),
        "foreign": (),
        "outdated": (),
        "quorum": True,
        "leader": "orders-0",
        "initialized": True,
        "was_initialized": True,
        "was_data_loss": False,
        "data_loss": False,
        "health": dict.fromkeys(NAMES, ReplicaHealth()),
        "was_health": dict.fromkeys(NAMES, ReplicaHealth()),
        "rolling_queue": (),
        "rolling_message": "",
        "rolling": False,
        "error": "",
        "refused": "",
    }
    base.update(overrides)
    return Facts(**base)


# The scheduler's message for a replica pod whose volume is pinned to a node it cannot use, as
# Kubernetes v1.34 words it: the volume's node gone (tainted), or cordoned (unschedulable).
V134_CONFLICT = (
    "0/3 nodes are available: 1 node(s) had untolerated taint(s), 2 node(s) didn't match "
    "PersistentVolume's node affinity. no new claims to deallocate, preemption: 0/3 nodes are "
    "available: 3 Preemption is not helpful for scheduling."
)
V134_CORDONED = (
    "0/3 nodes are available: 1 node(s) were unschedulable, 2 node(s) didn't match "
    "PersistentVolume's node affinity. no new claims to deallocate, preemption: 0/3 nodes are "
    "available: 3 Preemption is not helpful for scheduling."
)
