"""A replica on a lost node (rlog_operator.node_loss): observed from real-shaped Node and Pod
objects, reported in the status, and never made worse by the rolling logic: no pod on a
node not confirmed gone is deleted, nor its claim; once the node is confirmed gone, the
volume replacement proceeds only while the other replicas form a VOTING quorum."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from helpers import LATER, NOW, REV_NEW, REV_OLD, V134_CONFLICT, V134_CORDONED, cr, rs
from prometheus_client import REGISTRY

from rlog_operator import metrics, node_loss, observed, rolling
from rlog_operator import status as st

SINCE = "2026-01-01T00:00:00Z"
NODES = {0: "w1", 1: "w2", 2: "w3"}
UNSCHEDULABLE = (
    "0/3 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/unreachable: "
    "}, 2 node(s) had volume node affinity conflict. preemption: 0/3 nodes are available: 3 "
    "Preemption is not helpful for scheduling."
)


def node(name: str, ready: str = "True", taints: tuple[str, ...] = ()) -> dict[str, Any]:
    """A Node as the API server returns it (the fields the operator reads, and some more)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-{name}",
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {
            "podCIDR": "10.244.1.0/24",
            "taints": [
                {"key": key, "effect": effect, "timeAddedAt": SINCE}
                | ({"value": "nodeshutdown"} if key.endswith("out-of-service") else {})
                for key in taints
                for effect in ("NoSchedule", "NoExecute")
            ],
        },
        "status": {
            "conditions": [
                {
                    "type": "MemoryPressure",
                    "status": "Unknown" if ready == "Unknown" else "False",
                    "lastTransitionTime": SINCE,
                },
                {
                    "type": "Ready",
                    "status": ready,
                    "reason": "NodeStatusUnknown" if ready == "Unknown" else "KubeletReady",
                    "message": "Kubelet stopped posting node status.",
                    "lastHeartbeatTime": "2025-12-31T23:59:00Z",
                    "lastTransitionTime": SINCE,
                },
            ]
        },
    }


LOST = ("node.kubernetes.io/unreachable",)
OUT_OF_SERVICE = ("node.kubernetes.io/unreachable", "node.kubernetes.io/out-of-service")


def k8s_pod(
    i: int,
    *,
    on: str | None = None,
    ready: bool = True,
    revision: str = REV_NEW,
    uid: str | None = None,
    terminating: bool = False,
    annotations: dict[str, str] | None = None,
    unschedulable: str = "",
) -> dict[str, Any]:
    """A replica Pod as the API server returns it. `on`: its node (None: not scheduled)."""
    meta: dict[str, Any] = {
        "name": f"orders-{i}",
        "namespace": "shop",
        "uid": uid or f"uid-{i}",
        "labels": {
            "app.kubernetes.io/name": "rlog",
            "app.kubernetes.io/instance": "orders",
            "app.kubernetes.io/component": "replica",
            "controller-revision-hash": revision,
        },
        "annotations": dict(annotations or {}),
    }
    if terminating:
        meta["deletionTimestamp"] = LATER
        meta["deletionGracePeriodSeconds"] = 30
    spec: dict[str, Any] = {
        "containers": [{"name": "replica", "image": "rlog-replica:dev"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": f"data-orders-{i}"}}],
    }
    if on:
        spec["nodeName"] = on
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable:
        conditions = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": unschedulable,
            }
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Pending" if unschedulable else "Running", "conditions": conditions},
    }


def observe(
    k8s_pods: list[dict[str, Any]], k8s_nodes: list[dict[str, Any]]
) -> list[observed.PodInfo]:
    """What the observe timer reads: the pod records, marked against the node records."""
    nodes = {str(n["metadata"]["name"]): observed.node_info(n) for n in k8s_nodes}
    return node_loss.mark([observed.pod_info(p) for p in k8s_pods], nodes)


def claims(**uids: str) -> dict[str, observed.PvcInfo]:
    return {
        f"data-orders-{i}": observed.PvcInfo(
            name=f"data-orders-{i}", uid=uids.get(f"c{i}", f"pvc-{i}"), phase="Bound"
        )
        for i in range(3)
    }


def step(pods, statuses, queue=(), pvcs=None) -> rolling.Action:
    return rolling.next_step(cr(3), pods, statuses, REV_NEW, queue, pvcs or claims(), now=NOW)


