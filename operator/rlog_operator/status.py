"""A ReplicatedLog's status, conditions and Events: small pure functions of `facts.Facts`.

`compute_status` gathers the facts of one observation (`facts.gather`) and composes the
functions below: `phase`, one setter per condition, `replica_item`, `events` (the
transitions since the previous status) and `annotations_to_remove`, with the permit
decision of `permits.decide`. None of them does I/O.

Phases (one word for `kubectl get rlog`, first match wins):

* Failed: the operator cannot reconcile (an error passed in, a refused replicas or TLS mode
  change, or a replica stamped with another log's identity).
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
Degraded (fewer than all replicas VOTING), Recovering, RollingUpdate, DataLoss,
StorageDegraded (some replica reports storage trouble: `storage_health.py`), NodeLost
(some replica's pod is on a node that is not Ready or gone: `node_loss.py`); a
condition's lastTransitionTime changes only when its status flips. docs/operator.md
describes the Events.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rlog_operator import constants as c
from rlog_operator import node_loss, permits, storage_health
from rlog_operator.facts import Facts, condition_true, gather
from rlog_operator.observed import (
    UNKNOWN,
    NodeLoss,
    PodInfo,
    ReplicaStatus,
    is_terminating,
    is_voting,
    revision_of,
    status_name,
)
from rlog_operator.permits import PermitDecision

CONDITION_TYPES = (
    "Ready",
    "Initialized",
    "Degraded",
    "Recovering",
    "RollingUpdate",
    "DataLoss",
    "StorageDegraded",
    "NodeLost",
)
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
    "paused",
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
    "storage",
    "storageFault",
    "corruptRecords",
    "crashLoop",
    "node",
    "nodeLost",
)


@dataclass(frozen=True)
class Event:
    type: str  # Normal or Warning
    reason: str
    message: str


@dataclass
class StatusResult:
    """What one observation yields: the status to store, the Events to post, the permit
    decision to carry out and the annotations to remove; and the facts they came from (what
    plan.decide reads)."""

    status: dict[str, Any]
    facts: Facts
    events: list[Event] = field(default_factory=list)
    permit: PermitDecision = field(default_factory=lambda: PermitDecision(False, ""))
    remove_annotations: list[str] = field(default_factory=list)  # on the ReplicatedLog


@dataclass(frozen=True)
class Phase:
    name: str  # Pending, Initializing, Ready, Recovering, Degraded, RollingUpdate, ...
    message: str


@dataclass(frozen=True)
class Condition:
    """What a condition says now; `as_status` dates it against the previous conditions."""

    type: str
    value: bool
    reason: str
    message: str

    def as_status(
        self, previous: Sequence[Mapping[str, Any]], now: str, generation: int
    ) -> dict[str, Any]:
        return condition(
            self.type, self.value, self.reason, self.message, previous, now, generation
        )


# ---- the phase ------------------------------------------------------------------------------


def phase(facts: Facts) -> Phase:
    """The one-word phase and its message (the module docs list the phases in order)."""
    n = facts.size
    failure = facts.failure
    if failure:
        return Phase("Failed", failure)
    allowed, why = permits.policy(facts)
    if facts.data_loss:
        return Phase("DataLoss", why)
    if not facts.initialized:
        if not facts.reached:
            return Phase("Pending", f"waiting for the replicas ({len(facts.pods)}/{n} pods)")
        return Phase("Initializing", why if not allowed else f"initializing: {facts.summary()}")
    if not facts.quorum:
        return Phase(
            "Degraded",
            f"no VOTING quorum ({len(facts.voting)}/{n} VOTING, need {facts.quorum_size}): "
            "the log cannot serve",
        )
    if facts.rolling:
        return Phase(
            "RollingUpdate",
            facts.rolling_message
            or f"{n - len(facts.outdated)}/{n} replicas on the update revision",
        )
    if facts.down:
        return Phase("Degraded", f"unreachable: {', '.join(facts.down)}")
    if facts.recovering:
        return Phase("Recovering", f"catching up: {', '.join(facts.recovering)}")
    if len(facts.ready) < n:
        not_ready = ", ".join(name for name in facts.names if name not in facts.ready)
        return Phase("Degraded", f"not ready: {not_ready}")
    return Phase("Ready", f"{n}/{n} replicas VOTING, leader {facts.leader or 'unknown'}")


# ---- conditions -----------------------------------------------------------------------------


def ready_condition(facts: Facts) -> Condition:
    """True while the log serves: initialized, with a VOTING quorum, no data loss suspected."""
    serving = facts.initialized and facts.quorum and not facts.data_loss
    if serving:
        reason = "QuorumVoting"
    else:
        reason = "NoQuorum" if facts.initialized else "NotInitialized"
    message = f"{len(facts.voting)}/{facts.size} replicas VOTING (quorum {facts.quorum_size})"
    return Condition("Ready", serving, reason, message)


def initialized_condition(facts: Facts) -> Condition:
    """True once some replica has been VOTING; until then, whether a permit may go out."""
    if facts.initialized:
        return Condition("Initialized", True, "Initialized", "a replica has been VOTING")
    allowed, why = permits.policy(facts)
    reason = "Initializing" if allowed else "AwaitingInitializeAnnotation"
    return Condition("Initialized", False, reason, why)


def degraded_condition(facts: Facts) -> Condition:
    """True when an initialized log has fewer than all its replicas VOTING."""
    value = facts.initialized and len(facts.voting) < facts.size
    if facts.initialized and not facts.quorum:
        reason = "NoQuorum"
    else:
        reason = "ReplicasNotVoting" if value else "AllVoting"
    not_voting = ", ".join(name for name in facts.names if name not in facts.voting)
    return Condition("Degraded", value, reason, f"not VOTING: {not_voting or 'none'}")


def recovering_condition(facts: Facts) -> Condition:
    """True when an initialized log has replicas catching up (EMPTY, STARTING, RECOVERING)."""
    value = facts.initialized and bool(facts.recovering)
    reason = "CatchingUp" if value else "NoneRecovering"
    return Condition(
        "Recovering", value, reason, f"catching up: {', '.join(facts.recovering) or 'none'}"
    )


def rolling_update_condition(facts: Facts) -> Condition:
    """True while a replacement is queued or some pod runs an outdated revision."""
    if facts.rolling:
        return Condition("RollingUpdate", True, "PodsOutdated", phase(facts).message)
    return Condition("RollingUpdate", False, "UpToDate", "every replica runs the update revision")


def data_loss_condition(facts: Facts) -> Condition:
    """True while a total data loss is suspected (sticky until a VOTING quorum)."""
    if facts.data_loss:
        return Condition("DataLoss", True, "AllReplicasEmpty", permits.policy(facts)[1])
    return Condition("DataLoss", False, "NoDataLoss", "no suspected data loss")


def storage_degraded_condition(facts: Facts) -> Condition:
    """True while some replica reports storage trouble or its restore failed."""
    return Condition("StorageDegraded", *storage_health.degraded(facts))


def node_lost_condition(facts: Facts) -> Condition:
    """True while some replica's pod is on a lost node (node_loss.py), with what the operator
    does about each: reason NodeNotReady while some loss awaits the admin's confirmation,
    NodeConfirmedGone once every one is confirmed."""
    lost = {
        name: loss for name in facts.names if (loss := (facts.pods.get(name) or {}).get("nodeLost"))
    }
    if not lost:
        return Condition("NodeLost", False, "NodesReady", "every replica's node is Ready")
    waiting = any(not loss.get("confirmed") for loss in lost.values())
    message = "; ".join(_node_sentence(facts, name, loss) for name, loss in lost.items())
    return Condition("NodeLost", True, "NodeNotReady" if waiting else "NodeConfirmedGone", message)


def _node_sentence(facts: Facts, name: str, loss: NodeLoss) -> str:
    """What the operator does about replica `name` on a lost node, with the VOTING count of
    the others (a replacement after the confirmation needs them to form a quorum)."""
    others = len([v for v in facts.voting if v != name])
    return node_loss.describe(name, loss, others, facts.quorum_size)


# the setters, in the order of CONDITION_TYPES
CONDITIONS: tuple[Callable[[Facts], Condition], ...] = (
    ready_condition,
    initialized_condition,
    degraded_condition,
    recovering_condition,
    rolling_update_condition,
    data_loss_condition,
    storage_degraded_condition,
    node_lost_condition,
)


def now() -> str:
    """The time now as the status writes it (RFC 3339, to the second): the `now` of
    `compute_status` and `condition`."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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


