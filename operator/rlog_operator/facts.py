"""The facts of one observation of a ReplicatedLog, gathered once (a pure function, no I/O).

`gather` reads what the observe timer saw (the CR, its pods, the replicas' answers, the
StatefulSet's update revision, the rolling step, the previous status) and returns one frozen
`Facts`: who answers and in which state, who is VOTING and whether they form a quorum, who
leads, whether the log was ever initialized, whether a total data loss is suspected, what
the rolling replacement is doing, and whether a replicas change is refused. The status
(`status.py`) and the initialization permits (`permits.py`) are small functions of these
facts, so every rule reads the same counts and nobody recomputes them differently.

Two facts carry memory from the previous status, because the replicas cannot tell:

* initialized is sticky: once a replica has been VOTING the log holds data, whatever the
  replicas say later.
* a suspected data loss (an initialized log whose every replica answers EMPTY) stays
  suspected until a VOTING quorum exists again, so the hold on permits does not lapse when
  one replica becomes unreachable.

And each replica's health (`ReplicaHealth`: its storage condition, corrupt records, a crash
loop) is what it last told, kept from the previous status while it does not answer (a
crash-looping or restarting replica says nothing), so that a condition is reported once
when it appears and once when it clears, not at every restart in between.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlog_operator import constants as c
from rlog_operator import specs
from rlog_operator.observed import (
    UNKNOWN,
    PodInfo,
    ReplicaStatus,
    is_terminating,
    leader_of,
    revision_of,
    status_name,
)

# the storage kind of a pod whose restore init container failed (beside the replicas' own
# storage conditions: "corrupt-repaired", "storage-lost", "refusing", "disk-failing",
# "disk-full"; "fault" for a storage fault reported without a condition)
RESTORE_FAILED = "restore-failed"
STORAGE_FAULT = "fault"

# replica states in the order a summary lists them
STATE_ORDER = (c.VOTING, c.RECOVERING, c.STARTING, c.EMPTY, UNKNOWN)


def condition_true(status: Mapping[str, Any], type_: str) -> bool:
    """Whether a status (as stored on the CR) holds condition `type_` with status True."""
    return any(
        cond.get("type") == type_ and cond.get("status") == "True"
        for cond in status.get("conditions") or []
    )


@dataclass(frozen=True)
class ReplicaHealth:
    """What a replica last said of its storage, and how its pod last failed."""

    storage: str = ""  # a storage condition, RESTORE_FAILED or STORAGE_FAULT; "" healthy
    detail: str = ""  # the replica's storage_fault line, or the restore's last termination
    corrupt_records: int = 0  # corrupt records the replica found since it started
    crash_loop: str = ""  # the replica container's last termination while it crash-loops

    def as_item(self) -> dict[str, Any]:
        """The fields of a status.replicas item that keep it (empty ones left out)."""
        item: dict[str, Any] = {}
        if self.storage:
            item["storage"] = self.storage
        if self.detail:
            item["storageFault"] = self.detail
        if self.corrupt_records:
            item["corruptRecords"] = self.corrupt_records
        if self.crash_loop:
            item["crashLoop"] = self.crash_loop
        return item


def storage_kind(replica: ReplicaStatus) -> str:
    """A replica's storage condition as it reports it (`storage_condition`); from a replica
    that predates the field, what its other storage fields say."""
    condition = str(replica.get("storage_condition") or "")
    if condition:
        return condition
    if replica.get("disk_full"):
        return "disk-full"
    if replica.get("storage_fault"):
        return "corrupt-repaired" if int(replica.get("corrupt_records") or 0) else STORAGE_FAULT
    return ""


def health_of(
    replica: ReplicaStatus | None, pod: PodInfo | None, before: ReplicaHealth
) -> ReplicaHealth:
    """A replica's health now: what it answers, else what its pod shows (a failed restore,
    a crash loop) over what it said before."""
    if replica is not None:
        return ReplicaHealth(
            storage=storage_kind(replica),
            detail=str(replica.get("storage_fault") or ""),
            corrupt_records=int(replica.get("corrupt_records") or 0),
        )
    pod = pod or PodInfo()
    if pod.get("restoreFailed"):
        return ReplicaHealth(RESTORE_FAILED, str(pod["restoreFailed"]), before.corrupt_records)
    return ReplicaHealth(
        before.storage,
        before.detail,
        before.corrupt_records,
        str(pod.get("crashLoop") or "") or before.crash_loop,
    )


def health_items(previous: Mapping[str, Any]) -> dict[str, ReplicaHealth]:
    """The replicas' health as the previous status stored it, by pod name."""
    return {
        str(item.get("name")): ReplicaHealth(
            storage=str(item.get("storage") or ""),
            detail=str(item.get("storageFault") or ""),
            corrupt_records=int(item.get("corruptRecords") or 0),
            crash_loop=str(item.get("crashLoop") or ""),
        )
        for item in previous.get("replicas") or []
    }


