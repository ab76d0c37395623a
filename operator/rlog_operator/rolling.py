"""The next step of a rolling replacement, decided by a pure function.

The StatefulSet uses `updateStrategy: OnDelete`: a pod runs a new template (image, resources,
...) only once the operator deletes it. `next_step` looks at what was observed and returns one
action: nothing to do, wait (and why), ask the leader to step down, delete a pod, or delete a
pod's claim and the pod (volume replacement). The kopf handler persists the returned queue in
`status.rollingUpdate.queue` *before* acting, so an operator restart resumes the replacement
(the replacement is recognised by the pod's, and the claim's, new UID).

Rules:

* One pod at a time: while a replacement is queued nothing else is deleted; it is finished
  when the pod of that name has a new UID and is VOTING and ready (and, for a volume, the old
  claim is gone). A pod that was not participating when it was deleted only has to answer
  again while the log has no VOTING quorum, since it may need the others to turn VOTING.
* Order: pods that do not participate (not ready, not VOTING, unreachable, crash-looping)
  first, then followers, the leader last; ties by descending ordinal, like the StatefulSet
  controller.
* Deleting a VOTING replica needs every OTHER replica VOTING, ready and caught up (learned
  within `slack` positions of the leader's, or the same end). So a delete never takes the log
  below a VOTING quorum. Deleting a replica that is not VOTING never lowers the VOTING count
  and is always allowed (a crash-looping old image must be replaceable even without quorum).
* The leader is asked to step down first and deleted once another replica leads.
* A 1-replica log cannot stay available: its pod is deleted when outdated (downtime), but its
  volume is never replaced (that would be the whole log).
* Volume replacement (annotation `rlog.io/replace-volume` on the pod, a claim whose volume is
  lost, or a pod unschedulable for a volume node affinity conflict while the volume's node is
  not known Ready): delete the claim, then the pod; only while the OTHER replicas form a
  VOTING quorum (all of them VOTING and caught up if the target itself is VOTING); no new
  delete while a claim of the log is terminating. A volume whose node is Ready (cordoned,
  drained, full) holds a healthy replica's data: its pod waits for the node, and the status
  says how to go on (node_loss.volume_node_ready); a queued replacement whose claim is not
  deleted yet is dropped then.
* A pod on a lost node (node_loss.py: not Ready, or its Node gone) that is not confirmed
  gone is never deleted, nor its claim: every step naming it waits and says how to confirm
  (`kubectl delete node`, or the out-of-service taint). A replica still running there would
  share its identity with its replacement. Once confirmed, the rules above apply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, cast

from rlog_operator import constants as c
from rlog_operator import node_loss, observed, specs
from rlog_operator.observed import (
    PodInfo,
    PvcInfo,
    ReplicaStatus,
    is_terminating,
    is_voting,
    leader_of,
    revision_of,
    status_name,
)

DEFAULT_SLACK = 1000  # positions a follower's learned may trail the leader's and count caught up

RESTART = "restart"
REPLACE_VOLUME = "replace-volume"


class QueueEntry(TypedDict, total=False):
    pod: str
    uid: str
    action: str  # RESTART or REPLACE_VOLUME
    pvc: str
    pvcUid: str
    revision: str
    participating: bool
    startedAt: str


ActionKind = Literal["none", "wait", "step-down", "delete-pod", "delete-pvc-and-pod"]


@dataclass(frozen=True)
class Action:
    kind: ActionKind
    pod: str = ""
    uid: str = ""  # delete precondition: the pod's UID
    pvc: str = ""
    pvc_uid: str = ""  # delete precondition: the claim's UID
    reason: str = ""
    queue: list[QueueEntry] = field(default_factory=list)  # persist before acting

    def as_status(self) -> dict[str, Any]:
        """The `status.rollingUpdate` object."""
        return {"queue": [dict(e) for e in self.queue], "message": self.reason}


def volume_lost(pod: PodInfo | None, pvc: PvcInfo | None) -> bool:
    if pvc is not None and (pvc.get("phase") == "Lost" or pvc.get("volumeLost")):
        return True
    # The pod cannot go where its volume is pinned: lost when that node is gone, not Ready or
    # out-of-service. A volume with no recognisable node, or nodes not known, is taken as lost
    # as before (it may be gone, nobody can tell); one on a Ready node is not (waits_for_node).
    return observed.volume_node_conflict(pod) and not (pvc or {}).get("volumeNodeReady")


def waits_for_node(name: str, pod: PodInfo | None, pvc: PvcInfo | None) -> str:
    """Why pod `name`, unschedulable beside its volume, keeps the volume: its node is Ready
    (node_loss.volume_node_ready); "" otherwise, or when the annotation asks for a new one."""
    if pod is None or (pod.get("annotations") or {}).get(c.ANNOTATION_REPLACE_VOLUME):
        return ""
    if pvc is None or volume_lost(pod, pvc) or not observed.volume_node_conflict(pod):
        return ""
    return node_loss.volume_node_ready(name, str(pvc.get("volumeNode") or ""))


def wants_new_volume(pod: PodInfo, pvc: PvcInfo | None) -> bool:
    return bool((pod.get("annotations") or {}).get(c.ANNOTATION_REPLACE_VOLUME)) or volume_lost(
        pod, pvc
    )


class _View:
    """The observations, indexed."""

    def __init__(
        self,
        body: Mapping[str, Any],
        pods: Sequence[PodInfo],
        statuses: Mapping[str, ReplicaStatus | None],
        pvcs: Mapping[str, PvcInfo],
        slack: int,
    ) -> None:
        self.body = body
        self.n = specs.replicas_of(body)
        self.quorum = c.quorum(self.n)
        self.names = [specs.pod_name(body, i) for i in range(self.n)]
        self.pods = {p["name"]: p for p in pods if p.get("name") in self.names}
        self.status: dict[str, ReplicaStatus | None] = {}
        for name in self.names:
            pod = self.pods.get(name)
            alive = pod is not None and not is_terminating(pod)
            self.status[name] = statuses.get(name) if alive else None
        self.pvcs = pvcs
        self.slack = slack
        self.leader = leader_of(self.status)

    def pvc_of(self, name: str) -> PvcInfo | None:
        pod = self.pods.get(name)
        claim = (pod or {}).get("pvc") or specs.pvc_name(self.body, self.names.index(name))
        return self.pvcs.get(claim)

    def voting(self, name: str) -> bool:
        pod = self.pods.get(name)
        return pod is not None and is_voting(self.status[name])

    def participating(self, name: str) -> bool:
        pod = self.pods.get(name)
        return self.voting(name) and bool(pod and pod.get("ready"))

    def voting_others(self, name: str) -> list[str]:
        return [o for o in self.names if o != name and self.voting(o)]

    def lagging(self, name: str) -> str:
        """Why `name` is not a caught-up voter, or "" if it is."""
        pod = self.pods.get(name)
        s = self.status[name]
        if pod is None:
            return f"{name} has no pod"
        if s is None:
            return f"{name} is unreachable"
        if not is_voting(s):
            return f"{name} is {status_name(s)}"
        if not pod.get("ready"):
            return f"{name} is not ready"
        ref: ReplicaStatus = s
        leading = self.status.get(self.leader) if self.leader else None
        if leading is not None:
            ref = leading
        else:
            for v in self.status.values():
                if (
                    v is not None
                    and is_voting(v)
                    and int(v.get("learned") or 0) > int(ref.get("learned") or 0)
                ):
                    ref = v
        learned, ref_learned = int(s.get("learned") or 0), int(ref.get("learned") or 0)
        if learned + self.slack >= ref_learned or int(s.get("end") or 0) == int(
            ref.get("end") or 0
        ):
            return ""
        return f"{name} is catching up (learned {learned}, leader {ref_learned})"

    def node_hold(self, name: str) -> str:
        """Why nothing may delete pod `name` or its claim: its node is lost and not
        confirmed gone (node_loss.describe); "" otherwise."""
        loss = node_loss.unconfirmed(self.pods.get(name))
        return node_loss.describe(name, loss) if loss else ""

    def others_caught_up(self, name: str) -> str:
        for other in self.names:
            if other != name:
                why = self.lagging(other)
                if why:
                    return why
        return ""

    def terminating_pvcs(self) -> list[str]:
        own = {specs.pvc_name(self.body, i) for i in range(self.n)}
        return sorted(
            name for name, pvc in self.pvcs.items() if name in own and pvc.get("deletionTimestamp")
        )


def _entry(view: _View, name: str, action: str, update_revision: str, now: str) -> QueueEntry:
    pod = view.pods[name]
    entry = QueueEntry(
        pod=name,
        uid=pod.get("uid", ""),
        action=action,
        revision=update_revision,
        participating=view.participating(name),
        startedAt=now,
    )
    if action == REPLACE_VOLUME:
        pvc = view.pvc_of(name)
        entry["pvc"] = (pvc or {}).get("name") or pod.get("pvc") or ""
        entry["pvcUid"] = (pvc or {}).get("uid", "")
    return entry


def _resume(view: _View, entry: QueueEntry, queue: list[QueueEntry]) -> Action | None:
    """The step of a queued replacement, or None when it is finished."""
    name = entry.get("pod", "")
    pod = view.pods.get(name)
    old_pod = pod is not None and pod.get("uid") == entry.get("uid")
    hold = view.node_hold(name)
    if hold:  # queued before its node was lost: neither the pod nor its claim goes now
        doing = f"{name} is terminating" if pod and is_terminating(pod) else f"replacing {name}"
        return Action("wait", pod=name, reason=f"{doing}: {hold}", queue=queue)
    if entry.get("action") == REPLACE_VOLUME:
        pvc = view.pvcs.get(entry.get("pvc", ""))
        old_pvc = pvc is not None and pvc.get("uid") == entry.get("pvcUid")
        if old_pvc and pvc is not None and not pvc.get("deletionTimestamp"):
            if waits_for_node(name, pod, pvc):
                # queued while the volume's node looked gone, Ready now: nothing is deleted
                # yet, the entry is dropped and next_step says why the pod waits
                return None
            why = _volume_blocker(view, name)
            if why:
                return Action(
                    "wait", pod=name, reason=f"replacing the volume of {name}: {why}", queue=queue
                )
            return Action(
                "delete-pvc-and-pod",
                pod=name,
                uid=pod.get("uid", "") if (old_pod and pod) else "",
                pvc=entry.get("pvc", ""),
                pvc_uid=entry.get("pvcUid", ""),
                reason=f"replacing the volume of {name}",
                queue=queue,
            )
        if old_pod and pod is not None:
            if is_terminating(pod):
                return Action("wait", pod=name, reason=f"{name} is terminating", queue=queue)
            # the claim is going: the pod must go too (the claim is held by it)
            return Action(
                "delete-pod",
                pod=name,
                uid=pod.get("uid", ""),
                reason=f"replacing the volume of {name}",
                queue=queue,
            )
        if old_pvc:
            return Action(
                "wait", pod=name, reason=f"claim {entry.get('pvc')} is terminating", queue=queue
            )
    elif old_pod and pod is not None:
        if is_terminating(pod):
            return Action("wait", pod=name, reason=f"{name} is terminating", queue=queue)
        why = _restart_blocker(view, name)  # conditions may have changed since it was queued
        if why:
            return Action("wait", pod=name, reason=f"replacing {name}: {why}", queue=queue)
        return Action(
            "delete-pod", pod=name, uid=pod.get("uid", ""), reason=f"replacing {name}", queue=queue
        )
    # the replacement pod
    if pod is None or is_terminating(pod):
        return Action(
            "wait", pod=name, reason=f"waiting for the new {name} to be created", queue=queue
        )
    if view.participating(name):
        return None
    has_quorum = sum(view.voting(o) for o in view.names) >= view.quorum
    if not entry.get("participating") and not has_quorum and view.status[name] is not None:
        return None  # it answers; VOTING may need the others: go on with them
    state = status_name(view.status[name])
    detail = (
        (pod.get("restoreFailed") and f"restore failed: {pod['restoreFailed']}")
        or (pod.get("crashLoop") and f"CrashLoopBackOff: {pod['crashLoop']}")
        or pod.get("stuck")
        or pod.get("unschedulable")
        or state
    )
    return Action(
        "wait", pod=name, reason=f"waiting for the new {name} to be VOTING ({detail})", queue=queue
    )


def _restart_blocker(view: _View, name: str) -> str:
    """Why deleting pod `name` (keeping its volume) is not safe now, or ""."""
    if not view.voting(name) or view.n == 1:
        return ""  # its vote is not counted now (or there is nobody else to keep quorum)
    return view.others_caught_up(name)


def _volume_blocker(view: _View, name: str) -> str:
    """Why replacing the volume of `name` is not safe now, or ""."""
    if view.n == 1:
        return "a 1-replica log cannot replace its only volume (it holds the whole log)"
    if view.voting(name):
        return view.others_caught_up(name)
    others = view.voting_others(name)
    if len(others) < view.quorum:
        return f"the other replicas must form a VOTING quorum ({len(others)}/{view.quorum} VOTING)"
    return ""


def next_step(
    body: Mapping[str, Any],
    pods: Sequence[PodInfo],
    statuses: Mapping[str, ReplicaStatus | None],
    update_revision: str,
    queue: Sequence[QueueEntry] = (),
    pvcs: Mapping[str, PvcInfo] | None = None,
    *,
    now: str = "",
    slack: int = DEFAULT_SLACK,
) -> Action:
    """The one next action of the rolling replacement (see the module docs for the rules).

    `pods` are the log's pods (observed.pod_info), `statuses` maps pod name -> the replica's
    status dict (None if unreachable), `queue` is status.rollingUpdate.queue, `pvcs` maps
    claim name -> PvcInfo for the log's claims."""
    view = _View(body, pods, statuses, pvcs or {}, slack)
    work: list[QueueEntry] = [cast(QueueEntry, dict(e)) for e in queue]
    while work:
        step = _resume(view, work[0], work)
        if step is not None:
            return step
        work = work[1:]  # finished

    terminating = view.terminating_pvcs()
    candidates: list[tuple[str, str]] = []
    for_nodes: list[str] = []  # pods that wait for their volume's Ready node
    for name in view.names:
        pod = view.pods.get(name)
        if pod is None or is_terminating(pod):
            continue
        held = waits_for_node(name, pod, view.pvc_of(name))
        if held:
            for_nodes.append(held)
        if wants_new_volume(pod, view.pvc_of(name)):
            candidates.append((name, REPLACE_VOLUME))
        elif update_revision and revision_of(pod) and revision_of(pod) != update_revision:
            candidates.append((name, RESTART))
    if not candidates:
        if terminating:
            return Action(
                "wait", reason=f"claim {', '.join(terminating)} is terminating", queue=work
            )
        if for_nodes:
            return Action("wait", reason="; ".join(for_nodes), queue=work)
        return Action("none", queue=work)
    if terminating:
        return Action("wait", reason=f"claim {', '.join(terminating)} is terminating", queue=work)

    def order(item: tuple[str, str]) -> tuple[bool, bool, int]:
        name = item[0]
        leads = name == view.leader and view.voting(name)
        return (view.participating(name) or leads, leads, -view.names.index(name))

    candidates.sort(key=order)
    reasons: list[str] = []
    for name, action in candidates:
        if name == view.leader and view.voting(name) and len(candidates) > 1:
            continue  # the leader goes last
        if action == REPLACE_VOLUME:
            why = view.node_hold(name) or _volume_blocker(view, name)
        else:
            why = view.node_hold(name) or _restart_blocker(view, name)
        if why:
            reasons.append(f"{name}: {why}")
            continue
        if name == view.leader and view.voting(name) and view.n > 1:
            return Action(
                "step-down",
                pod=name,
                uid=view.pods[name].get("uid", ""),
                reason=f"asking the leader {name} to step down before replacing it",
                queue=work,
            )
        entry = _entry(view, name, action, update_revision, now)
        queued = [*work, entry]
        if action == REPLACE_VOLUME:
            return Action(
                "delete-pvc-and-pod",
                pod=name,
                uid=entry["uid"],
                pvc=entry.get("pvc", ""),
                pvc_uid=entry.get("pvcUid", ""),
                reason=f"replacing the volume of {name}",
                queue=queued,
            )
        return Action(
            "delete-pod", pod=name, uid=entry["uid"], reason=f"replacing {name}", queue=queued
        )
    if not reasons:  # only the leader is left, and it may not go yet
        reasons.append(f"{view.leader}: the leader goes last")
    return Action("wait", reason="; ".join([*for_nodes, *reasons]), queue=work)
