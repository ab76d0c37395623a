"""A ReplicatedLog's status, Events and initialization permits, computed by pure functions.

Inputs are what the kopf handler observed (no I/O here): the replica pods (`observed.pod_info` turns
a Pod object into the small dict used here), each replica's `rlog status --json`-shaped dict
(None when unreachable), the StatefulSet's updateRevision, the previous status and the CR.

Phases (one word for `kubectl get rlog`, first match wins):

* Failed: the operator cannot reconcile (an error passed in, or a replica stamped with
  another log's identity).
* DataLoss: the log was initialized (status.initialized is sticky) and every replica came
  back EMPTY: a suspected total data loss. No permit until the user sets the annotation
  `rlog.io/reinitialize=<metadata.uid>`; the condition clears once a VOTING quorum exists
  again, and the operator then removes the annotation so a later loss is caught again.
* Pending / Initializing: a new log with no replica answering yet / not yet VOTING.
* Degraded (no quorum): initialized, but no VOTING quorum: the log cannot serve.
* RollingUpdate: a VOTING quorum serves; pods are being replaced one at a time.
* Degraded: a VOTING quorum serves; some replica is down or unreachable.
* Recovering: a VOTING quorum serves; some replica is catching up (EMPTY/RECOVERING).
* Ready: every replica VOTING and its pod ready.

Conditions: Ready (the log serves: initialized with a VOTING quorum), Initialized,
Degraded (fewer than all replicas VOTING), Recovering, RollingUpdate, DataLoss; a
condition's lastTransitionTime changes only when its status flips.

Initialization permit (DESIGN §3): granted only while the log has never been initialized
and spec.autoInitialize is true (or the annotation `rlog.io/initialize=<metadata.uid>`), or
during an acknowledged re-initialization after DataLoss. One addition to the design: a
replica found STARTING in an initialized log keeps (or gets) its permit. STARTING means it
passed phase one of an initialization that other replicas completed; revoking would leave
it STARTING forever (STARTING -> VOTING needs the permit, and a minority of VOTING replicas
cannot recover it). A permit never turns an EMPTY replica into anything in an initialized log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlog_operator import constants as c
from rlog_operator import specs
from rlog_operator.observed import (
    UNKNOWN,
    PodInfo,
    ReplicaStatus,
    is_terminating,
    is_voting,
    leader_of,
    revision_of,
    status_name,
)

CONDITION_TYPES = ("Ready", "Initialized", "Degraded", "Recovering", "RollingUpdate", "DataLoss")
# the fields compute_status writes (all declared in the CRD's status schema)
STATUS_FIELDS = (
    "phase",
    "message",
    "initialized",
    "leader",
    "quorum",
    "votingReplicas",
    "readyReplicas",
    "replicas",
    "conditions",
    "observedGeneration",
    "updateRevision",
    "rollingUpdate",
)
REPLICA_FIELDS = (
    "name",
    "status",
    "role",
    "begin",
    "end",
    "learned",
    "ready",
    "revision",
    "updated",
    "catchup",
    "reason",
)


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass(frozen=True)
class PermitPlan:
    allowed: bool  # the log may be initialized (or re-initialized) now
    reason: str
    grant: tuple[str, ...] = ()  # pod names to grant the permit to
    revoke: tuple[str, ...] = ()  # pod names to revoke it from


@dataclass
class StatusResult:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    permit: PermitPlan = PermitPlan(False, "")
    remove_annotations: list[str] = field(default_factory=list)  # on the ReplicatedLog


# ---- initialization policy ------------------------------------------------------------------


def may_initialize(
    *,
    initialized: bool,
    data_loss: bool,
    auto_initialize: bool,
    annotations: Mapping[str, str],
    uid: str,
) -> tuple[bool, str]:
    """Whether the log may be (re)initialized now, and why (or why not)."""
    if data_loss:
        if uid and annotations.get(c.ANNOTATION_REINITIALIZE) == uid:
            return True, f"re-initialization acknowledged by {c.ANNOTATION_REINITIALIZE}"
        return False, (
            "every replica is EMPTY in a log that was initialized: suspected data loss; "
            f"set the annotation {c.ANNOTATION_REINITIALIZE}={uid} to start an empty log"
        )
    if initialized:
        return False, "the log is initialized"
    if auto_initialize:
        return True, "a new log (spec.autoInitialize)"
    if uid and annotations.get(c.ANNOTATION_INITIALIZE) == uid:
        return True, f"a new log (annotation {c.ANNOTATION_INITIALIZE})"
    return False, (
        f"spec.autoInitialize is false: set the annotation {c.ANNOTATION_INITIALIZE}={uid} "
        "to initialize the log"
    )


def permit_plan(
    allowed: bool,
    reason: str,
    initialized: bool,
    data_loss: bool,
    statuses: Mapping[str, ReplicaStatus | None],
) -> PermitPlan:
    """Which reachable replicas to grant the permit to and which to revoke it from."""
    grant: list[str] = []
    revoke: list[str] = []
    for name, s in sorted(statuses.items()):
        if s is None:
            continue
        state = status_name(s)
        finishing = initialized and not data_loss and state == c.STARTING
        should = (allowed and state in (c.EMPTY, c.STARTING)) or finishing
        holds = bool(s.get("permit"))
        if should and not holds:
            grant.append(name)
        elif holds and not should:
            revoke.append(name)
    return PermitPlan(allowed, reason, tuple(grant), tuple(revoke))


# ---- conditions -----------------------------------------------------------------------------


def condition(
    type_: str,
    value: bool,
    reason: str,
    message: str,
    previous: Sequence[Mapping[str, Any]],
    now: str,
    generation: int,
) -> dict[str, Any]:
    """A metav1.Condition; lastTransitionTime kept unless the status flips."""
    status = "True" if value else "False"
    before = next((p for p in previous if p.get("type") == type_), None)
    since = now
    if before is not None and before.get("status") == status and before.get("lastTransitionTime"):
        since = str(before["lastTransitionTime"])
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": since,
        "observedGeneration": generation,
    }


def condition_true(status: Mapping[str, Any], type_: str) -> bool:
    return any(
        cond.get("type") == type_ and cond.get("status") == "True"
        for cond in status.get("conditions") or []
    )


# ---- the status -----------------------------------------------------------------------------


def _replica_item(
    name: str, pod: PodInfo | None, s: ReplicaStatus | None, update_revision: str
) -> dict[str, Any]:
    revision = revision_of(pod) if pod else ""
    item: dict[str, Any] = {
        "name": name,
        "status": status_name(s),
        "ready": bool(pod and pod.get("ready")),
        "revision": revision,
        "updated": bool(update_revision) and revision == update_revision,
    }
    if s is not None:
        item["role"] = str(s.get("role") or "follower")
        for key in ("begin", "end", "learned"):
            item[key] = int(s.get(key) or 0)
        if s.get("catchup_end"):
            item["catchup"] = f"{int(s.get('catchup_done') or 0)}/{int(s['catchup_end'])}"
        if s.get("reason") and not is_voting(s):
            item["reason"] = str(s["reason"])
    elif pod is None:
        item["reason"] = "no pod"
    elif is_terminating(pod):
        item["reason"] = "pod terminating"
    elif pod.get("stuck"):
        item["reason"] = f"pod {pod['stuck']}"
    elif pod.get("unschedulable"):
        item["reason"] = f"unschedulable: {pod['unschedulable']}"
    else:
        item["reason"] = f"unreachable (pod {pod.get('phase', 'Pending')})"
    return item


def compute_status(
    body: Mapping[str, Any],
    pods: Sequence[PodInfo],
    statuses: Mapping[str, ReplicaStatus | None],
    update_revision: str,
    previous: Mapping[str, Any] | None,
    now: str,
    *,
    rolling_update: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> StatusResult:
    """The new status of a ReplicatedLog, the Events of its transitions and the permits.

    `statuses` maps pod name -> the replica's status dict (None: unreachable); `now` is an
    RFC 3339 timestamp; `rolling_update` is what rolling.next_step decided (queue, message);
    `error` a reconcile failure to surface as phase Failed."""
    prev = dict(previous or {})
    prev_conditions: list[Mapping[str, Any]] = list(prev.get("conditions") or [])
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    generation = int(meta.get("generation") or 0)
    uid = str(meta.get("uid") or "")
    n = specs.replicas_of(body)
    quorum_size = c.quorum(n)
    names = [specs.pod_name(body, i) for i in range(n)]
    by_name = {p["name"]: p for p in pods if p.get("name") in names}
    observed = {name: statuses.get(name) for name in names}
    for name, pod in by_name.items():
        if is_terminating(pod):
            observed[name] = None  # a terminating pod's vote is about to go

    states = {name: status_name(s) for name, s in observed.items()}
    voting = sorted(name for name, st in states.items() if st == c.VOTING)
    reached = [name for name, s in observed.items() if s is not None]
    ready = [name for name in names if name in by_name and by_name[name].get("ready")]
    has_quorum = len(voting) >= quorum_size
    leader = leader_of({name: observed[name] for name in names}) if has_quorum else ""
    initialized = bool(prev.get("initialized")) or bool(voting)
    was_data_loss = condition_true(prev, "DataLoss")
    all_empty = len(reached) == n and all(states[name] == c.EMPTY for name in names)
    if has_quorum:
        data_loss = False
    else:
        data_loss = (initialized and all_empty) or was_data_loss
    foreign = sorted(
        name
        for name, s in observed.items()
        if s is not None and uid and s.get("log_id") and s.get("log_id") != uid
    )
    recovering = sorted(
        name for name in reached if states[name] in (c.EMPTY, c.RECOVERING, c.STARTING)
    )
    down = sorted(name for name in names if observed[name] is None)
    outdated = sorted(
        name
        for name, pod in by_name.items()
        if update_revision and revision_of(pod) and revision_of(pod) != update_revision
    )
    queue = list((rolling_update or {}).get("queue") or [])
    rolling = bool(queue or outdated)

    allowed, permit_reason = may_initialize(
        initialized=initialized,
        data_loss=data_loss,
        auto_initialize=bool(spec.get("autoInitialize", True)),
        annotations=meta.get("annotations") or {},
        uid=uid,
    )
    permits = permit_plan(allowed, permit_reason, initialized, data_loss, observed)

    # ---- phase
    if error or foreign:
        phase = "Failed"
        message = error or (
            f"replicas {', '.join(foreign)} belong to another log (their data dir is stamped "
            f"with another log id than {uid})"
        )
    elif data_loss:
        phase, message = "DataLoss", permit_reason
    elif not initialized:
        if not reached:
            phase, message = "Pending", f"waiting for the replicas ({len(by_name)}/{n} pods)"
        else:
            phase = "Initializing"
            message = permit_reason if not allowed else (f"initializing: {_count(states, names)}")
    elif not has_quorum:
        phase = "Degraded"
        message = (
            f"no VOTING quorum ({len(voting)}/{n} VOTING, need {quorum_size}): the log cannot serve"
        )
    elif rolling:
        phase = "RollingUpdate"
        message = str((rolling_update or {}).get("message") or "") or (
            f"{n - len(outdated)}/{n} replicas on the update revision"
        )
    elif down:
        phase, message = "Degraded", f"unreachable: {', '.join(down)}"
    elif recovering:
        phase, message = "Recovering", f"catching up: {', '.join(recovering)}"
    elif len(ready) < n:
        phase = "Degraded"
        message = f"not ready: {', '.join(n_ for n_ in names if n_ not in ready)}"
    else:
        phase, message = "Ready", f"{n}/{n} replicas VOTING, leader {leader or 'unknown'}"

    def cond(type_: str, value: bool, reason: str, msg: str) -> dict[str, Any]:
        return condition(type_, value, reason, msg, prev_conditions, now, generation)

    serving = initialized and has_quorum and not data_loss
    conditions = [
        cond(
            "Ready",
            serving,
            "QuorumVoting" if serving else ("NotInitialized" if not initialized else "NoQuorum"),
            f"{len(voting)}/{n} replicas VOTING (quorum {quorum_size})",
        ),
        cond(
            "Initialized",
            initialized,
            "Initialized"
            if initialized
            else ("Initializing" if allowed else "AwaitingInitializeAnnotation"),
            "a replica has been VOTING" if initialized else permit_reason,
        ),
        cond(
            "Degraded",
            initialized and len(voting) < n,
            "NoQuorum"
            if initialized and not has_quorum
            else ("ReplicasNotVoting" if initialized and len(voting) < n else "AllVoting"),
            f"not VOTING: {', '.join(n_ for n_ in names if n_ not in voting) or 'none'}",
        ),
        cond(
            "Recovering",
            initialized and bool(recovering),
            "CatchingUp" if initialized and recovering else "NoneRecovering",
            f"catching up: {', '.join(recovering) or 'none'}",
        ),
        cond(
            "RollingUpdate",
            rolling,
            "PodsOutdated" if rolling else "UpToDate",
            message if rolling else "every replica runs the update revision",
        ),
        cond(
            "DataLoss",
            data_loss,
            "AllReplicasEmpty" if data_loss else "NoDataLoss",
            permit_reason if data_loss else "no suspected data loss",
        ),
    ]

    replicas = [
        _replica_item(name, by_name.get(name), observed[name], update_revision) for name in names
    ]
    status: dict[str, Any] = {
        "phase": phase,
        "message": message,
        "initialized": initialized,
        "leader": leader,
        "quorum": has_quorum,
        "votingReplicas": len(voting),
        "readyReplicas": len(ready),
        "replicas": replicas,
        "conditions": conditions,
        "observedGeneration": generation,
        "updateRevision": update_revision,
        "rollingUpdate": {
            "queue": queue,
            "message": str((rolling_update or {}).get("message") or ""),
        },
    }

    # ---- events of transitions
    events: list[Event] = []
    if initialized and not prev.get("initialized"):
        events.append(
            Event("Normal", "Initialized", f"the log is initialized: {_count(states, names)}")
        )
    if data_loss and not was_data_loss:
        events.append(Event("Warning", "DataLoss", permit_reason))
    if was_data_loss and not data_loss:
        events.append(
            Event("Normal", "Reinitialized", f"the log serves again: {_count(states, names)}")
        )
    prev_quorum = bool(prev.get("quorum"))
    if prev.get("initialized") and prev_quorum and not has_quorum and not data_loss:
        events.append(Event("Warning", "QuorumLost", message))
    if prev.get("initialized") and not prev_quorum and has_quorum and "quorum" in prev:
        events.append(Event("Normal", "QuorumRestored", f"{len(voting)}/{n} replicas VOTING"))
    if leader and leader != (prev.get("leader") or ""):
        was = prev.get("leader") or "none"
        events.append(Event("Normal", "LeaderElected", f"{leader} leads the log (was {was})"))
    prev_states = {
        str(item.get("name")): str(item.get("status") or UNKNOWN)
        for item in prev.get("replicas") or []
    }
    for name in names:
        before, after = prev_states.get(name), states[name]
        if before == c.VOTING and after == c.EMPTY and initialized:
            events.append(
                Event(
                    "Warning",
                    "ReplicaEmpty",
                    f"{name} came back EMPTY (its volume was lost or replaced): "
                    "it recovers from the VOTING replicas",
                )
            )
        elif before in (c.EMPTY, c.RECOVERING) and after == c.VOTING and prev.get("initialized"):
            events.append(Event("Normal", "ReplicaRecovered", f"{name} caught up and is VOTING"))
    if rolling and not condition_true(prev, "RollingUpdate"):
        events.append(
            Event(
                "Normal",
                "RollingUpdateStarted",
                f"replacing {', '.join(outdated) or 'pods'} one at a time",
            )
        )
    if not rolling and condition_true(prev, "RollingUpdate"):
        events.append(
            Event("Normal", "RollingUpdateCompleted", "every replica runs the update revision")
        )
    if phase == "Failed" and prev.get("phase") != "Failed":
        events.append(Event("Warning", "Failed", message))

    remove: list[str] = []
    if (
        was_data_loss
        and not data_loss
        and c.ANNOTATION_REINITIALIZE in (meta.get("annotations") or {})
    ):
        remove.append(c.ANNOTATION_REINITIALIZE)  # one-shot: a later loss needs a new ack
    return StatusResult(status=status, events=events, permit=permits, remove_annotations=remove)


def _count(states: Mapping[str, str], names: Sequence[str]) -> str:
    counts: dict[str, int] = {}
    for name in names:
        counts[states[name]] = counts.get(states[name], 0) + 1
    order = (c.VOTING, c.RECOVERING, c.STARTING, c.EMPTY, UNKNOWN)
    return ", ".join(f"{counts[s]} {s}" for s in order if counts.get(s))