def compute(pods, statuses, previous=None, queue=()) -> st.StatusResult:
    action = step(pods, statuses, queue)
    return st.compute_status(
        cr(3), pods, statuses, REV_NEW, previous, NOW, rolling_update=action.as_status()
    )


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def names_pod(action: rolling.Action, name: str) -> bool:
    return action.pod == name or action.pvc == f"data-{name}"


# ---- observing --------------------------------------------------------------------------------


def test_node_info_of_a_node_record() -> None:
    info = observed.node_info(node("w2", "Unknown", OUT_OF_SERVICE))
    assert info == {
        "name": "w2",
        "ready": "Unknown",
        "readySince": SINCE,
        "outOfService": True,
        "unreachable": True,
        "hostname": "w2",
    }
    assert observed.node_info(node("w1"))["ready"] == "True"
    assert observed.node_info({"metadata": {"name": "bare"}})["ready"] == "Unknown"


def test_a_pod_on_a_node_not_ready_or_gone_is_marked() -> None:
    k8s = [k8s_pod(0, on="w1"), k8s_pod(1, on="w2"), k8s_pod(2, on="w3"), k8s_pod(3)]
    pods = observe(k8s, [node("w1"), node("w2", "False")])  # w3 deleted
    assert pods[0]["node"] == "w1" and "nodeLost" not in pods[0]
    assert pods[1]["nodeLost"] == {"node": "w2", "ready": "False", "since": SINCE, "confirmed": ""}
    assert pods[2]["nodeLost"]["confirmed"] == node_loss.CONFIRMED_DELETED
    assert pods[3]["node"] == "" and "nodeLost" not in pods[3]  # not scheduled yet
    # the out-of-service taint on a node not Ready is the admin's confirmation
    (tainted,) = observe([k8s_pod(1, on="w2")], [node("w2", "Unknown", OUT_OF_SERVICE)])
    assert tainted["nodeLost"]["confirmed"] == node_loss.CONFIRMED_OUT_OF_SERVICE


def test_unknown_nodes_mark_nothing() -> None:
    """No node view (no permission, not listed yet): never read as every node gone."""
    pods = node_loss.mark([observed.pod_info(k8s_pod(0, on="w1"))], None)
    assert "nodeLost" not in pods[0]
    assert node_loss.known_nodes({}) is None  # an empty index is no view, not "no nodes"
    w1 = observed.node_info(node("w1"))
    assert node_loss.known_nodes({"w1": [w1]}) == {"w1": w1}


# ---- never worse: nothing on an unconfirmed lost node is deleted -----------------------------


CASES = list(
    itertools.product(
        ("restart", "replace-volume", None),  # the queued entry for orders-1, if any
        (False, True),  # orders-1 terminating (after the taint-based eviction)
        (REV_OLD, REV_NEW),  # orders-1's revision
        (False, True),  # annotated rlog.io/replace-volume
        (False, True),  # its claim's volume is lost
    )
)


@pytest.mark.parametrize(("queued", "terminating", "revision", "annotated", "pv_lost"), CASES)
def test_a_pod_on_an_unconfirmed_lost_node_is_never_deleted(
    queued: str | None, terminating: bool, revision: str, annotated: bool, pv_lost: bool
) -> None:
    """Whatever asks for it (an outdated revision, the annotation, a lost volume, a queued
    replacement), a step naming orders-1 or its claim waits, and says how to confirm."""
    k8s_pods = [
        k8s_pod(0, on="w1"),
        k8s_pod(
            1,
            on="w2",
            ready=False,
            revision=revision,
            terminating=terminating,
            annotations={"rlog.io/replace-volume": "true"} if annotated else None,
        ),
        k8s_pod(2, on="w3"),
    ]
    pods = observe(k8s_pods, [node("w1"), node("w2", "Unknown", LOST), node("w3")])
    statuses = {"orders-0": rs(0), "orders-1": None, "orders-2": rs(2)}
    queue = []
    if queued:
        queue = [
            rolling.QueueEntry(
                pod="orders-1",
                uid="uid-1",
                action=queued,
                pvc="data-orders-1",
                pvcUid="pvc-1",
                revision=REV_NEW,
                participating=True,
                startedAt=NOW,
            )
        ]
    pvcs = claims()
    if pv_lost:
        pvcs["data-orders-1"]["volumeLost"] = True
    action = step(pods, statuses, queue, pvcs)
    assert action.kind in ("none", "wait"), action
    if action.kind == "wait" or queued:
        assert "kubectl delete node w2" in action.reason, action
        assert "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" in action.reason
        assert "never force-deletes" in action.reason
    if queued and terminating:
        assert action.reason.startswith("orders-1 is terminating: orders-1 is on node w2")


