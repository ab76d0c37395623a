"""Storage expansion and migration: the next step, decided by a pure function.

`spec.storage.size` may grow and `spec.storage.storageClassName` may change (shrinking is
refused: by the CRD's CEL rule, and here again). A StatefulSet's volumeClaimTemplates are
immutable, so the StatefulSet keeps the claim template it was built with until `next_step`
replaces it: deleted with `propagationPolicy: Orphan` (its pods and claims stay, running)
and created again from the spec, when it adopts the same pods (same selector, same pod
template: no pod restarts). From then on a fresh claim follows the spec.

Then, claim by claim:

* a claim smaller than the spec on a StorageClass with `allowVolumeExpansion`: its request
  is raised in place (no restart; the volume plugin grows the filesystem online);
* otherwise (another class, or a class that cannot expand): the replica migrates to a fresh
  claim: the planner sets `rlog.io/replace-volume` on its pod and the rolling replacement
  (rolling.next_step) deletes claim and pod, quorum-gated and resumable; the StatefulSet
  creates a fresh claim from the new template, the replica comes back EMPTY, catches up
  from the others and turns VOTING. One replica at a time: only while every replica is
  VOTING, no replacement is queued and no pod carries the annotation; followers first, the
  leader last.

Everything is derived from what is observed (the template, the claims' classes and sizes),
so an operator restart resumes where it was; `migration_status` is `status.migration`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rlog_operator import constants as c
from rlog_operator import specs
from rlog_operator.observed import PodInfo, PvcInfo, StatefulSetRecord
from rlog_operator.quantities import quantity

StepKind = Literal[
    "none", "refuse", "create-statefulset", "recreate-statefulset", "expand", "migrate", "wait"
]


@dataclass(frozen=True)
class Storage:
    """A claim template's or the spec's storage: size and class ("" = the default class)."""

    size: str
    storage_class: str = ""

    @classmethod
    def of_spec(cls, body: Mapping[str, Any]) -> Storage:
        storage = (body.get("spec") or {}).get("storage") or {}
        return cls(str(storage.get("size") or ""), str(storage.get("storageClassName") or ""))

    @classmethod
    def of_claim_spec(cls, spec: Mapping[str, Any]) -> Storage:
        requests = (spec.get("resources") or {}).get("requests") or {}
        return cls(str(requests.get("storage") or ""), str(spec.get("storageClassName") or ""))


@dataclass(frozen=True)
class Claim:
    """One replica's data claim as observed."""

    name: str
    pod: str
    storage: Storage  # what it asks for (spec)
    capacity: str = ""  # status.capacity.storage ("" while unbound)


@dataclass(frozen=True)
class Step:
    kind: StepKind
    reason: str = ""
    pod: str = ""
    claim: str = ""
    size: str = ""  # expand: the new request
    outdated: tuple[str, ...] = field(default=())  # pods whose claim does not match the spec


def shrink_refusal(built: Storage, wanted: Storage) -> str:
    """The refusal of a smaller spec.storage.size; "" when it does not shrink."""
    if not built.size or not wanted.size:
        return ""
    if quantity(wanted.size) < quantity(built.size):
        return (
            f"spec.storage.size cannot shrink ({built.size} -> {wanted.size}): volumes only "
            f"grow; set it back to {built.size} or more"
        )
    return ""


def same(a: Storage, b: Storage) -> bool:
    """The same class and size, by value: the API server writes quantities back in
    canonical form ("1024Mi" comes back as "1Gi")."""
    return a.storage_class == b.storage_class and quantity(a.size) == quantity(b.size)


def _class_differs(claim: Storage, wanted: Storage) -> bool:
    # an unset class in the spec means "the default": any claim's class is accepted
    return bool(wanted.storage_class) and claim.storage_class != wanted.storage_class


def _too_small(claim: Storage, wanted: Storage) -> bool:
    return bool(claim.size) and quantity(claim.size) < quantity(wanted.size)


