"""What `kubectl rlog status` and `version` print, as pure functions of what was read: a
table for people, or the same facts as JSON or YAML (`-o`) for scripts."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

COLUMNS = ("REPLICA", "STATE", "ROLE", "BEGIN", "END", "LEARNED", "CATCH-UP", "READY", "REASON")


def status_table(log: Mapping[str, Any]) -> str:
    """A header line (phase, leader, paused) and one row per replica of status.replicas."""
    name = str(log["metadata"]["name"])
    status = log.get("status") or {}
    header = (
        f"{name}: {status.get('phase') or 'not observed yet'}"
        f" (leader {status.get('leader') or 'none'},"
        f" {status.get('votingReplicas', 0)}/{(log.get('spec') or {}).get('replicas', '?')}"
        " VOTING" + (", reconciliation PAUSED" if status.get("paused") else "") + ")"
    )
    archive = status.get("archive")
    if archive:
        header += (
            f"\n  archive: position {archive.get('archivedPosition', '?')},"
            f" lag {archive.get('lag', '?')}"
            + (
                f", last segment {archive['lastSegmentTime']}"
                if archive.get("lastSegmentTime")
                else ""
            )
            + (f" ({archive['message']})" if archive.get("message") else "")
        )
        backup = archive.get("backup")
        if backup:
            header += (
                f"\n  last backup request {backup.get('request')}: {backup.get('state')}"
                + (f", through position {backup['through']}" if "through" in backup else "")
                + (f" ({backup['message']})" if backup.get("message") else "")
            )
    storage = _true_condition(status, "StorageDegraded")
    if storage is not None:
        header += f"\n  storage: {storage.get('reason')}: {storage.get('message')}"
    node_lost = _true_condition(status, "NodeLost")
    if node_lost is not None:
        header += f"\n  node lost: {node_lost.get('message')}"
    rows = [COLUMNS]
    for item in status.get("replicas") or []:
        rows.append(
            (
                str(item.get("name", "")),
                str(item.get("status", "")),
                str(item.get("role", "-")),
                str(item.get("begin", "-")),
                str(item.get("end", "-")),
                str(item.get("learned", "-")),
                str(item.get("catchup") or "-"),
                "yes" if item.get("ready") else "no",
                str(item.get("reason") or ""),
            )
        )
    message = status.get("message")
    return "\n".join([header, *([f"  {message}"] if message else []), "", _aligned(rows)])


def _true_condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The status condition of type `kind` while it is True, else None."""
    return next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == kind and c.get("status") == "True"
        ),
        None,
    )


def _aligned(rows: Sequence[Sequence[str]]) -> str:
    """Rows of cells in columns two spaces apart, as kubectl prints its tables."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    )


# ---- machine-readable output (-o json|yaml) and the list of logs -----------------------------

OUTPUTS = ("json", "yaml")


def status_document(log: Mapping[str, Any]) -> dict[str, Any]:
    """What `status -o json|yaml` prints for one log: its name, namespace, replica count and
    status as the operator wrote it (the table is drawn from the same fields)."""
    meta = log["metadata"]
    return {
        "name": meta["name"],
        "namespace": meta.get("namespace", "default"),
        "replicas": (log.get("spec") or {}).get("replicas"),
        "status": dict(log.get("status") or {}),
    }


def rendered(document: Any, output: str) -> str:
    """`document` as JSON (indented, keys in order written) or YAML (block style)."""
    if output == "json":
        import json

        return json.dumps(document, indent=2)
    import yaml

    return str(yaml.safe_dump(document, sort_keys=False, default_flow_style=False)).rstrip()


LIST_COLUMNS = ("NAMESPACE", "NAME", "PHASE", "LEADER", "VOTING", "ARCHIVE-LAG", "PAUSED")


def logs_table(logs: Sequence[Mapping[str, Any]]) -> str:
    """One row per log (`status` without a NAME, or with -A): where it stands at a glance."""
    rows = [LIST_COLUMNS]
    for log in logs:
        status = log.get("status") or {}
        archive = status.get("archive") or {}
        rows.append(
            (
                str(log["metadata"].get("namespace", "default")),
                str(log["metadata"]["name"]),
                str(status.get("phase") or "-"),
                str(status.get("leader") or "-"),
                f"{status.get('votingReplicas', 0)}/{(log.get('spec') or {}).get('replicas', '?')}",
                str(archive.get("lag", "-")),
                "yes" if status.get("paused") else "no",
            )
        )
    if len(rows) == 1:
        return "no ReplicatedLogs found"
    return _aligned(rows)


# ---- version ------------------------------------------------------------------------------------


def version_document(
    plugin: str,
    peer_protocol: int,
    operator_images: Mapping[str, Sequence[str]] | None,
    replica_images: Mapping[str, Mapping[str, int]],
) -> dict[str, Any]:
    """The builds in use: this plugin's; the operator's by pod (None: not visible with the
    user's rights); each log's replica images with how many pods run each (two during a
    roll)."""
    return {
        "plugin": {"version": plugin, "peerProtocol": peer_protocol},
        "operator": dict(operator_images) if operator_images is not None else None,
        "logs": {log: dict(images) for log, images in replica_images.items()},
    }


def version_text(document: Mapping[str, Any]) -> str:
    plugin = document["plugin"]
    lines = [f"kubectl-rlog {plugin['version']} (peer protocol {plugin['peerProtocol']})"]
    operator = document["operator"]
    if operator is None:
        lines.append("operator: not visible (listing pods across namespaces is forbidden)")
    elif not operator:
        lines.append("operator: no pod labelled app.kubernetes.io/name=rlog-operator found")
    for pod, images in sorted((operator or {}).items()):
        lines.append(f"operator {pod}: {', '.join(images)}")
    for log, images in sorted(document["logs"].items()):
        each = ", ".join(f"{image} x{count}" for image, count in sorted(images.items()))
        lines.append(f"replicas of {log}: {each or 'no pods'}")
    return "\n".join(lines)