def test_other_pods_are_not_held_by_a_lost_node() -> None:
    """The hold is on the lost node's pod only: an outdated follower elsewhere waits for the
    lost replica as before (its restart needs every other replica VOTING), and a pod that is
    not VOTING elsewhere is replaced."""
    pods = observe(
        [
            k8s_pod(0, on="w1"),
            k8s_pod(1, on="w2", ready=False),
            k8s_pod(2, on="w3", ready=False, revision=REV_OLD),
        ],
        [node("w1"), node("w2", "Unknown", LOST), node("w3")],
    )
    statuses = {"orders-0": rs(0), "orders-1": None, "orders-2": rs(2, "RECOVERING")}
    action = step(pods, statuses)
    assert action.kind == "delete-pod" and action.pod == "orders-2"


# ---- confirmed: the existing volume replacement, only with a VOTING quorum -------------------


def test_confirmed_lost_node_then_the_claim_is_replaced_with_a_quorum() -> None:
    """The whole way: not confirmed (wait), confirmed by the out-of-service taint (the pod
    GC's to remove), node deleted and the pod recreated unschedulable (volume node affinity
    conflict): its claim is replaced, the others VOTING."""
    statuses = {"orders-0": rs(0), "orders-1": None, "orders-2": rs(2)}
    evicted = k8s_pod(1, on="w2", ready=False, terminating=True)
    others = [k8s_pod(0, on="w1"), k8s_pod(2, on="w3")]
    waiting = observe([*others, evicted], [node("w1"), node("w2", "Unknown", LOST), node("w3")])
    assert step(waiting, statuses).kind == "none"  # nothing to do, and nothing done
    r = compute(waiting, statuses)
    assert cond(r.status, "NodeLost")["reason"] == "NodeNotReady"
    # confirmed: the pod garbage collector removes the pod; the operator does not
    confirmed = observe(
        [*others, evicted], [node("w1"), node("w2", "Unknown", OUT_OF_SERVICE), node("w3")]
    )
    assert step(confirmed, statuses).kind == "none"
    r = compute(confirmed, statuses, previous=r.status)
    assert cond(r.status, "NodeLost")["reason"] == "NodeConfirmedGone"
    assert (
        "confirmed gone (tainted node.kubernetes.io/out-of-service)"
        in r.status["conditions"][-1]["message"]
    )
    # the node deleted, the pod gone; the StatefulSet's new pod cannot reach its volume
    recreated = k8s_pod(1, uid="new-1", ready=False, unschedulable=UNSCHEDULABLE)
    pods = observe([*others, recreated], [node("w1"), node("w3")])
    action = step(pods, statuses)
    assert action.kind == "delete-pvc-and-pod" and action.pod == "orders-1"
    assert (action.uid, action.pvc, action.pvc_uid) == ("new-1", "data-orders-1", "pvc-1")
    r = compute(pods, statuses, previous=r.status)
    assert cond(r.status, "NodeLost")["status"] == "False"
    assert ("Normal", "NodeLossCleared") in [(e.type, e.reason) for e in r.events]


