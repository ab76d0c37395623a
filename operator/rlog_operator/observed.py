"""What the operator observes, as small typed records (pure functions, no I/O).

The handlers keep kopf indexes of the replicas' pods, claims and StatefulSets, of the
existing PersistentVolumes (and the node each is pinned to) and of the nodes: the watch
streams keep them current, so the observe timer reads memory instead of listing objects
every few seconds. These functions turn a watched object into the small record an index
holds (`PodInfo`, `PvcInfo`, `StatefulSetRecord`, keyed by (namespace, log name);
`NodeInfo` and `VolumeInfo`, keyed by name). The replicas' own answers (`ReplicaStatus`,
the `rlog status --json` shape) are observations too; the plain queries on pods and answers
(a pod's revision, a replica's status, who leads) live here so that the status and the
rolling logic read them the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypedDict

from rlog_operator import constants as c
from rlog_operator import specs

LogKey = tuple[str, str]  # (namespace, ReplicatedLog name)
UNKNOWN = "Unknown"  # the status of a replica that does not answer

# container waiting reasons that mean "this pod is not going to serve by itself"
STUCK_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


class PodInfo(TypedDict, total=False):
    """What the operator needs to know of one replica pod."""

    name: str
    uid: str
    phase: str  # Pending, Running, Succeeded, Failed, Unknown
    ready: bool
    labels: dict[str, str]
    annotations: dict[str, str]
    deletionTimestamp: str | None
    stuck: str  # a container waiting reason from STUCK_REASONS, "" otherwise
    unschedulable: str  # the scheduler's message while PodScheduled is False, "" otherwise
    pvc: str  # name of the data PersistentVolumeClaim
    crashLoop: str  # the replica container crash-loops: its last termination, "" otherwise
    restoreFailed: str  # the restore init container failed: its last termination, "" otherwise
    node: str  # spec.nodeName: the node it is bound to ("" before it is scheduled)
    nodeLost: NodeLoss  # its node is not Ready or gone (node_loss.mark); absent otherwise


class NodeInfo(TypedDict, total=False):
    """What the operator needs to know of one node (the kopf index `cluster_nodes`)."""

    name: str
    ready: str  # the Ready condition's status: "True", "False", "Unknown" (also: no condition)
    readySince: str  # the Ready condition's lastTransitionTime ("" if none)
    outOfService: bool  # tainted node.kubernetes.io/out-of-service: an admin confirmed it gone
    unreachable: bool  # tainted node.kubernetes.io/unreachable or node.kubernetes.io/not-ready
    hostname: str  # its kubernetes.io/hostname label ("" none): what volumes are pinned to


class NodeLoss(TypedDict, total=False):
    """Why a pod's node counts as lost (node_loss.loss_of)."""

    node: str
    ready: str  # its Ready condition's status ("False", "Unknown"), "" when the node is gone
    since: str  # when that condition last changed ("" when unknown or gone)
    confirmed: str  # "" not confirmed gone; CONFIRMED_DELETED or CONFIRMED_OUT_OF_SERVICE


class PvcInfo(TypedDict, total=False):
    """What the operator needs to know of one replica's data claim."""

    name: str
    uid: str
    phase: str  # Pending, Bound, Lost
    deletionTimestamp: str | None
    volume: str  # the bound PersistentVolume's name ("" while unbound)
    volumeLost: bool  # the handler found its PersistentVolume gone (claims_by_name)
    volumeNode: str  # the node its PersistentVolume is pinned to ("" none recognisable)
    volumeNodeReady: bool  # that node is known and Ready (node_loss.mark_volume_nodes)
    storageClass: str  # spec.storageClassName (as the API server filled it in)
    size: str  # spec.resources.requests.storage
    capacity: str  # status.capacity.storage ("" while unbound)


class VolumeInfo(TypedDict, total=False):
    """What the operator needs to know of one PersistentVolume (the kopf index
    `persistent_volumes`): that it exists, and the node it is pinned to."""

    name: str
    node: str  # its one `kubernetes.io/hostname In [node]` node affinity ("" none recognisable)


class StatefulSetRecord(TypedDict, total=False):
    updateRevision: str
    replicas: int  # spec.replicas: the log's real size (it never changes)
    uid: str
    claimSize: str  # the data claim template's storage request
    claimClass: str  # the data claim template's storageClassName ("" = the default)


ReplicaStatus = Mapping[str, Any]  # `rlog status --json` shape (rlog.client.status_to_dict)

