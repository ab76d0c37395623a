"""A log over three nodes: spread, a partition between nodes, a node lost (make e2e-kind-nodes).

Needs three schedulable nodes whose machines the test can act on: kind's node containers
(`KIND_WORKERS=2`: a control plane that takes pods and two workers), reached with `docker
exec`/`docker kill` through `KIND_DOCKER_HOST` (e2e/kind/e2e.sh sets it). Anywhere else the
module skips, saying why. Tests run in file order and share one ReplicatedLog:

1. The replicas are spread over the nodes, one on each (the operator's default topology
   spread), and each status.replicas item names its node.
2. The pod network of the leader's node is cut from the other nodes' (every packet between
   its pods and theirs dropped, in that node's netfilter; the kubelets and the API server
   still talk, so this is the data plane failing, not the node). A writer pinned to another
   node keeps having appends acknowledged by a new leader on the majority side; after the
   cut heals every acknowledged append is on every replica.
3. A worker node with a follower on it is drained (cordoned, the pod evicted): maintenance,
   not loss. The recreated pod cannot go anywhere but its volume's node; the operator keeps
   the volume and says so (`kubectl uncordon`); uncordoned, the replica is back on that
   node with the same claim.
4. A worker node with a follower on it is lost: its container killed (SIGKILL: every process
   of the machine gone at once, nothing flushed). The node turns NotReady; the operator says
   which replica is on a lost node and deletes nothing (its pod and claim keep their UIDs):
   a replica that might still run must never share its identity with a replacement. The
   writer keeps going on the quorum left. An admin's confirmation, the taint
   `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`, lets Kubernetes delete the
   pod; its claim is pinned to the lost node, so the operator replaces it, and the replica
   comes back on another node with a fresh volume, EMPTY, catches up and is VOTING again.
   Every acknowledged append is on every replica.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from e2elib import Kubectl, wait_until
from oplib import Log, Writer, check_acknowledged, created_log

pytestmark = [pytest.mark.nodes, pytest.mark.timeout(1200)]

NAME = "nodes-log"
QUORUM = 2
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


def _schedulable(node: dict) -> bool:
    ready = any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in (node.get("status") or {}).get("conditions") or []
    )
    taints = (node.get("spec") or {}).get("taints") or []
    blocked = any(t.get("effect") in ("NoSchedule", "NoExecute") for t in taints)
    return ready and not blocked and not (node.get("spec") or {}).get("unschedulable")


class Machines:
    """The node containers of a kind cluster, through its docker daemon."""

    def __init__(self, docker_host: str) -> None:
        self.docker = ["docker", *(["-H", docker_host] if docker_host else [])]

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        out = subprocess.run([*self.docker, *args], capture_output=True, text=True, timeout=120)
        if check:
            assert out.returncode == 0, f"docker {' '.join(args)}: {out.stderr}"
        return out

    def exists(self, node: str) -> bool:
        return self.run("inspect", "--type", "container", node, check=False).returncode == 0

    def iptables(self, node: str, *args: str) -> None:
        self.run("exec", node, "iptables", "-w", *args)

    def kill(self, node: str) -> None:
        self.run("kill", "--signal", "KILL", node)


@pytest.fixture(scope="module")
def nodes(cluster: Kubectl) -> dict[str, dict]:
    """The three schedulable nodes, by name."""
    found = {
        n["metadata"]["name"]: n for n in cluster.json("get", "nodes")["items"] if _schedulable(n)
    }
    if len(found) < 3:
        pytest.skip(f"needs three schedulable nodes, found {sorted(found)}: make e2e-kind-nodes")
    return found


@pytest.fixture(scope="module")
def machines(nodes: dict[str, dict]) -> Machines:
    if "KIND_DOCKER_HOST" not in os.environ or shutil.which("docker") is None:
        pytest.skip("the node faults act on kind's node containers: make e2e-kind-nodes")
    m = Machines(os.environ["KIND_DOCKER_HOST"])
    missing = [n for n in nodes if not m.exists(n)]
    if missing:
        pytest.skip(f"no node container for {missing} (not a kind cluster?)")
    return m


@pytest.fixture(scope="module")
def log(operator: str, namespace: str, nodes: dict[str, dict]) -> Iterator[Log]:
    with created_log(namespace, NAME, settle=True) as log:
        yield log


def node_of(log: Log, pod: str) -> str:
    return str(log.k.json("get", "pod", pod)["spec"].get("nodeName") or "")


def placement(log: Log) -> dict[str, str]:
    return {pod: node_of(log, pod) for pod in log.pods}


def control_plane(nodes: dict[str, dict]) -> str:
    return next(n for n, body in nodes.items() if "node-role.kubernetes.io/control-plane" in
                body["metadata"].get("labels", {}))  # fmt: skip


def test_replicas_spread_over_the_nodes(log: Log, nodes: dict[str, dict]) -> None:
    where = placement(log)
    assert sorted(where.values()) == sorted(nodes), f"replicas not one per node: {where}"
    items = {r["name"]: r for r in log.status().get("replicas") or []}
    assert {pod: items[pod].get("node") for pod in log.pods} == where, items


def test_a_partition_between_nodes_under_a_writer(
    log: Log, nodes: dict[str, dict], machines: Machines
) -> None:
    leader = log.wait_settled_leader().split(".")[0]  # an endpoint: its pod's name
    where = placement(log)
    cut = where[leader]
    others = [n for n in nodes if n != cut]
    writer = Writer(log, "netsplit", f"pod network of {cut} (the leader's) cut", node=others[0])
    writer.start()
    acked_before = len(writer.report().acks)
    # every packet between this node's pods and the other nodes' pods, both ways (mangle:
    # before any ACCEPT of kube-proxy or the CNI in filter)
    rules = [(flag, nodes[n]["spec"]["podCIDR"]) for n in others for flag in ("-s", "-d")]
    for flag, cidr in rules:
        machines.iptables(cut, "-t", "mangle", "-I", "FORWARD", "1", flag, cidr, "-j", "DROP")
    try:
        survivor = next(p for p, n in where.items() if n == others[0])

        def majority_moved_on() -> bool:
            new_leader = str(log.replica_status(survivor).get("leader") or "")
            if not new_leader or new_leader.split(".")[0] == leader:  # an endpoint
                return False
            return len(writer.report().acks) >= acked_before + 50

        wait_until(f"a new leader away from {cut} and appends acknowledged", majority_moved_on,
                   180, 2)  # fmt: skip
    finally:
        for flag, cidr in rules:
            machines.iptables(cut, "-t", "mangle", "-D", "FORWARD", flag, cidr, "-j", "DROP")
    log.wait_ready("every replica VOTING after the cut healed", timeout=300)
    report = writer.stop()
    counts = report.voting_counts()
    assert counts and min(counts) >= QUORUM, f"fewer than a quorum VOTING in a sample: {counts}"
    check_acknowledged(log, report)


def test_a_drained_node_keeps_its_replicas_volume(log: Log, nodes: dict[str, dict]) -> None:
    """Maintenance is not loss: a drained (cordoned) node's replica waits for it with its
    volume, and comes back on it with the same claim once uncordoned."""
    leader = log.wait_settled_leader().split(".")[0]  # an endpoint: its pod's name
    where = placement(log)
    pod = next(p for p in log.pods if p != leader and where[p] != control_plane(nodes))
    node, pvc = where[pod], f"data-{pod}"
    claim_uid = log.k.json("get", "pvc", pvc)["metadata"]["uid"]
    log.k("drain", node, "--ignore-daemonsets", "--delete-emptydir-data", "--pod-selector",
          f"statefulset.kubernetes.io/pod-name={pod}", "--timeout=180s", namespaced=False,
          timeout=240)  # fmt: skip
    try:

        def waits_for_the_node() -> str:
            message = str((log.status().get("rollingUpdate") or {}).get("message") or "")
            return message if f"{pod}'s volume is on node {node}" in message else ""

        message = wait_until(f"{pod} to wait for its cordoned node", waits_for_the_node, 180, 2)
        assert f"kubectl uncordon {node}" in message, message
        assert log.k.json("get", "pvc", pvc)["metadata"]["uid"] == claim_uid, "claim replaced"
    finally:
        log.k("uncordon", node, namespaced=False)
    log.wait_ready(f"{pod} back after {node} was uncordoned", timeout=300)
    assert node_of(log, pod) == node
    assert log.k.json("get", "pvc", pvc)["metadata"]["uid"] == claim_uid, "claim replaced"


def test_a_lost_node_is_reported_then_replaced_once_confirmed(
    log: Log, nodes: dict[str, dict], machines: Machines, cluster: Kubectl
) -> None:
    leader = log.wait_settled_leader().split(".")[0]  # an endpoint: its pod's name
    where = placement(log)
    plane = control_plane(nodes)
    victim_pod = next(p for p in log.pods if p != leader and where[p] != plane)
    lost = where[victim_pod]
    pvc = f"data-{victim_pod}"
    uids = {"pod": log.k.json("get", "pod", victim_pod)["metadata"]["uid"],
            "pvc": log.k.json("get", "pvc", pvc)["metadata"]["uid"]}  # fmt: skip
    writer = Writer(log, "nodeloss", f"node {lost} lost ({victim_pod})", node=plane)
    writer.start()
    machines.kill(lost)

    def not_ready() -> bool:
        node = cluster.json("get", "node", lost)
        return not any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in node.get("status", {}).get("conditions") or []
        )

    wait_until(f"node {lost} NotReady", not_ready, 180, 2)

    def reported() -> dict | None:
        items = {r["name"]: r for r in log.status().get("replicas") or []}
        item = items.get(victim_pod) or {}
        return item if item.get("nodeLost") else None

    item = wait_until(f"the operator to report {victim_pod} on a lost node", reported, 180, 2)
    assert f"node {lost} not Ready" in item["nodeLost"], item
    assert "not confirmed gone" in item["nodeLost"], item
    condition = log.condition("NodeLost")
    assert condition.get("status") == "True" and condition.get("reason") == "NodeNotReady", (
        condition
    )
    assert f"kubectl delete node {lost}" in condition["message"], condition
    events = log.k.json("get", "events", "--field-selector", f"involvedObject.name={NAME}")
    warned = [e for e in events["items"] if e.get("reason") == "NodeLost" and lost in e["message"]]
    assert warned and all(e["type"] == "Warning" for e in warned), events["items"][-5:]
    acked = len(writer.report().acks)
    wait_until("appends acknowledged on the quorum left",
               lambda: len(writer.report().acks) >= acked + 50, 120, 2)  # fmt: skip
    # nothing deleted while the node is not confirmed gone
    assert log.k.json("get", "pod", victim_pod)["metadata"]["uid"] == uids["pod"]
    assert log.k.json("get", "pvc", pvc)["metadata"]["uid"] == uids["pvc"]

    cluster("taint", "nodes", lost, OUT_OF_SERVICE)

    def replaced() -> bool:
        pods = log.k.json("get", "pods", "-l", f"statefulset.kubernetes.io/pod-name={victim_pod}")
        live = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
        claims = [c for c in log.k.json("get", "pvc")["items"] if c["metadata"]["name"] == pvc]
        return (
            len(live) == 1
            and live[0]["metadata"]["uid"] != uids["pod"]
            and live[0]["spec"].get("nodeName") not in ("", None, lost)
            and len(claims) == 1
            and claims[0]["metadata"]["uid"] != uids["pvc"]
            and log.all_voting()
        )

    t0 = time.monotonic()
    wait_until(f"{victim_pod} back VOTING on another node with a fresh volume", replaced, 600, 3)
    print(f"{victim_pod} replaced {time.monotonic() - t0:.0f}s after the taint")
    report = writer.stop()
    counts = report.voting_counts()
    assert counts and min(counts) >= QUORUM, f"fewer than a quorum VOTING in a sample: {counts}"
    check_acknowledged(log, report)
    assert not [r for r in log.status().get("replicas") or [] if r.get("nodeLost")], json.dumps(
        log.status()
    )
    assert log.condition("NodeLost").get("status") == "False", log.status()