def test_two_of_three_on_lost_nodes_nothing_is_replaced_and_the_status_says_so() -> None:
    statuses = {"orders-0": rs(0), "orders-1": None, "orders-2": None}
    evicted = [k8s_pod(i, on=NODES[i], ready=False, terminating=True) for i in (1, 2)]
    nodes = [node("w1"), node("w2", "Unknown", LOST), node("w3", "Unknown", LOST)]
    pods = observe([k8s_pod(0, on="w1"), *evicted], nodes)
    r = compute(pods, statuses)
    assert r.status["phase"] == "Degraded" and "no VOTING quorum" in r.status["message"]
    lost = cond(r.status, "NodeLost")
    assert lost["status"] == "True" and lost["reason"] == "NodeNotReady"
    assert "kubectl delete node w2" in lost["message"]
    assert "kubectl delete node w3" in lost["message"]
    assert [i.get("nodeLost") for i in r.status["replicas"]] == [
        None,
        f"node w2 not Ready (Unknown) since {SINCE}, not confirmed gone",
        f"node w3 not Ready (Unknown) since {SINCE}, not confirmed gone",
    ]
    # both confirmed: still nothing is replaced without a quorum of the others, and it says so
    confirmed = [node("w1"), node("w2", "Unknown", OUT_OF_SERVICE)]  # w3 deleted
    pods = observe([k8s_pod(0, on="w1"), *evicted], confirmed)
    r = compute(pods, statuses, previous=r.status)
    message = cond(r.status, "NodeLost")["message"]
    assert message.count("they do not now (1/2 VOTING), nothing is replaced") == 2
    recreated = [
        k8s_pod(i, uid=f"new-{i}", ready=False, unschedulable=UNSCHEDULABLE) for i in (1, 2)
    ]
    pods = observe([k8s_pod(0, on="w1"), *recreated], confirmed)
    action = step(pods, statuses)
    assert action.kind == "wait" and not action.queue
    assert "the other replicas must form a VOTING quorum (1/2 VOTING)" in action.reason
    r = compute(pods, statuses, previous=r.status)
    assert "1/2 VOTING" in r.status["rollingUpdate"]["message"]


# ---- reporting --------------------------------------------------------------------------------


def test_status_items_condition_and_events_once() -> None:
    statuses = {"orders-0": rs(0), "orders-1": None, "orders-2": rs(2)}
    ok = [node("w1"), node("w2"), node("w3")]
    pods = observe([k8s_pod(i, on=NODES[i]) for i in range(3)], ok)
    r0 = compute(pods, {**statuses, "orders-1": rs(1)})
    assert [i["node"] for i in r0.status["replicas"]] == ["w1", "w2", "w3"]
    assert cond(r0.status, "NodeLost") | {"lastTransitionTime": ""} == {
        "type": "NodeLost",
        "status": "False",
        "reason": "NodesReady",
        "message": "every replica's node is Ready",
        "lastTransitionTime": "",
        "observedGeneration": 1,
    }
    lost = [node("w1"), node("w2", "Unknown", LOST), node("w3")]
    pods = observe(
        [k8s_pod(0, on="w1"), k8s_pod(1, on="w2", ready=False), k8s_pod(2, on="w3")], lost
    )
    r1 = compute(pods, statuses, previous=r0.status)
    item = r1.status["replicas"][1]
    assert item["node"] == "w2"
    assert item["nodeLost"] == f"node w2 not Ready (Unknown) since {SINCE}, not confirmed gone"
    sentence = (
        f"orders-1 is on node w2, not Ready (Unknown) since {SINCE}: its pod cannot be "
        "replaced until the node is confirmed gone: `kubectl delete node w2`, or taint it "
        "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute (the operator never "
        "force-deletes a replica's pod: one still running would share its identity with its "
        "replacement)"
    )
    assert cond(r1.status, "NodeLost")["message"] == sentence
    assert [e for e in r1.events if e.reason == "NodeLost"] == [
        st.Event("Warning", "NodeLost", sentence)
    ]
    r2 = compute(pods, statuses, previous=r1.status)  # the next tick: no second Event
    assert not [e for e in r2.events if e.reason.startswith("NodeLos")]
    back = observe([k8s_pod(i, on=NODES[i]) for i in range(3)], ok)
    r3 = compute(back, statuses, previous=r2.status)
    assert [e for e in r3.events if e.reason.startswith("NodeLos")] == [
        st.Event(
            "Normal",
            "NodeLossCleared",
            f"orders-1 is no longer on a lost node (was: {item['nodeLost']})",
        )
    ]
    assert cond(r3.status, "NodeLost")["status"] == "False"


def test_the_lost_nodes_gauge() -> None:
    def value() -> float | None:
        return REGISTRY.get_sample_value(
            "rlog_operator_replicas_on_lost_nodes", {"namespace": "ns", "name": "nl"}
        )

    items = [{"name": "nl-0"}, {"name": "nl-1", "nodeLost": "node w2 deleted"}]
    metrics.observe_status("ns", "nl", {"replicas": items})
    assert value() == 1
    metrics.observe_status("ns", "nl", {"replicas": [{"name": "nl-0"}, {"name": "nl-1"}]})
    assert value() == 0
    metrics.forget("ns", "nl")
    assert value() is None