# The labels every replica pod, claim and StatefulSet carries (specs.selector_labels minus
# the instance): used as the server-side label selector of the watches and as the filter.
REPLICA_LABELS: Mapping[str, str] = {
    c.LABEL_NAME: c.APP_NAME,
    c.LABEL_COMPONENT: c.COMPONENT_REPLICA,
}
REPLICA_SELECTOR = ",".join(f"{k}={v}" for k, v in sorted(REPLICA_LABELS.items()))


def log_key(namespace: str | None, labels: Mapping[str, str]) -> LogKey | None:
    """The log an object belongs to, by its instance label; None if it has none."""
    instance = labels.get(c.LABEL_INSTANCE)
    if not namespace or not instance:
        return None
    return (namespace, instance)


def pod_info(pod: Mapping[str, Any]) -> PodInfo:
    """The PodInfo of a Pod object (a dict as the API returns it)."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    conditions = {cond.get("type"): cond for cond in status.get("conditions") or []}
    ready = (conditions.get("Ready") or {}).get("status") == "True"
    scheduled = conditions.get("PodScheduled") or {}
    unschedulable = ""
    if scheduled.get("status") == "False":
        unschedulable = str(scheduled.get("message") or scheduled.get("reason") or "unschedulable")
    stuck = ""
    crash_loop = ""
    for cs in status.get("containerStatuses") or []:
        reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason") or ""
        if reason in STUCK_REASONS:
            stuck = reason
        if reason == "CrashLoopBackOff" and cs.get("name") == c.CONTAINER_NAME:
            crash_loop = last_termination(cs)
    restore_failed = ""
    for cs in status.get("initContainerStatuses") or []:
        if cs.get("name") == c.RESTORE_CONTAINER and init_container_failed(cs):
            restore_failed = last_termination(cs)
    pvc = ""
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        if volume.get("name") == c.DATA_VOLUME and volume.get("persistentVolumeClaim"):
            pvc = str(volume["persistentVolumeClaim"].get("claimName") or "")
    return PodInfo(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        phase=str(status.get("phase") or "Pending"),
        ready=ready,
        labels=dict(meta.get("labels") or {}),
        annotations=dict(meta.get("annotations") or {}),
        deletionTimestamp=meta.get("deletionTimestamp"),
        stuck=stuck,
        unschedulable=unschedulable,
        pvc=pvc,
        crashLoop=crash_loop,
        restoreFailed=restore_failed,
        node=str((pod.get("spec") or {}).get("nodeName") or ""),
    )


# The scheduler's message part for a pod whose PersistentVolume is pinned to other nodes
# (the volumebinding plugin's ErrReasonNodeConflict). Kubernetes v1.34 says "node(s) didn't
# match PersistentVolume's node affinity"; older releases said "node(s) had volume node
# affinity conflict". Either one in PodInfo.unschedulable is a volume node conflict.
VOLUME_NODE_CONFLICT_MESSAGES = (
    "didn't match PersistentVolume's node affinity",
    "volume node affinity conflict",
)


def volume_node_conflict(pod: PodInfo | None) -> bool:
    """Whether the scheduler cannot place `pod` beside its volume: the nodes that could take
    it do not match its PersistentVolume's node affinity (VOLUME_NODE_CONFLICT_MESSAGES)."""
    message = (pod or {}).get("unschedulable") or ""
    return any(part in message for part in VOLUME_NODE_CONFLICT_MESSAGES)


HOSTNAME_LABEL = "kubernetes.io/hostname"


def volume_info(volume: Mapping[str, Any]) -> VolumeInfo:
    """The VolumeInfo of a PersistentVolume object. Its node is the one value of a
    `kubernetes.io/hostname In [node]` match expression (what local-path-provisioner and the
    local static provisioner write) when every node selector term names that same node; any
    other affinity (none, a zone, several nodes) pins it to no one node: ""."""
    required = ((volume.get("spec") or {}).get("nodeAffinity") or {}).get("required") or {}
    pinned = {_hostname_of(term) for term in required.get("nodeSelectorTerms") or []}
    return VolumeInfo(
        name=str((volume.get("metadata") or {}).get("name") or ""),
        node=next(iter(pinned)) if len(pinned) == 1 else "",  # {""}: not recognised either
    )


def _hostname_of(term: Mapping[str, Any]) -> str:
    """The one node a node selector term names (`kubernetes.io/hostname In [node]`), or ""."""
    named = [
        list(expr.get("values") or [])
        for expr in term.get("matchExpressions") or []
        if expr.get("key") == HOSTNAME_LABEL and expr.get("operator") == "In"
    ]
    return str(named[0][0]) if len(named) == 1 and len(named[0]) == 1 else ""


TAINT_OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
TAINTS_UNREACHABLE = frozenset({"node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"})


