"""What the operator keeps of the objects it watches (pure functions, no I/O).

The handlers keep kopf indexes of the replicas' pods, claims and StatefulSets and of the
names of existing PersistentVolumes: the watch streams keep them current, so the observe
timer reads memory instead of listing objects every few seconds. These functions turn a
watched object into the small record an index holds, keyed by (namespace, log name).
"""

from __future__ import annotations

from collections.abc import Container, Iterable, Mapping
from typing import Any, TypedDict

from rlog_operator import constants as c
from rlog_operator.rolling import PvcInfo

LogKey = tuple[str, str]  # (namespace, ReplicatedLog name)

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


def claim_record(claim: Mapping[str, Any]) -> PvcInfo:
    meta = claim.get("metadata") or {}
    return PvcInfo(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        phase=str((claim.get("status") or {}).get("phase") or ""),
        deletionTimestamp=meta.get("deletionTimestamp"),
        volume=str((claim.get("spec") or {}).get("volumeName") or ""),
    )


class StatefulSetRecord(TypedDict):
    updateRevision: str
    replicas: int  # spec.replicas: the log's real size (it never changes)


def statefulset_record(statefulset: Mapping[str, Any]) -> StatefulSetRecord:
    return StatefulSetRecord(
        updateRevision=str((statefulset.get("status") or {}).get("updateRevision") or ""),
        replicas=int((statefulset.get("spec") or {}).get("replicas") or 0),
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


def claims_by_name(claims: Iterable[PvcInfo], volumes: Container[str] | None) -> dict[str, PvcInfo]:
    """The log's claims by name, each marked volumeLost when it is Bound to a
    PersistentVolume that no longer exists. `volumes` (the names of existing volumes, e.g.
    the operator's index, looked up by name only) None means "not known": nothing is
    marked."""
    result: dict[str, PvcInfo] = {}
    for claim in claims:
        record = PvcInfo(**claim)
        bound_to = claim.get("volume") or ""
        record["volumeLost"] = bool(
            volumes is not None
            and claim.get("phase") == "Bound"
            and bound_to
            and bound_to not in volumes
        )
        result[str(claim.get("name") or "")] = record
    return result