def test_the_observe_timer_marks_pods_from_the_node_index() -> None:
    """handlers._observe reads the node index as kopf fills it (name -> its records): a pod
    on a node the index lacks is on a deleted node; an empty index knows nothing."""
    from rlog_operator import handlers

    key = ("shop", "orders")
    pods_index = {key: [observed.pod_info(k8s_pod(i, on=NODES[i])) for i in range(3)]}
    nodes_index = {
        "w1": [observed.node_info(node("w1"))],
        "w2": [observed.node_info(node("w2", "Unknown", LOST))],
        "other": [observed.node_info(node("other"))],
    }
    pods, _, _ = handlers._observe(cr(3), pods_index, {}, {}, {}, nodes_index)
    assert [p.get("nodeLost", {}).get("confirmed") for p in pods] == [None, "", "deleted"]
    pods, _, _ = handlers._observe(cr(3), pods_index, {}, {}, {}, {})
    assert not [p for p in pods if "nodeLost" in p]


# ---- the volume's node: gone or lost (replace), or Ready but refusing the pod (wait) ----------


def k8s_volume(i: int, pinned: str | None, *, zone: str = "") -> dict[str, Any]:
    """A PersistentVolume as local-path-provisioner makes it for claim data-orders-`i`: pinned
    by `kubernetes.io/hostname In [node]` (None: no node affinity; `zone`: pinned to a zone)."""
    name = f"pvc-0000000{i}-aaaa-bbbb-cccc-dddddddddddd"
    spec: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": "1Gi"},
        "claimRef": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "name": f"data-orders-{i}",
            "namespace": "shop",
            "uid": f"pvc-{i}",
        },
        "hostPath": {
            "path": f"/opt/local-path-provisioner/{name}_shop_data-orders-{i}",
            "type": "DirectoryOrCreate",
        },
        "persistentVolumeReclaimPolicy": "Delete",
        "storageClassName": "local-path",
        "volumeMode": "Filesystem",
    }
    expressions = []
    if pinned is not None:
        expressions.append({"key": "kubernetes.io/hostname", "operator": "In", "values": [pinned]})
    if zone:
        expressions.append(
            {"key": "topology.kubernetes.io/zone", "operator": "In", "values": [zone]}
        )
    if expressions:
        spec["nodeAffinity"] = {
            "required": {"nodeSelectorTerms": [{"matchExpressions": expressions}]}
        }
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {
            "name": name,
            "annotations": {
                "local.path.provisioner/selected-node": pinned or "",
                "pv.kubernetes.io/provisioned-by": "rancher.io/local-path",
            },
            "finalizers": ["kubernetes.io/pv-protection"],
        },
        "spec": spec,
        "status": {"phase": "Bound"},
    }


def k8s_claim(i: int, volume: dict[str, Any]) -> dict[str, Any]:
    """Claim data-orders-`i`, Bound to `volume`."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"data-orders-{i}", "namespace": "shop", "uid": f"pvc-{i}"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "storageClassName": "local-path",
            "volumeName": volume["metadata"]["name"],
        },
        "status": {"phase": "Bound", "capacity": {"storage": "1Gi"}},
    }


def cordoned(name: str) -> dict[str, Any]:
    """A Ready node cordoned (or drained) for maintenance."""
    body = node(name)
    body["spec"]["unschedulable"] = True
    body["spec"]["taints"] = [
        {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule", "timeAddedAt": SINCE}
    ]
    return body


def observe_all(
    k8s_pods: list[dict[str, Any]],
    k8s_nodes: list[dict[str, Any]],
    k8s_volumes: list[dict[str, Any]],
) -> tuple[list[observed.PodInfo], dict[str, observed.PvcInfo]]:
    """What the observe timer reads (handlers._observe), the indexes filled as kopf fills them
    from the watched objects through the operator's own index functions."""
    from rlog_operator import handlers

    def index(function: Any, bodies: list[dict[str, Any]]) -> dict[str, list[Any]]:
        result: dict[str, list[Any]] = {}
        for body in bodies:
            for key, value in function(name=body["metadata"]["name"], body=body).items():
                result.setdefault(key, []).append(value)
        return result

    key = ("shop", "orders")
    pods_index = {key: [observed.pod_info(p) for p in k8s_pods]}
    claims_index = {
        key: [observed.claim_record(k8s_claim(i, v)) for i, v in enumerate(k8s_volumes)]
    }
    pods, pvcs, _ = handlers._observe(
        cr(3),
        pods_index,
        claims_index,
        {},
        index(handlers.persistent_volumes, k8s_volumes),
        index(handlers.cluster_nodes, k8s_nodes),
    )
    return pods, pvcs