# ---- Events of transitions ------------------------------------------------------------------


def events(previous: Mapping[str, Any] | None, facts: Facts) -> list[Event]:
    """The Events of what changed since the previous status."""
    prev = previous or {}
    return [
        *_initialization_events(facts),
        *_quorum_events(prev, facts),
        *_replica_events(prev, facts),
        *_rolling_events(prev, facts),
        *_failure_events(prev, facts),
        *(Event(*change) for change in storage_health.changes(facts)),
        *_node_events(prev, facts),
    ]


def _initialization_events(facts: Facts) -> list[Event]:
    """Initialized once; DataLoss when a loss is first suspected; Reinitialized when it ends."""
    result: list[Event] = []
    if facts.initialized and not facts.was_initialized:
        result.append(Event("Normal", "Initialized", f"the log is initialized: {facts.summary()}"))
    if facts.data_loss and not facts.was_data_loss:
        result.append(Event("Warning", "DataLoss", permits.policy(facts)[1]))
    if facts.was_data_loss and not facts.data_loss:
        result.append(Event("Normal", "Reinitialized", f"the log serves again: {facts.summary()}"))
    return result


def _quorum_events(prev: Mapping[str, Any], facts: Facts) -> list[Event]:
    """QuorumLost / QuorumRestored in an initialized log; LeaderElected on a new leader."""
    result: list[Event] = []
    had_quorum = bool(prev.get("quorum"))
    if facts.was_initialized and had_quorum and not facts.quorum and not facts.data_loss:
        result.append(Event("Warning", "QuorumLost", phase(facts).message))
    if facts.was_initialized and not had_quorum and facts.quorum and "quorum" in prev:
        result.append(
            Event("Normal", "QuorumRestored", f"{len(facts.voting)}/{facts.size} replicas VOTING")
        )
    was = prev.get("leader") or ""
    if facts.leader and facts.leader != was:
        result.append(
            Event("Normal", "LeaderElected", f"{facts.leader} leads the log (was {was or 'none'})")
        )
    return result


