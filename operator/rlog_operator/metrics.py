"""The operator's own Prometheus metrics (the replicas export theirs, rlog_*)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, start_http_server

from rlog.build_info import register_build_info
from rlog.protocol.peer_version import PROTOCOL
from rlog_operator import constants as c

BUILD = register_build_info("operator", PROTOCOL)

RECONCILES = Counter(
    "rlog_operator_reconciles_total", "Handler runs of the rlog operator", ["handler"]
)
ERRORS = Counter("rlog_operator_errors_total", "Failed handler steps", ["handler"])
ROLLING_ACTIONS = Counter(
    "rlog_operator_rolling_actions_total", "Rolling replacement actions taken", ["action"]
)
CHILDREN_MENDED = Counter(
    "rlog_operator_children_mended_total",
    "Owned objects (Services, PodDisruptionBudget, NetworkPolicy, archiver) found deleted and "
    "created again (action=recreate), or no longer in the spec and deleted (action=delete)",
    ["kind", "action"],
)
REPLICAS = Gauge(
    "rlog_operator_replicas",
    "Replicas of a ReplicatedLog by status (as last observed)",
    ["namespace", "name", "status"],
)
PHASE = Gauge(
    "rlog_operator_log_phase",
    "1 for the current phase of a ReplicatedLog",
    ["namespace", "name", "phase"],
)
STORAGE = Gauge(
    "rlog_operator_replica_storage_condition",
    "1 for a replica's storage trouble as the operator last observed it (status.replicas[]."
    "storage: the replica's own storage condition, or restore-failed when its restore init "
    "container failed)",
    ["namespace", "name", "pod", "condition"],
)
CRASH_LOOPING = Gauge(
    "rlog_operator_replica_crash_looping",
    "1 while a replica's container crash-loops (status.replicas[].crashLoop says how it ended), "
    "0 otherwise",
    ["namespace", "name", "pod"],
)
ON_LOST_NODES = Gauge(
    "rlog_operator_replicas_on_lost_nodes",
    "Replicas of a ReplicatedLog whose pod is on a node that is not Ready or gone (status."
    "replicas[].nodeLost; the NodeLost condition says what to do)",
    ["namespace", "name"],
)
# the (pod, condition) series set per log, so that a cleared one is dropped
_STORAGE_SERIES: dict[tuple[str, str], set[tuple[str, str]]] = {}
_CRASH_SERIES: dict[tuple[str, str], set[str]] = {}

PHASES = (
    "Pending",
    "Initializing",
    "Ready",
    "Recovering",
    "Degraded",
    "RollingUpdate",
    "DataLoss",
    "Failed",
)
STATUSES = (c.EMPTY, c.STARTING, c.RECOVERING, c.VOTING, "Unknown")


def observe_status(namespace: str, name: str, status: Mapping[str, Any]) -> None:
    counts = dict.fromkeys(STATUSES, 0)
    for item in status.get("replicas") or []:
        key = str(item.get("status") or "Unknown")
        counts[key if key in counts else "Unknown"] += 1
    for key, n in counts.items():
        REPLICAS.labels(namespace, name, key).set(n)
    phase = str(status.get("phase") or "")
    for p in PHASES:
        PHASE.labels(namespace, name, p).set(1 if phase.startswith(p) else 0)
    _observe_health(namespace, name, status.get("replicas") or [])
    lost = sum(1 for item in status.get("replicas") or [] if item.get("nodeLost"))
    ON_LOST_NODES.labels(namespace, name).set(lost)


def _observe_health(namespace: str, name: str, items: list[Mapping[str, Any]]) -> None:
    """The storage trouble and crash-loop series of a log's replicas (status.replicas): a
    storage series only while there is trouble, a crash-loop series for every replica."""
    storage = {(str(i.get("name")), str(i["storage"])) for i in items if i.get("storage")}
    pods = {str(i.get("name")): bool(i.get("crashLoop")) for i in items}
    for pod, condition in _STORAGE_SERIES.get((namespace, name), set()) - storage:
        STORAGE.remove(namespace, name, pod, condition)
    for pod, condition in storage:
        STORAGE.labels(namespace, name, pod, condition).set(1)
    for pod in _CRASH_SERIES.get((namespace, name), set()) - set(pods):
        CRASH_LOOPING.remove(namespace, name, pod)
    for pod, crashing in pods.items():
        CRASH_LOOPING.labels(namespace, name, pod).set(1 if crashing else 0)
    _STORAGE_SERIES[(namespace, name)] = storage
    _CRASH_SERIES[(namespace, name)] = set(pods)


def forget(namespace: str, name: str) -> None:
    """Drop a deleted log's series (else its last phase, e.g. DataLoss, keeps alerting)."""
    for key in STATUSES:
        try:
            REPLICAS.remove(namespace, name, key)
        except KeyError:
            pass
    for p in PHASES:
        try:
            PHASE.remove(namespace, name, p)
        except KeyError:
            pass
    try:
        ON_LOST_NODES.remove(namespace, name)
    except KeyError:
        pass
    _observe_health(namespace, name, [])
    _STORAGE_SERIES.pop((namespace, name), None)
    _CRASH_SERIES.pop((namespace, name), None)


def serve(port: int) -> None:
    start_http_server(port)
