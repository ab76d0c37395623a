"""What each `kubectl rlog` command asks of the cluster, as pure functions of the
ReplicatedLog read: a merge patch on the log or one of its pods (`Request`), or a new log's
manifest (`restore_manifest`). Each refuses, with a one-line `PluginError`, what the
operator would refuse or what would do nothing."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlog_operator import archive_specs
from rlog_operator import constants as c

# The roles a client identity may be issued for (authz.CERTIFICATE_ROLES): never peer, admin.
CLIENT_ROLES = frozenset({"read", "append", "owner"})


class PluginError(Exception):
    """A one-line error for the user."""


class ConflictError(PluginError):
    """The object changed between the plugin's read and its write (HTTP 409, reason
    Conflict: the write carried the resourceVersion read)."""


@dataclass(frozen=True)
class Request:
    """One merge patch: on the ReplicatedLog (kind "ReplicatedLog") or on one of its pods."""

    kind: str  # ReplicatedLog or Pod
    name: str
    patch: dict[str, Any]
    done: str  # what to print once it is applied


def _annotate(value: str | None, key: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {key: value}}}


def replace_volume_request(log: Mapping[str, Any], ordinal: int, now: str) -> Request:
    """Annotate the replica's pod: the operator replaces its claim and pod, quorum-gated."""
    name = str(log["metadata"]["name"])
    replicas = int((log.get("spec") or {}).get("replicas") or c.DEFAULT_REPLICAS)
    if not 0 <= ordinal < replicas:
        raise PluginError(
            f"ordinal {ordinal} is out of range: {name} has {replicas} replicas "
            f"(ordinals 0..{replicas - 1})"
        )
    pod = f"{name}-{ordinal}"
    return Request(
        "Pod",
        pod,
        _annotate(now, c.ANNOTATION_REPLACE_VOLUME),
        f"{pod}: volume replacement requested ({c.ANNOTATION_REPLACE_VOLUME})",
    )


def reinitialize_request(log: Mapping[str, Any]) -> Request:
    name, uid = str(log["metadata"]["name"]), str(log["metadata"].get("uid") or "")
    phase = (log.get("status") or {}).get("phase")
    if phase != "DataLoss":
        raise PluginError(
            f"{name} is {phase or 'not observed yet'}, not DataLoss: reinitialize only "
            "acknowledges a suspected total data loss"
        )
    return Request(
        "ReplicatedLog",
        name,
        _annotate(uid, c.ANNOTATION_REINITIALIZE),
        f"{name}: re-initialization acknowledged ({c.ANNOTATION_REINITIALIZE}={uid})",
    )


def step_down_request(log: Mapping[str, Any], now: str) -> Request:
    name = str(log["metadata"]["name"])
    leader = (log.get("status") or {}).get("leader")
    if not leader:
        raise PluginError(f"{name} has no leader to step down (status.leader is empty)")
    return Request(
        "ReplicatedLog",
        name,
        _annotate(now, c.ANNOTATION_STEP_DOWN),
        f"{name}: step-down of {leader} requested ({c.ANNOTATION_STEP_DOWN})",
    )


def pause_request(log: Mapping[str, Any], pause: bool) -> Request:
    name = str(log["metadata"]["name"])
    return Request(
        "ReplicatedLog",
        name,
        _annotate("true" if pause else None, c.ANNOTATION_PAUSED),
        f"{name}: {'paused' if pause else 'resumed'} ({c.ANNOTATION_PAUSED})",
    )


def backup_request(log: Mapping[str, Any], now: str) -> Request:
    """Annotate the log with a new request id (the time): the operator has its archiver
    archive through the leader's learned position (backups.py)."""
    name = str(log["metadata"]["name"])
    if not (log.get("spec") or {}).get("backup"):
        raise PluginError(
            f"{name} has no spec.backup: nothing archives it (add spec.backup first, "
            "docs/backup.md)"
        )
    return Request(
        "ReplicatedLog",
        name,
        _annotate(now, c.ANNOTATION_BACKUP),
        f"{name}: backup requested ({c.ANNOTATION_BACKUP}={now}); "
        f"`kubectl rlog status {name}` shows its progress",
    )


