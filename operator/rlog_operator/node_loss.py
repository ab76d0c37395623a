"""Replicas on a lost node, and what the operator does about them (pure functions, no I/O;
docs/operator.md, "A node is lost").

A pod's node is lost when its Ready condition is not True (False, Unknown: the kubelet
stopped reporting) or the Node object is gone. The pod then shows Running and not ready,
and after the taint-based eviction it stays Terminating: the kubelet that would confirm the
container's death is gone, and the StatefulSet never replaces a pod whose old one may still
run. The operator never force-deletes such a pod: should the replica still run on a node
that merely lost contact, its replacement would start EMPTY under the same identity and
recover from a quorum while the old process still counts its own accepts toward a quorum,
and an acknowledged entry could be lost.

Only an admin (or a cloud node controller) can confirm the node is gone: deleting the Node
object, or tainting it `node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`; the pod
garbage collector then removes its pods. Until then every rolling action naming such a pod
or its claim waits (rolling.py) and the status says how to confirm (`describe`). After it,
the existing volume replacement takes over: the recreated pod cannot be scheduled next to
its volume (pinned to the lost node) and its claim is replaced while the other replicas
form a VOTING quorum.

The scheduler says the same ("didn't match PersistentVolume's node affinity") when the
volume's node is Ready but cannot take the pod: cordoned or drained for maintenance, or
full. Its replica's data is then intact and the node back in minutes, so the volume is not
replaced for it (`mark_volume_nodes`, rolling.py): the step waits and says what to do
(`volume_node_ready`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rlog_operator import constants as c
from rlog_operator.observed import TAINT_OUT_OF_SERVICE, NodeInfo, NodeLoss, PodInfo, PvcInfo

CONFIRMED_DELETED = "deleted"  # the Node object is gone
CONFIRMED_OUT_OF_SERVICE = "out-of-service"  # tainted node.kubernetes.io/out-of-service
OUT_OF_SERVICE_TAINT = f"{TAINT_OUT_OF_SERVICE}=nodeshutdown:NoExecute"  # what the admin sets


def known_nodes(index: Mapping[str, Iterable[NodeInfo]]) -> dict[str, NodeInfo] | None:
    """Every node by name from the operator's node index; None when the index is empty,
    which means "not known" (no permission, not listed yet): a cluster running pods has
    nodes, so never conclude from it that every node is gone."""
    if not len(index):
        return None
    return {name: info for name, infos in index.items() for info in infos}


def loss_of(node_name: str, node: NodeInfo | None) -> NodeLoss | None:
    """Why node `node_name` counts as lost (`node` its record, None when the Node object
    does not exist), or None while it is Ready (or the pod is not bound to a node)."""
    if not node_name:
        return None
    if node is None:
        return NodeLoss(node=node_name, ready="", since="", confirmed=CONFIRMED_DELETED)
    ready = str(node.get("ready") or "Unknown")
    if ready == "True":
        return None
    return NodeLoss(
        node=node_name,
        ready=ready,
        since=str(node.get("readySince") or ""),
        confirmed=CONFIRMED_OUT_OF_SERVICE if node.get("outOfService") else "",
    )


def mark(pods: Iterable[PodInfo], nodes: Mapping[str, NodeInfo] | None) -> list[PodInfo]:
    """The pods, each bound to a lost node marked with `nodeLost`. `nodes` (by name) None
    means "not known" (e.g. no permission to watch nodes, an index that saw none): nothing
    is marked, so a missing view never reads as every node gone."""
    result: list[PodInfo] = []
    for pod in pods:
        record = PodInfo(**pod)
        record.pop("nodeLost", None)
        node = pod.get("node") or ""
        loss = loss_of(node, nodes.get(node)) if nodes is not None else None
        if loss is not None:
            record["nodeLost"] = loss
        result.append(record)
    return result


def mark_volume_nodes(
    claims: Mapping[str, PvcInfo], nodes: Mapping[str, NodeInfo] | None
) -> dict[str, PvcInfo]:
    """The claims, each marked volumeNodeReady when its volume's node (volumeNode) is known
    and Ready: a pod that cannot be scheduled beside that volume waits for the node rather
    than losing the data. `nodes` (by name) None means "not known": nothing is marked, and a
    claim whose volume has no recognisable node is not marked either; both keep the volume
    replacement for a node affinity conflict (the node may be gone, nobody can tell)."""
    # a volume names its node by the kubernetes.io/hostname label, most often the node's name
    by_hostname = {n.get("hostname"): n for n in (nodes or {}).values() if n.get("hostname")}
    result: dict[str, PvcInfo] = {}
    for name, claim in claims.items():
        record = PvcInfo(**claim)
        node = claim.get("volumeNode") or ""
        info = (nodes or {}).get(node) or by_hostname.get(node)
        record["volumeNodeReady"] = bool(nodes is not None and node and loss_of(node, info) is None)
        result[name] = record
    return result


def volume_node_ready(pod: str, node: str) -> str:
    """Why pod `pod`, unschedulable beside its volume, keeps it: the volume's node is Ready
    (cordoned, drained, or full), as a sentence a user can act on."""
    return (
        f"{pod}'s volume is on node {node}, which is Ready but cannot take the pod (cordoned?): "
        f"`kubectl uncordon {node}`, or annotate the pod {c.ANNOTATION_REPLACE_VOLUME}=true to "
        "replace the volume (the new replica starts EMPTY and catches up)"
    )


def unconfirmed(pod: PodInfo | None) -> NodeLoss | None:
    """The loss of a pod's node while it is not confirmed gone: the operator must not
    delete the pod or its claim then."""
    loss = (pod or {}).get("nodeLost")
    return loss if loss and not loss.get("confirmed") else None


def state(loss: NodeLoss) -> str:
    """The node's state in a few words: status.replicas[].nodeLost."""
    node = loss.get("node", "")
    if loss.get("confirmed") == CONFIRMED_DELETED:
        return f"node {node} deleted (confirmed gone)"
    since = f" since {loss['since']}" if loss.get("since") else ""
    text = f"node {node} not Ready ({loss.get('ready') or 'Unknown'}){since}"
    if loss.get("confirmed") == CONFIRMED_OUT_OF_SERVICE:
        return f"{text}, tainted out-of-service (confirmed gone)"
    return f"{text}, not confirmed gone"