def _replica_events(prev: Mapping[str, Any], facts: Facts) -> list[Event]:
    """ReplicaEmpty when a VOTING replica comes back EMPTY (its volume was lost);
    ReplicaRecovered when a catching-up replica turns VOTING."""
    before_states = {
        str(item.get("name")): str(item.get("status") or UNKNOWN)
        for item in prev.get("replicas") or []
    }
    result: list[Event] = []
    for name in facts.names:
        before, after = before_states.get(name), facts.states[name]
        if before == c.VOTING and after == c.EMPTY and facts.initialized:
            result.append(
                Event(
                    "Warning",
                    "ReplicaEmpty",
                    f"{name} came back EMPTY (its volume was lost or replaced): "
                    "it recovers from the VOTING replicas",
                )
            )
        elif before in (c.EMPTY, c.RECOVERING) and after == c.VOTING and facts.was_initialized:
            result.append(Event("Normal", "ReplicaRecovered", f"{name} caught up and is VOTING"))
    return result


def _rolling_events(prev: Mapping[str, Any], facts: Facts) -> list[Event]:
    """RollingUpdateStarted / RollingUpdateCompleted when the RollingUpdate condition flips."""
    was_rolling = condition_true(prev, "RollingUpdate")
    if facts.rolling and not was_rolling:
        replacing = ", ".join(facts.outdated) or "pods"
        return [Event("Normal", "RollingUpdateStarted", f"replacing {replacing} one at a time")]
    if not facts.rolling and was_rolling:
        return [Event("Normal", "RollingUpdateCompleted", "every replica runs the update revision")]
    return []


def _node_events(prev: Mapping[str, Any], facts: Facts) -> list[Event]:
    """NodeLost (Warning) when a replica's pod is first seen on a lost node; NodeLossCleared
    when it no longer is (the node is Ready again, or the pod was removed from it)."""
    before = {
        str(item.get("name")): str(item.get("nodeLost") or "")
        for item in prev.get("replicas") or []
    }
    result: list[Event] = []
    for name in facts.names:
        loss = (facts.pods.get(name) or {}).get("nodeLost")
        if loss and not before.get(name):
            result.append(Event("Warning", "NodeLost", _node_sentence(facts, name, loss)))
        elif before.get(name) and not loss:
            message = f"{name} is no longer on a lost node (was: {before[name]})"
            result.append(Event("Normal", "NodeLossCleared", message))
    return result


def _failure_events(prev: Mapping[str, Any], facts: Facts) -> list[Event]:
    """Failed when the phase turns Failed."""
    failure = facts.failure
    if failure and prev.get("phase") != "Failed":
        return [Event("Warning", "Failed", failure)]
    return []