@dataclass(frozen=True)
class Facts:
    """One observation of a log. Name tuples follow the pods' ordinals unless sorted."""

    # ---- the log, from its CR
    uid: str  # metadata.uid: the log id the replicas are stamped with
    generation: int
    names: tuple[str, ...]  # the pods the log should have, by ordinal
    quorum_size: int
    auto_initialize: bool  # spec.autoInitialize
    annotations: Mapping[str, str]  # on the CR: the one-shot initialize/reinitialize acks
    update_revision: str  # the StatefulSet's current pod template revision
    # ---- what was observed
    pods: Mapping[str, PodInfo]  # the expected pods that exist, by name
    replicas: Mapping[str, ReplicaStatus | None]  # by pod name; None: no answer (or terminating)
    states: Mapping[str, str]  # by pod name: EMPTY, STARTING, RECOVERING, VOTING or Unknown
    # ---- derived
    voting: tuple[str, ...]  # sorted
    reached: tuple[str, ...]  # the replicas that answered
    ready: tuple[str, ...]  # pods whose Ready condition is True
    down: tuple[str, ...]  # sorted: no answer
    recovering: tuple[str, ...]  # sorted: answered EMPTY, STARTING or RECOVERING
    foreign: tuple[str, ...]  # sorted: stamped with another log's id
    outdated: tuple[str, ...]  # sorted: pods on another revision than update_revision
    quorum: bool  # a VOTING quorum exists
    leader: str  # "" without a VOTING quorum
    initialized: bool  # sticky: some replica has been VOTING
    was_initialized: bool  # the previous status said initialized
    was_data_loss: bool  # the previous status held the DataLoss condition
    data_loss: bool  # suspected total data loss (sticky until a VOTING quorum)
    health: Mapping[str, ReplicaHealth]  # by pod name (kept while a replica does not answer)
    was_health: Mapping[str, ReplicaHealth]  # by pod name, as the previous status had it
    # ---- the rolling replacement (what rolling.next_step decided) and failures
    rolling_queue: tuple[Mapping[str, Any], ...]
    rolling_message: str
    rolling: bool  # a replacement is queued or some pod is outdated
    error: str  # a reconcile failure to surface ("" if none)
    refused: str  # the refusal of a spec.replicas or TLS mode change ("" if none)

    @property
    def size(self) -> int:
        """The number of replicas."""
        return len(self.names)

    def count(self, state: str) -> int:
        """How many replicas are in `state` (EMPTY, RECOVERING, VOTING, ..., Unknown)."""
        return sum(1 for name in self.names if self.states[name] == state)

    @property
    def failure(self) -> str:
        """Why the operator cannot reconcile the log, or ""."""
        if self.error:
            return self.error
        if self.refused:
            return self.refused
        if self.foreign:
            return (
                f"replicas {', '.join(self.foreign)} belong to another log (their data dir is "
                f"stamped with another log id than {self.uid})"
            )
        return ""

    def summary(self) -> str:
        """The replicas by state, e.g. "2 VOTING, 1 EMPTY"."""
        return ", ".join(f"{self.count(s)} {s}" for s in STATE_ORDER if self.count(s))