VOTING_OTHERS = {"orders-0": rs(0), "orders-1": None, "orders-2": rs(2)}
CORDONED_SENTENCE = (
    "orders-1's volume is on node w2, which is Ready but cannot take the pod (cordoned?): "
    "`kubectl uncordon w2`, or annotate the pod rlog.io/replace-volume=true to replace the "
    "volume (the new replica starts EMPTY and catches up)"
)


def test_a_volume_s_node_is_read_from_a_local_path_volume() -> None:
    assert observed.volume_info(k8s_volume(1, "w2"))["node"] == "w2"
    assert observed.volume_info(k8s_volume(1, None))["node"] == ""
    assert observed.volume_info(k8s_volume(1, None, zone="z1"))["node"] == ""
    two_terms = k8s_volume(1, "w2")
    terms = two_terms["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    terms.append({"matchExpressions": [dict(terms[0]["matchExpressions"][0], values=["w3"])]})
    assert observed.volume_info(two_terms)["node"] == ""  # either node: no one node
    assert observed.volume_node_conflict(observed.pod_info(k8s_pod(1, unschedulable=V134_CONFLICT)))
    assert observed.volume_node_conflict(observed.pod_info(k8s_pod(1, unschedulable=UNSCHEDULABLE)))
    assert not observed.volume_node_conflict(observed.pod_info(k8s_pod(1, on="w2")))


@pytest.mark.parametrize("wording", [V134_CONFLICT, UNSCHEDULABLE])
@pytest.mark.parametrize(
    "w2",
    [None, node("w2", "Unknown", OUT_OF_SERVICE), node("w2", "Unknown", LOST)],
    ids=["deleted", "out-of-service", "not-ready"],
)
def test_a_volume_on_a_gone_or_lost_node_is_replaced(
    wording: str, w2: dict[str, Any] | None
) -> None:
    """The pod recreated after its node was confirmed gone (Kubernetes v1.34's wording, and
    the older one): its claim is replaced, the others VOTING."""
    recreated = k8s_pod(1, uid="new-1", ready=False, unschedulable=wording)
    nodes = [node("w1"), node("w3"), *([w2] if w2 else [])]
    pods, pvcs = observe_all(
        [k8s_pod(0, on="w1"), recreated, k8s_pod(2, on="w3")],
        nodes,
        [k8s_volume(i, NODES[i]) for i in range(3)],
    )
    assert pvcs["data-orders-1"]["volumeNode"] == "w2"
    assert pvcs["data-orders-1"]["volumeNodeReady"] is False
    action = step(pods, VOTING_OTHERS, pvcs=pvcs)
    assert action.kind == "delete-pvc-and-pod" and action.pod == "orders-1"
    assert (action.uid, action.pvc, action.pvc_uid) == ("new-1", "data-orders-1", "pvc-1")


@pytest.mark.parametrize("wording", [V134_CORDONED, UNSCHEDULABLE])
def test_a_volume_on_a_cordoned_ready_node_waits_for_it(wording: str) -> None:
    """`kubectl drain w2`: the pod evicted and recreated, the scheduler cannot place it (w2 is
    unschedulable, the others do not match the volume's node affinity). The replica's data is
    intact on w2: the step waits and says how to go on; the annotation replaces the volume."""
    volumes = [k8s_volume(i, NODES[i]) for i in range(3)]
    others = [k8s_pod(0, on="w1"), k8s_pod(2, on="w3")]
    recreated = k8s_pod(1, uid="new-1", ready=False, unschedulable=wording)
    nodes = [node("w1"), cordoned("w2"), node("w3")]
    pods, pvcs = observe_all([*others, recreated], nodes, volumes)
    assert pvcs["data-orders-1"]["volumeNodeReady"] is True
    action = step(pods, VOTING_OTHERS, pvcs=pvcs)
    assert (action.kind, action.reason, action.queue) == ("wait", CORDONED_SENTENCE, [])
    r = st.compute_status(
        cr(3), pods, VOTING_OTHERS, REV_NEW, None, NOW, rolling_update=action.as_status()
    )
    assert r.status["rollingUpdate"]["message"] == CORDONED_SENTENCE
    # the user asks for a new volume: replaced, the others VOTING
    annotated = k8s_pod(
        1,
        uid="new-1",
        ready=False,
        unschedulable=wording,
        annotations={"rlog.io/replace-volume": "true"},
    )
    pods, pvcs = observe_all([*others, annotated], nodes, volumes)
    action = step(pods, VOTING_OTHERS, pvcs=pvcs)
    assert action.kind == "delete-pvc-and-pod" and action.pod == "orders-1"


def test_a_volume_with_no_known_node_is_replaced_as_before() -> None:
    """A volume with no recognisable node (no hostname affinity: a zone), or no node view:
    nobody can tell the node is Ready, so the volume is replaced as before (with a quorum)."""
    others = [k8s_pod(0, on="w1"), k8s_pod(2, on="w3")]
    recreated = k8s_pod(1, uid="new-1", ready=False, unschedulable=V134_CORDONED)
    nodes = [node("w1"), cordoned("w2"), node("w3")]
    zoned = [k8s_volume(0, "w1"), k8s_volume(1, None, zone="z1"), k8s_volume(2, "w3")]
    pods, pvcs = observe_all([*others, recreated], nodes, zoned)
    assert pvcs["data-orders-1"]["volumeNode"] == ""
    assert step(pods, VOTING_OTHERS, pvcs=pvcs).kind == "delete-pvc-and-pod"
    pinned = [k8s_volume(i, NODES[i]) for i in range(3)]
    pods, pvcs = observe_all([*others, recreated], [], pinned)  # nodes not known
    assert pvcs["data-orders-1"]["volumeNode"] == "w2"
    assert step(pods, VOTING_OTHERS, pvcs=pvcs).kind == "delete-pvc-and-pod"


def test_a_volume_names_its_node_by_the_hostname_label() -> None:
    """A node whose name is not its kubernetes.io/hostname label (some clouds): the volume's
    node is found by the label, so a cordoned one is not taken for deleted."""
    w2 = cordoned("ip-10-0-0-2.internal")
    w2["metadata"]["labels"]["kubernetes.io/hostname"] = "w2"
    recreated = k8s_pod(1, uid="new-1", ready=False, unschedulable=V134_CORDONED)
    pods, pvcs = observe_all(
        [k8s_pod(0, on="w1"), recreated, k8s_pod(2, on="w3")],
        [node("w1"), w2, node("w3")],
        [k8s_volume(i, NODES[i]) for i in range(3)],
    )
    action = step(pods, VOTING_OTHERS, pvcs=pvcs)
    assert (action.kind, action.reason) == ("wait", CORDONED_SENTENCE)


def test_a_queued_volume_replacement_is_dropped_when_the_node_is_ready() -> None:
    """Queued while the volume's node looked gone, the claim not deleted yet (the delete
    failed, or the operator restarted), and the node is Ready now: nothing is deleted."""
    queue = [
        rolling.QueueEntry(
            pod="orders-1",
            uid="new-1",
            action=rolling.REPLACE_VOLUME,
            pvc="data-orders-1",
            pvcUid="pvc-1",
            revision=REV_NEW,
            participating=False,
            startedAt=NOW,
        )
    ]
    recreated = k8s_pod(1, uid="new-1", ready=False, unschedulable=V134_CORDONED)
    pods, pvcs = observe_all(
        [k8s_pod(0, on="w1"), recreated, k8s_pod(2, on="w3")],
        [node("w1"), cordoned("w2"), node("w3")],
        [k8s_volume(i, NODES[i]) for i in range(3)],
    )
    action = step(pods, VOTING_OTHERS, queue, pvcs)
    assert (action.kind, action.reason, action.queue) == ("wait", CORDONED_SENTENCE, [])
