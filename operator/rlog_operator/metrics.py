"""The operator's own Prometheus metrics (the replicas export theirs, rlog_*)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import Counter, Gauge, start_http_server

from rlog_operator import constants as c

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


def serve(port: int) -> None:
    start_http_server(port)