def gather(
    body: Mapping[str, Any],
    pods: Sequence[PodInfo],
    statuses: Mapping[str, ReplicaStatus | None],
    update_revision: str,
    previous: Mapping[str, Any] | None,
    *,
    rolling_update: Mapping[str, Any] | None = None,
    error: str | None = None,
    refused: str = "",
) -> Facts:
    """The facts of one observation.

    `statuses` maps pod name -> the replica's status dict (None: unreachable); `previous`
    is the status stored on the CR; `rolling_update` is what rolling.next_step decided
    (queue, message); `error` a reconcile failure; `refused` the refusal of a replicas
    or TLS mode change (observed.replicas_changed, observed.tls_mode_changed)."""
    prev = previous or {}
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    uid = str(meta.get("uid") or "")
    n = specs.replicas_of(body)
    names = tuple(specs.pod_name(body, i) for i in range(n))
    by_name = {p["name"]: p for p in pods if p.get("name") in names}
    answers = {name: statuses.get(name) for name in names}
    for name, pod in by_name.items():
        if is_terminating(pod):
            answers[name] = None  # a terminating pod's vote is about to go
    states = {name: status_name(s) for name, s in answers.items()}

    voting = tuple(sorted(name for name in names if states[name] == c.VOTING))
    reached = tuple(name for name in names if answers[name] is not None)
    quorum_size = c.quorum(n)
    has_quorum = len(voting) >= quorum_size
    initialized = bool(prev.get("initialized")) or bool(voting)
    was_data_loss = condition_true(prev, "DataLoss")
    all_empty = len(reached) == n and all(states[name] == c.EMPTY for name in names)
    data_loss = not has_quorum and ((initialized and all_empty) or was_data_loss)
    outdated = tuple(
        sorted(
            name
            for name, pod in by_name.items()
            if update_revision and revision_of(pod) and revision_of(pod) != update_revision
        )
    )
    rolling = rolling_update or {}
    queue = tuple(rolling.get("queue") or ())
    was_health = health_items(prev)
    health = {
        name: health_of(answers[name], by_name.get(name), was_health.get(name, ReplicaHealth()))
        for name in names
    }
    return Facts(
        uid=uid,
        generation=int(meta.get("generation") or 0),
        names=names,
        quorum_size=quorum_size,
        auto_initialize=bool(spec.get("autoInitialize", True)),
        annotations=dict(meta.get("annotations") or {}),
        update_revision=update_revision,
        pods=by_name,
        replicas=answers,
        states=states,
        voting=voting,
        reached=reached,
        ready=tuple(name for name in names if name in by_name and by_name[name].get("ready")),
        down=tuple(sorted(name for name in names if answers[name] is None)),
        recovering=tuple(
            sorted(name for name in reached if states[name] in (c.EMPTY, c.RECOVERING, c.STARTING))
        ),
        foreign=tuple(
            sorted(
                name
                for name, s in answers.items()
                if s is not None and uid and s.get("log_id") and s.get("log_id") != uid
            )
        ),
        outdated=outdated,
        quorum=has_quorum,
        leader=leader_of(answers) if has_quorum else "",
        initialized=initialized,
        was_initialized=bool(prev.get("initialized")),
        was_data_loss=was_data_loss,
        data_loss=data_loss,
        health=health,
        was_health={name: was_health.get(name, ReplicaHealth()) for name in names},
        rolling_queue=queue,
        rolling_message=str(rolling.get("message") or ""),
        rolling=bool(queue or outdated),
        error=error or "",
        refused=refused,
    )