def node_info(node: Mapping[str, Any]) -> NodeInfo:
    """The NodeInfo of a Node object (a dict as the API returns it)."""
    conditions = (node.get("status") or {}).get("conditions") or []
    ready: Mapping[str, Any] = next(
        (cond for cond in conditions if cond.get("type") == "Ready"), {}
    )
    taints = {str(t.get("key") or "") for t in (node.get("spec") or {}).get("taints") or []}
    return NodeInfo(
        name=str((node.get("metadata") or {}).get("name") or ""),
        ready=str(ready.get("status") or "Unknown"),
        readySince=str(ready.get("lastTransitionTime") or ""),
        outOfService=TAINT_OUT_OF_SERVICE in taints,
        unreachable=bool(taints & TAINTS_UNREACHABLE),
        hostname=str(((node.get("metadata") or {}).get("labels") or {}).get(HOSTNAME_LABEL) or ""),
    )


def last_termination(container_status: Mapping[str, Any]) -> str:
    """How a container last ended, one line: the last line of its termination message (the
    replica containers use FallbackToLogsOnError, so an rlog error line lands there) and
    its exit code, e.g. "rlog: error: data dir ...: segment ... is missing (exit code 2)"."""
    state = container_status.get("state") or {}
    ended = state.get("terminated") or (container_status.get("lastState") or {}).get("terminated")
    if not ended:
        return "no termination recorded"
    lines = [line.strip() for line in str(ended.get("message") or "").splitlines()]
    message = next((line for line in reversed(lines) if line), "")
    if not message:
        message = str(ended.get("reason") or "terminated")
    return f"{message} (exit code {ended.get('exitCode', '?')})"


def init_container_failed(container_status: Mapping[str, Any]) -> bool:
    """An init container that failed and has not succeeded since: waiting to be started
    again after a failure (CrashLoopBackOff), or terminated with a non-zero exit code."""
    state = container_status.get("state") or {}
    terminated = state.get("terminated")
    if terminated is not None:
        return int(terminated.get("exitCode") or 0) != 0
    if state.get("waiting"):
        last = (container_status.get("lastState") or {}).get("terminated") or {}
        return int(last.get("exitCode") or 0) != 0
    return False


def claim_record(claim: Mapping[str, Any]) -> PvcInfo:
    meta = claim.get("metadata") or {}
    spec = claim.get("spec") or {}
    status = claim.get("status") or {}
    return PvcInfo(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        phase=str(status.get("phase") or ""),
        deletionTimestamp=meta.get("deletionTimestamp"),
        volume=str(spec.get("volumeName") or ""),
        storageClass=str(spec.get("storageClassName") or ""),
        size=str(((spec.get("resources") or {}).get("requests") or {}).get("storage") or ""),
        capacity=str((status.get("capacity") or {}).get("storage") or ""),
    )


def statefulset_record(statefulset: Mapping[str, Any]) -> StatefulSetRecord:
    spec = statefulset.get("spec") or {}
    template: Mapping[str, Any] = next(
        (
            t.get("spec") or {}
            for t in spec.get("volumeClaimTemplates") or []
            if (t.get("metadata") or {}).get("name") == c.DATA_VOLUME
        ),
        {},
    )
    return StatefulSetRecord(
        updateRevision=str((statefulset.get("status") or {}).get("updateRevision") or ""),
        replicas=int(spec.get("replicas") or 0),
        uid=str((statefulset.get("metadata") or {}).get("uid") or ""),
        claimSize=str(
            ((template.get("resources") or {}).get("requests") or {}).get("storage") or ""
        ),
        claimClass=str(template.get("storageClassName") or ""),
    )


def replicas_changed(have: int, wanted: int) -> str:
    """The refusal of a spec.replicas change that got past the CRD's rule; "" if none."""
    if not have or have == wanted:
        return ""
    return (
        f"spec.replicas cannot change ({have} -> {wanted}): rlog has no reconfiguration;"
        f" create a new ReplicatedLog instead, or set spec.replicas back to {have}"
    )


def as_built(body: Mapping[str, Any], replicas: int) -> dict[str, Any]:
    """The ReplicatedLog as its StatefulSet was built: what to observe while a refused
    replicas change stands in the spec."""
    return {**body, "spec": {**(body.get("spec") or {}), "replicas": replicas}}


def tls_mode_changed(body: Mapping[str, Any]) -> str:
    """The refusal of a TLS mode other than the one the log was built with
    (specs.built_mode_of), through spec.tls.mode set, changed or removed past the CRD's
    rule; "" if none (also for a log not built yet). Rendering the new mode would roll the
    replicas one at a time into TLS and plaintext halves that cannot reach each other (and,
    to `disabled`, turn authorization off)."""
    built = specs.built_mode_of(body)
    given = ((body.get("spec") or {}).get("tls") or {}).get("mode")
    wanted = str(given) if given else built
    if not built or wanted == built:
        return ""
    return (
        f"spec.tls.mode cannot change ({built} -> {wanted}): TLS and plaintext replicas"
        f" cannot talk to each other; create a new ReplicatedLog instead, or set"
        f" spec.tls.mode back to {built}"
    )


