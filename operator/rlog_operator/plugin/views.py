"""What `kubectl rlog status` prints, as pure functions of the ReplicatedLog read."""

from __future__ import annotations

from collections.abc import Mapping
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
    storage = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "StorageDegraded" and c.get("status") == "True"
        ),
        None,
    )
    if storage is not None:
        header += f"\n  storage: {storage.get('reason')}: {storage.get('message')}"
    node_lost = next(
        (
            c
            for c in status.get("conditions") or []
            if c.get("type") == "NodeLost" and c.get("status") == "True"
        ),
        None,
    )
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
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    message = status.get("message")
    return "\n".join([header, *([f"  {message}"] if message else []), "", *lines])