def next_step(
    wanted: Storage,
    built: Storage | None,
    claims: Sequence[Claim],
    *,
    states: Mapping[str, str],
    leader: str,
    expandable: bool | None,
    busy: str = "",
) -> Step:
    """The one next storage step (see the module docs).

    `built`: the StatefulSet's claim template (None before the StatefulSet exists);
    `claims`: the log's data claims; `states`: pod -> replica status (EMPTY, ..., VOTING,
    Unknown); `expandable`: the wanted class allows volume expansion (None: not known yet);
    `busy`: why the rolling replacement is busy ("" if it is idle: no queue, no pod
    annotated for a new volume)."""
    if not wanted.size:
        return Step("none")
    if built is None:
        # claims but no StatefulSet: it was deleted (by the template replacement, which
        # orphans pods and claims, or by hand): create it again; it adopts what is left
        if claims:
            return Step("create-statefulset", "the StatefulSet is gone: creating it again")
        return Step("none")
    refusal = shrink_refusal(built, wanted)
    if refusal:
        return Step("refuse", refusal)
    outdated = [
        claim
        for claim in claims
        if _class_differs(claim.storage, wanted) or _too_small(claim.storage, wanted)
    ]
    names = tuple(claim.pod for claim in outdated)
    if not same(built, wanted):
        return Step(
            "recreate-statefulset",
            f"the claim template follows the spec ({built.size}/{built.storage_class or 'default'}"
            f" -> {wanted.size}/{wanted.storage_class or 'default'}); pods keep running",
            outdated=names,
        )
    if not outdated:
        return Step("none")
    # in place first: raising a request needs no quorum and restarts nothing
    if expandable:
        for claim in outdated:
            if not _class_differs(claim.storage, wanted):
                return Step(
                    "expand",
                    f"expanding {claim.name} to {wanted.size}",
                    pod=claim.pod,
                    claim=claim.name,
                    size=wanted.size,
                    outdated=names,
                )
    # a fresh claim: another class, or too small on a class that cannot expand
    movable = [
        cl
        for cl in outdated
        if _class_differs(cl.storage, wanted)
        or (expandable is False and _too_small(cl.storage, wanted))
    ]
    if not movable:
        return Step("wait", "looking up whether the StorageClass can expand", outdated=names)
    if busy:
        return Step("wait", f"migrating one replica at a time: {busy}", outdated=names)
    not_voting = sorted(pod for pod, state in states.items() if state != c.VOTING)
    if not_voting:
        return Step(
            "wait",
            f"migrating only while every replica is VOTING (not: {', '.join(not_voting)})",
            outdated=names,
        )
    # followers first (highest ordinal first, like the rolling replacement), the leader last
    ordered = sorted(movable, key=lambda cl: (cl.pod == leader, -_ordinal(cl.pod)))
    target = ordered[0]
    return Step(
        "migrate",
        f"migrating {target.pod} to a fresh claim ({wanted.size}/"
        f"{wanted.storage_class or 'default'})",
        pod=target.pod,
        claim=target.name,
        outdated=names,
    )


def _ordinal(pod: str) -> int:
    tail = pod.rpartition("-")[2]
    return int(tail) if tail.isdigit() else 0


def migration_status(wanted: Storage, claims: Sequence[Claim], step: Step) -> dict[str, Any]:
    """`status.migration`: the target, how many claims match it, and the step under way."""
    phase = {
        "none": "Idle",
        "refuse": "Refused",
        "create-statefulset": "Template",
        "recreate-statefulset": "Template",
        "expand": "Expanding",
        "migrate": "Migrating",
        "wait": "Waiting",
    }[step.kind]
    done = len(claims) - len(step.outdated)
    result: dict[str, Any] = {
        "phase": phase,
        "size": wanted.size,
        "storageClassName": wanted.storage_class,
        "done": max(done, 0),
        "total": len(claims),
        "message": step.reason,
    }
    if step.outdated:
        result["pending"] = list(step.outdated)
    return result


# ---- from observations ----------------------------------------------------------------------


def built_of(record: StatefulSetRecord | None) -> Storage | None:
    """The StatefulSet's claim template (None before the StatefulSet exists)."""
    if record is None or not record.get("claimSize"):
        return None
    return Storage(str(record.get("claimSize")), str(record.get("claimClass") or ""))


def claims_of(body: Mapping[str, Any], pvcs: Mapping[str, PvcInfo]) -> list[Claim]:
    """The log's data claims that exist and are not going, in ordinal order."""
    result: list[Claim] = []
    for ordinal in range(specs.replicas_of(body)):
        pvc = pvcs.get(specs.pvc_name(body, ordinal))
        if pvc is None or pvc.get("deletionTimestamp"):
            continue
        result.append(
            Claim(
                str(pvc.get("name")),
                specs.pod_name(body, ordinal),
                Storage(str(pvc.get("size") or ""), str(pvc.get("storageClass") or "")),
                str(pvc.get("capacity") or ""),
            )
        )
    return result


def rolling_busy(queue: Sequence[Mapping[str, Any]], pods: Sequence[PodInfo]) -> str:
    """Why a migration step must wait for the rolling replacement ("" if it is idle)."""
    if queue:
        return f"replacing {', '.join(str(e.get('pod')) for e in queue)}"
    asked = [
        str(p.get("name"))
        for p in pods
        if (p.get("annotations") or {}).get(c.ANNOTATION_REPLACE_VOLUME)
    ]
    return f"{', '.join(asked)} waiting for a new volume" if asked else ""