# ---- annotations ----------------------------------------------------------------------------


def annotations_to_remove(facts: Facts) -> list[str]:
    """The one-shot annotations to take off the ReplicatedLog: the reinitialize ack once the
    re-initialized log serves again, so a later loss needs a new ack."""
    if (
        facts.was_data_loss
        and not facts.data_loss
        and c.ANNOTATION_REINITIALIZE in facts.annotations
    ):
        return [c.ANNOTATION_REINITIALIZE]
    return []


# ---- the status -----------------------------------------------------------------------------


def replica_item(facts: Facts, name: str) -> dict[str, Any]:
    """The `status.replicas` item of pod `name`: its replica's state, and why it does not
    answer when it does not."""
    pod: PodInfo | None = facts.pods.get(name)
    s: ReplicaStatus | None = facts.replicas[name]
    revision = revision_of(pod) if pod else ""
    item: dict[str, Any] = {
        "name": name,
        "status": status_name(s),
        "ready": bool(pod and pod.get("ready")),
        "revision": revision,
        "updated": bool(facts.update_revision) and revision == facts.update_revision,
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
    elif pod.get("restoreFailed"):
        item["reason"] = f"restore failed: {pod['restoreFailed']}"
    elif pod.get("crashLoop"):
        item["reason"] = f"pod CrashLoopBackOff: {pod['crashLoop']}"
    elif pod.get("stuck"):
        item["reason"] = f"pod {pod['stuck']}"
    elif pod.get("unschedulable"):
        item["reason"] = f"unschedulable: {pod['unschedulable']}"
    else:
        item["reason"] = f"unreachable (pod {pod.get('phase', 'Pending')})"
    item.update(facts.health[name].as_item())
    if pod and pod.get("node"):
        item["node"] = str(pod["node"])
    loss = (pod or {}).get("nodeLost")
    if loss:
        item["nodeLost"] = node_loss.state(loss)
    return item


def status_of(
    facts: Facts, previous_conditions: Sequence[Mapping[str, Any]], now: str
) -> dict[str, Any]:
    """The `status` object of the ReplicatedLog (the fields of STATUS_FIELDS)."""
    current = phase(facts)
    return {
        "phase": current.name,
        "message": current.message,
        "initialized": facts.initialized,
        "leader": facts.leader,
        "quorum": facts.quorum,
        "votingReplicas": len(facts.voting),
        "readyReplicas": len(facts.ready),
        "replicas": [replica_item(facts, name) for name in facts.names],
        "conditions": [
            setter(facts).as_status(previous_conditions, now, facts.generation)
            for setter in CONDITIONS
        ],
        "observedGeneration": facts.generation,
        "updateRevision": facts.update_revision,
        "rollingUpdate": {"queue": list(facts.rolling_queue), "message": facts.rolling_message},
    }


def status_patch(previous: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of `new` that differ from `previous`: what to write. An observation that
    changed nothing writes nothing, so the operator can observe every second without
    writing to the API server more often than something actually changes (a log under
    continuous appends: at most one status write per observation)."""
    return {key: value for key, value in new.items() if previous.get(key) != value}


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
    refused: str = "",
    paused: bool = False,
) -> StatusResult:
    """The new status of a ReplicatedLog, the Events of its transitions and the permits.

    `statuses` maps pod name -> the replica's status dict (None: unreachable); `now` is an
    RFC 3339 timestamp; `rolling_update` is what rolling.next_step decided (queue, message);
    `error` a reconcile failure to surface as phase Failed; `refused` the refusal of a
    replicas change (phase Failed too, and no permit granted); `paused` the log's
    rlog.io/paused annotation: the status says so, and no permit and no annotation removal
    comes out (the handler takes no rolling action either)."""
    facts = gather(
        body,
        pods,
        statuses,
        update_revision,
        previous,
        rolling_update=rolling_update,
        error=error,
        refused=refused,
    )
    status = status_of(facts, (previous or {}).get("conditions") or [], now)
    status["paused"] = paused
    if paused:
        return StatusResult(
            status=status,
            facts=facts,
            events=events(previous, facts),
            permit=PermitDecision(False, "reconciliation is paused (rlog.io/paused)"),
        )
    return StatusResult(
        status=status,
        facts=facts,
        events=events(previous, facts),
        permit=permits.decide(facts),
        remove_annotations=annotations_to_remove(facts),
    )
