"""The operator's HTTP calls to a log's archiver (spec.backup): `status.archive` from its
metrics, and the flush a backup request (rlog.io/backup, backups.py) asks of it.

The flush goes to the archiver's control port (rlog.archive.endpoint), which takes it from
the operator's identity only: on a TLS log the operator dials the archiver's Service over
HTTPS with its own client certificate (`<log>-tls-operator`, `CN=rlog-operator`), checking
the archiver's certificate against the log's CA and the Service's name. On a plaintext log
the control port listens on the archiver pod's loopback only, so the operator asks nothing:
the request completes at the archiver's next periodic cut (spec.backup.flushIntervalSeconds)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf

from rlog_operator import archive_specs, backups, observed, pki_secrets, specs


def fetch_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2.0) as answer:
        return str(answer.read().decode())


def post(url: str, credentials: Any) -> None:
    """POST over HTTPS with `credentials` (rlog.client.Credentials: the log's CA, the
    operator's certificate and key, as PEM bytes)."""
    import os
    import ssl
    import tempfile
    import urllib.request

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks the chain and the name
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=credentials.ca.decode())
    # The ssl module loads a certificate chain from files only: a private directory, gone
    # once loaded.
    with tempfile.TemporaryDirectory(prefix="rlog-operator-") as private:
        cert, key = os.path.join(private, "tls.crt"), os.path.join(private, "tls.key")
        for path, data in ((cert, credentials.cert), (key, credentials.key)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        context.load_cert_chain(cert, key)
    request = urllib.request.Request(url, method="POST")
    with urllib.request.urlopen(request, timeout=2.0, context=context):
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
        await ask_flush(body, step.through, logger)
    if step.event:
        kind, reason, message = step.event
        kopf.event(body, type=kind, reason=reason, message=message)
    if before != archive:
        patch.status["archive"] = archive


async def ask_flush(body: Mapping[str, Any], through: int, logger: Any) -> None:
    """Ask the archiver to archive through `through` now (repeated each tick until the
    archive covers it). Only on a TLS log, with the operator's certificate (module doc)."""
    if specs.mode_of(body) == specs.MODE_DISABLED:
        return  # the control port is on the archiver's loopback: its periodic cut will do
    credentials = pki_secrets.credentials(body)
    if credentials is None or credentials.cert is None or credentials.ca is None:
        logger.info("backup: the operator's certificate is not there yet; flush next time")
        return
    url = (
        f"https://{archive_specs.archiver_host(body)}:{archive_specs.ARCHIVER_CONTROL_PORT}"
        f"/flush?through={through}"
    )
    try:
        await asyncio.to_thread(post, url, credentials)
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError; a bad PEM a ValueError
        logger.warning("backup: asking the archiver to flush (%s): %s", url, exc)


async def archive_status(body: Mapping[str, Any]) -> dict[str, Any]:
    """`status.archive` from the archiver's metrics (spec.backup), read through its Service."""
    name, namespace = archive_specs.archiver_name(body), specs.namespace_of(body)
    url = f"http://{name}.{namespace}.svc:{archive_specs.ARCHIVER_METRICS_PORT}/metrics"
    try:
        text = await asyncio.to_thread(fetch_text, url)
    except OSError as exc:
        return archive_specs.archive_status(None, f"cannot read {url}: {exc}")
    return archive_specs.archive_status(archive_specs.parse_archive_metrics(text))