def describe(pod: str, loss: NodeLoss, voting_others: int = 0, quorum: int = 0) -> str:
    """What the operator does about pod `pod` on a lost node and why, as a sentence a user
    can act on. `voting_others`/`quorum`: the other replicas VOTING and the log's quorum
    (the replacement after a confirmation needs them; 0/0: not said)."""
    node = loss.get("node", "")
    if not loss.get("confirmed"):
        since = f" since {loss['since']}" if loss.get("since") else ""
        return (
            f"{pod} is on node {node}, not Ready ({loss.get('ready') or 'Unknown'}){since}: "
            "its pod cannot be replaced until the node is confirmed gone: "
            f"`kubectl delete node {node}`, or taint it {OUT_OF_SERVICE_TAINT} (the operator "
            "never force-deletes a replica's pod: one still running would share its identity "
            "with its replacement)"
        )
    how = (
        "deleted"
        if loss.get("confirmed") == CONFIRMED_DELETED
        else "tainted node.kubernetes.io/out-of-service"
    )
    text = (
        f"{pod} is on node {node}, confirmed gone ({how}): Kubernetes removes the pod, and "
        "its volume (pinned to that node) is replaced, the new replica starting EMPTY and "
        "catching up, while the other replicas form a VOTING quorum"
    )
    if quorum and voting_others < quorum:
        text += f": they do not now ({voting_others}/{quorum} VOTING), nothing is replaced"
    return text