def backup_outcome(log: Mapping[str, Any], request: str) -> str | None:
    """The line to print once request `request` is answered in status.archive.backup;
    None while it is not (yet). PluginError if it was refused."""
    name = str(log["metadata"]["name"])
    backup = ((log.get("status") or {}).get("archive") or {}).get("backup") or {}
    if backup.get("request") != request:
        return None
    if backup.get("state") == "Refused":
        raise PluginError(f"{name}: backup refused: {backup.get('message', '')}")
    if backup.get("state") != "Completed":
        return None
    return (
        f"{name}: the archive covers the log through position "
        f"{backup.get('archivedPosition')} (asked: {backup.get('through')})"
    )


def certificate_request(
    log: Mapping[str, Any],
    client: str,
    role: str | None,
    days: int | None = None,
    secret: str | None = None,
    revoke: bool = False,
) -> Request:
    """Add (or change) `client` in spec.auth.clients, or remove it (`revoke`): the operator
    issues the certificate into its Secret, or revokes it. The list is replaced whole, so the
    patch carries the resourceVersion read: a concurrent change fails it, and the plugin
    reads and builds again (`apply_fresh`)."""
    name = str(log["metadata"]["name"])
    auth = (log.get("spec") or {}).get("auth") or {}
    clients = [dict(e) for e in auth.get("clients") or []]
    others = [e for e in clients if e.get("name") != client]
    if revoke:
        if len(others) == len(clients):
            raise PluginError(f"{name} has no client identity {client!r} (spec.auth.clients)")
        entries, done = others, f"{name}: client identity {client} revoked"
    else:
        if role not in CLIENT_ROLES:
            raise PluginError(f"--role must be one of {', '.join(sorted(CLIENT_ROLES))}")
        entry: dict[str, Any] = {"name": client, "role": role}
        if days is not None:
            entry["days"] = days
        if secret:
            entry["secretName"] = secret
        entries = [*others, entry]
        done = (
            f"{name}: certificate {client} (role {role}) requested: the operator writes "
            f"Secret {secret or f'{name}-client-{client}'} (tls.crt, tls.key, ca.crt)"
        )
    version = str(log["metadata"].get("resourceVersion") or "")
    patch: dict[str, Any] = {"spec": {"auth": {"clients": entries}}}
    if version:
        patch["metadata"] = {"resourceVersion": version}
    return Request("ReplicatedLog", name, patch, done)


# Copied from the source log to the restored one: its shape, not its identity or history.
RESTORE_COPIED = (
    "replicas",
    "storage",
    "image",
    "imagePullPolicy",
    "resources",
    "autoInitialize",
    "catchUpRate",
)


def restore_manifest(
    source: Mapping[str, Any], new_name: str, to_position: int | None
) -> dict[str, Any]:
    """A new ReplicatedLog that bootstraps from `source`'s archive (its spec.backup), with
    the source's shape (`RESTORE_COPIED`); not archiving itself until told to."""
    meta = source["metadata"]
    backup = (source.get("spec") or {}).get("backup")
    if not backup:
        raise PluginError(f"{meta['name']} has no spec.backup: it has no archive to restore")
    if new_name == meta["name"]:
        raise PluginError("the new log needs a name of its own (the source keeps running)")
    archive: dict[str, Any] = {
        "bucket": backup["bucket"],
        "prefix": backup.get("prefix") or archive_specs.default_prefix(source),
        "credentialsSecret": backup["credentialsSecret"],
    }
    for key in ("endpoint", "region"):
        if backup.get(key):
            archive[key] = backup[key]
    if to_position is not None:
        archive["toPosition"] = to_position
    spec = {k: v for k, v in (source.get("spec") or {}).items() if k in RESTORE_COPIED}
    return {
        "apiVersion": f"{c.GROUP}/{c.VERSION}",
        "kind": "ReplicatedLog",
        "metadata": {"name": new_name, "namespace": meta.get("namespace", "default")},
        "spec": {**spec, "bootstrap": {"fromArchive": archive}},
    }