def with_built_tls(body: Mapping[str, Any]) -> dict[str, Any]:
    """The ReplicatedLog with the TLS mode it was built with: what to observe, certify and
    call the replicas with while a refused mode change stands in the spec."""
    spec = body.get("spec") or {}
    tls = {**(spec.get("tls") or {}), "mode": specs.built_mode_of(body)}
    return {**body, "spec": {**spec, "tls": tls}}


def built_view(body: Mapping[str, Any], replicas: int) -> tuple[Mapping[str, Any], str]:
    """What to observe of a log whose StatefulSet has `replicas` (0: none yet), and the
    refusal to report ("" if none). A replicas or TLS mode change that got past the CRD (no
    CEL) is refused by `reconcile`; until it is undone, the log is observed as built (its
    pods, its mode: certificates, the credentials of the replica calls, status.tls). The
    view is `body` itself when nothing is refused."""
    refused = replicas_changed(replicas, specs.replicas_of(body))
    view: Mapping[str, Any] = as_built(body, replicas) if refused else body
    tls_refused = tls_mode_changed(body)
    if tls_refused:
        view = with_built_tls(view)
        refused = f"{refused}; {tls_refused}" if refused else tls_refused
    return view, refused


def claims_by_name(
    claims: Iterable[PvcInfo], volumes: Mapping[str, Iterable[VolumeInfo]] | None
) -> dict[str, PvcInfo]:
    """The log's claims by name, each marked volumeLost when it is Bound to a
    PersistentVolume that no longer exists, and with the node its volume is pinned to
    (volumeNode, "" none recognisable). `volumes` (the existing volumes by name, as the
    operator's index holds them) None means "not known": nothing is marked."""
    result: dict[str, PvcInfo] = {}
    for claim in claims:
        record = PvcInfo(**claim)
        bound_to = claim.get("volume") or ""
        known: Iterable[VolumeInfo] = (volumes or {}).get(bound_to, ()) if bound_to else ()
        record["volumeNode"] = next((str(v.get("node") or "") for v in known), "")
        record["volumeLost"] = bool(
            volumes is not None
            and claim.get("phase") == "Bound"
            and bound_to
            and bound_to not in volumes
        )
        result[str(claim.get("name") or "")] = record
    return result


# ---- plain queries on pods and replica answers ----------------------------------------------


def revision_of(pod: PodInfo) -> str:
    """The StatefulSet revision a pod was created from."""
    return (pod.get("labels") or {}).get(c.LABEL_REVISION, "")


def is_terminating(pod: PodInfo) -> bool:
    return bool(pod.get("deletionTimestamp"))


def status_name(replica: ReplicaStatus | None) -> str:
    """EMPTY, STARTING, RECOVERING, VOTING, or UNKNOWN for a replica that does not answer."""
    return str(replica.get("status") or UNKNOWN) if replica is not None else UNKNOWN


def is_voting(replica: ReplicaStatus | None) -> bool:
    return status_name(replica) == c.VOTING


def pod_of_address(address: str | None, names: Sequence[str]) -> str:
    """`orders-1.orders-headless.ns.svc:7000` -> `orders-1` if it is one of `names`."""
    if not address:
        return ""
    host = address.rsplit(":", 1)[0].strip("[]")
    first = host.split(".", 1)[0]
    return first if first in names else ""


def leader_of(statuses: Mapping[str, ReplicaStatus | None]) -> str:
    """The pod whose replica leads: the one that says so (and is VOTING), else the leader
    most replicas point at."""
    names = list(statuses)
    claims = [
        n
        for n, s in statuses.items()
        if s is not None and s.get("role") == "leader" and is_voting(s)
    ]
    if len(claims) == 1:
        return claims[0]
    votes: dict[str, int] = {}
    for s in statuses.values():
        if s is not None:
            pod = pod_of_address(s.get("leader"), names)
            if pod and (not claims or pod in claims):
                votes[pod] = votes.get(pod, 0) + 1
    if votes:
        return max(sorted(votes), key=lambda p: votes[p])
    return claims[0] if claims else ""


def step_down_requested(annotations: Mapping[str, str], leader: str) -> str:
    """The pod to ask to step down for the annotation rlog.io/step-down: the leader, or ""
    (no request, or no leader yet: the request waits for one)."""
    return leader if annotations.get(c.ANNOTATION_STEP_DOWN) and leader else ""
