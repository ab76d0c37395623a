"""The operator's HTTP calls to a log's archiver (spec.backup): `status.archive` from its
metrics, and the flush a backup request (rlog.io/backup, backups.py) asks of it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf

from rlog_operator import archive_specs, backups, observed, specs


def fetch_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2.0) as answer:
        return str(answer.read().decode())


def post(url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=2.0):
        pass


async def observe_archive(
    body: kopf.Body,
    previous: Mapping[str, Any],
    statuses: Mapping[str, observed.ReplicaStatus | None],
    status: Mapping[str, Any],
    now: str,
    patch: kopf.Patch,
    logger: Any,
) -> None:
    """status.archive from the archiver's metrics, and the next step of a backup request
    (rlog.io/backup, backups.py): a flush asked of the archiver, its completion reported."""
    before = dict(previous.get("archive") or {})
    archive = await archive_status(body) if (body.get("spec") or {}).get("backup") else {}
    leader = str(status.get("leader") or "")
    answer = statuses.get(leader) if leader else None
    learned = int(answer["learned"]) if answer and "learned" in answer else None
    position = archive.get("archivedPosition")
    step = backups.backup_step(body, learned, position, before.get("backup"), now)
    backup = step.backup if step.backup is not None else before.get("backup")
    if backup:
        archive["backup"] = dict(backup)
    if step.kind == "flush":
        name, namespace = archive_specs.archiver_name(body), specs.namespace_of(body)
        url = (
            f"http://{name}.{namespace}.svc:{archive_specs.ARCHIVER_METRICS_PORT}"
            f"/flush?through={step.through}"
        )
        try:  # repeated each tick until the archive covers the position
            await asyncio.to_thread(post, url)
        except OSError as exc:
            logger.warning("backup: asking the archiver to flush (%s): %s", url, exc)
    if step.event:
        kind, reason, message = step.event
        kopf.event(body, type=kind, reason=reason, message=message)
    if before != archive:
        patch.status["archive"] = archive


async def archive_status(body: Mapping[str, Any]) -> dict[str, Any]:
    """`status.archive` from the archiver's metrics (spec.backup), read through its Service."""
    name, namespace = archive_specs.archiver_name(body), specs.namespace_of(body)
    url = f"http://{name}.{namespace}.svc:{archive_specs.ARCHIVER_METRICS_PORT}/metrics"
    try:
        text = await asyncio.to_thread(fetch_text, url)
    except OSError as exc:
        return archive_specs.archive_status(None, f"cannot read {url}: {exc}")
    return archive_specs.archive_status(archive_specs.parse_archive_metrics(text))
