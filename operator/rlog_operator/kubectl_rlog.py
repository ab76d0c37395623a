"""`kubectl rlog`: a kubectl plugin over the ReplicatedLog's documented annotations and status.

    kubectl rlog status NAME          the replicas: state, role, positions, catch-up
    kubectl rlog replace-volume NAME ORDINAL   rlog.io/replace-volume on the replica's pod
    kubectl rlog reinitialize NAME    rlog.io/reinitialize=<metadata.uid> (after a data loss)
    kubectl rlog step-down NAME       rlog.io/step-down: the operator steps the leader down
    kubectl rlog pause|resume NAME    rlog.io/paused=true / removed
    kubectl rlog backup NAME [--wait] rlog.io/backup=<time>: archive through the log's
                                      learned position now (status.archive.backup)
    kubectl rlog restore SOURCE NEW [--to-position P] [--dry-run]
                                      a new ReplicatedLog NEW bootstrapped from SOURCE's
                                      archive (spec.bootstrap.fromArchive), up to P
    kubectl rlog certificate NAME --name CLIENT --role read|append|owner [--days N]
                                 [--secret SECRET] [--wait]
    kubectl rlog certificate NAME --revoke CLIENT
                                      a client identity the operator issues into a Secret
                                      (spec.auth.clients), or revokes (docs/security.md)

Installed with the package as the `kubectl-rlog` console script (kubectl finds plugins on the
PATH by that name). Each command is a pure request builder (`Request`: what to patch) and
one generic execution through the kubernetes client; errors are one line on stderr, exit 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlog import __version__
from rlog.arg_types import nonnegative, positive_float
from rlog_operator import archive_specs
from rlog_operator import constants as c

EXIT_ERROR = 1
# The roles a client identity may be issued for (authz.CERTIFICATE_ROLES): never peer, admin.
CLIENT_ROLES = frozenset({"read", "append", "owner"})


class PluginError(Exception):
    """A one-line error for the user."""


class ConflictError(PluginError):
    """The object changed between the plugin's read and its write (HTTP 409, reason
    Conflict: the write carried the resourceVersion read)."""


# A request built from what was read (a list replaced whole) carries the resourceVersion
# read, and any write in between fails it: the operator writes a log's status and
# annotations several times a second while it settles. As client-go's RetryOnConflict does:
# read again, build again, write again, with a growing jittered pause, for this long.
# Rejected: a merge patch without the precondition (it would drop an entry another writer
# added to the list in between).
CONFLICT_SECONDS = 30.0


@dataclass(frozen=True)
class Request:
    """One merge patch: on the ReplicatedLog (kind "ReplicatedLog") or on one of its pods."""

    kind: str  # ReplicatedLog or Pod
    name: str
    patch: dict[str, Any]
    done: str  # what to print once it is applied


# ---- arguments ------------------------------------------------------------------------------


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def build_parser() -> argparse.ArgumentParser:
    """The plugin's arguments (also what `kubectl_complete-rlog` completes)."""
    p = argparse.ArgumentParser(
        prog="kubectl rlog", description="Operate ReplicatedLogs (rlog.io) from kubectl."
    )
    p.add_argument("--version", action="version", version=f"kubectl-rlog {__version__}")
    _add_cluster_options(p)
    # kubectl passes the flags where the user wrote them: after the command too
    common = argparse.ArgumentParser(add_help=False)
    _add_cluster_options(common, suppress=True)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, text in (
        ("status", "the replicas' state, role, positions and catch-up progress"),
        ("reinitialize", "acknowledge a suspected total data loss: initialize the log again"),
        ("step-down", "ask the leader to step down (the operator does it)"),
        ("pause", "pause reconciliation (the status stays current)"),
        ("resume", "resume reconciliation"),
    ):
        sp = sub.add_parser(name, help=text, parents=[common])
        sp.add_argument("name", metavar="NAME", help="the ReplicatedLog")
    sp = sub.add_parser(
        "replace-volume", help="give one replica a fresh volume (it catches up)", parents=[common]
    )
    sp.add_argument("name", metavar="NAME", help="the ReplicatedLog")
    sp.add_argument("ordinal", metavar="ORDINAL", type=_ordinal, help="the replica's ordinal")
    sp = sub.add_parser(
        "backup",
        help="archive the log through its learned position now (it has spec.backup)",
        parents=[common],
    )
    sp.add_argument("name", metavar="NAME", help="the ReplicatedLog")
    sp.add_argument(
        "--wait", action="store_true", help="wait until the archive covers that position"
    )
    sp.add_argument(
        "--timeout",
        type=positive_float,
        default=300.0,
        metavar="SECONDS",
        help="with --wait: give up after this long (default 300)",
    )
    sp = sub.add_parser(
        "restore",
        help="create a new log from another log's archive (spec.bootstrap.fromArchive)",
        parents=[common],
    )
    sp.add_argument("name", metavar="SOURCE", help="the ReplicatedLog whose archive to restore")
    sp.add_argument("new", metavar="NEW", help="the name of the new ReplicatedLog")
    sp.add_argument(
        "--to-position",
        type=nonnegative,
        metavar="P",
        help="restore up to and including position P (default: the whole archive)",
    )
    sp.add_argument(
        "--dry-run", action="store_true", help="print the new ReplicatedLog, create nothing"
    )
    sp = sub.add_parser(
        "certificate",
        help="have the operator issue (or revoke) a client certificate for a role",
        parents=[common],
    )
    sp.add_argument("name", metavar="NAME", help="the ReplicatedLog")
    what = sp.add_mutually_exclusive_group(required=True)
    what.add_argument("--name", dest="client", metavar="CLIENT", help="the certificate's name")
    what.add_argument("--revoke", metavar="CLIENT", help="revoke this identity")
    sp.add_argument("--role", choices=sorted(CLIENT_ROLES), help="the role it gets")
    sp.add_argument("--days", type=int, metavar="N", help="each certificate's validity")
    sp.add_argument("--secret", metavar="SECRET", help="default <log>-client-<CLIENT>")
    sp.add_argument("--wait", action="store_true", help="wait until the Secret is written")
    sp.add_argument("--timeout", type=positive_float, default=120.0, metavar="SECONDS")
    return p


def _add_cluster_options(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    # after the command, an absent flag must not overwrite one given before it
    default = argparse.SUPPRESS if suppress else None
    p.add_argument(
        "-n", "--namespace", default=default, help="the log's namespace (default: the context's)"
    )
    p.add_argument("--context", default=default, help="the kubeconfig context to use")
    p.add_argument("--kubeconfig", default=default, help="path to the kubeconfig file")


def _ordinal(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an ordinal (0, 1, 2, ...)")
    return int(text)


# ---- request builders (pure) -----------------------------------------------------------------


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


# ---- the status table (pure) -----------------------------------------------------------------

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


# ---- I/O --------------------------------------------------------------------------------------


class Cluster:
    """The few calls the plugin makes, through the kubernetes client."""

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        import logging

        from kubernetes import client, config

        # urllib3 would print its retries on stderr: the plugin says one line instead
        logging.getLogger("urllib3").setLevel(logging.CRITICAL)
        try:
            config.load_kube_config(config_file=kubeconfig, context=context)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        except Exception as e:  # no file, no such context, a broken kubeconfig
            raise PluginError(f"no cluster: cannot load the kubeconfig: {e}") from None
        chosen = context or (active or {}).get("name")
        contexts = {ctx["name"]: ctx for ctx in config.list_kube_config_contexts(kubeconfig)[0]}
        self.default_namespace = str(
            ((contexts.get(chosen or "") or {}).get("context") or {}).get("namespace") or "default"
        )
        self.custom = client.CustomObjectsApi()
        self.core = client.CoreV1Api()
        self.api_client = client.ApiClient()

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args)
        except ApiException as e:
            if e.status == 404:
                raise PluginError(f"{what}: not found") from None
            if e.status == 409 and _status_reason(e) == "Conflict":
                raise ConflictError(f"{what}: changed since it was read") from None
            if e.status == 409:
                raise PluginError(f"{what}: already exists") from None
            if e.status == 403:
                raise PluginError(f"{what}: forbidden ({e.reason})") from None
            raise PluginError(f"{what}: HTTP {e.status} {e.reason}") from None
        except Exception as e:  # connection refused, DNS, TLS: the cluster is not there
            raise PluginError(f"no cluster: {what}: {type(e).__name__}: {e}") from None

    def log_names(self, namespace: str, timeout: float) -> list[str]:
        """The ReplicatedLogs of `namespace`, by name (for shell completion)."""
        found = self._call(
            f"ReplicatedLogs in {namespace}",
            lambda: self.custom.list_namespaced_custom_object(
                c.GROUP, c.VERSION, namespace, c.PLURAL, _request_timeout=timeout
            ),
        )
        return sorted(str(item["metadata"]["name"]) for item in found.get("items", []))

    def log(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self._call(
                f"ReplicatedLog {namespace}/{name}",
                self.custom.get_namespaced_custom_object,
                c.GROUP,
                c.VERSION,
                namespace,
                c.PLURAL,
                name,
            )
        except PluginError as e:
            if str(e).endswith("not found"):
                raise PluginError(f"no ReplicatedLog {name!r} in namespace {namespace}") from None
            raise
        return found

    def create(self, namespace: str, body: Mapping[str, Any]) -> None:
        self._call(
            f"ReplicatedLog {namespace}/{body['metadata']['name']}",
            self.custom.create_namespaced_custom_object,
            c.GROUP,
            c.VERSION,
            namespace,
            c.PLURAL,
            dict(body),
        )

    def secret_written(self, namespace: str, name: str) -> bool:
        try:
            found = self._call(
                f"Secret {namespace}/{name}", self.core.read_namespaced_secret, name, namespace
            )
        except PluginError as e:
            if str(e).endswith("not found"):
                return False
            raise
        return bool((found.data or {}).get("tls.crt"))

    def apply(self, namespace: str, request: Request) -> None:
        what = f"{request.kind} {namespace}/{request.name}"
        if request.kind == "Pod":
            self._call(what, self.core.patch_namespaced_pod, request.name, namespace, request.patch)
        else:
            self._call(
                what,
                self.custom.patch_namespaced_custom_object,
                c.GROUP,
                c.VERSION,
                namespace,
                c.PLURAL,
                request.name,
                request.patch,
            )


def _status_reason(e: Any) -> str:
    """The reason of a Kubernetes Status body ("Conflict", "AlreadyExists", ...); both are
    HTTP 409."""
    import json

    try:
        body = json.loads(e.body or "{}")
    except (TypeError, ValueError):
        return ""
    return str(body.get("reason") or "") if isinstance(body, dict) else ""


def apply_fresh(
    cluster: Cluster,
    namespace: str,
    name: str,
    build: Callable[[Mapping[str, Any]], Request],
    log: Mapping[str, Any] | None = None,
) -> tuple[Request, int]:
    """`build` a request from the log (`log` as read already, else read now) and apply it;
    on a conflict read the log again and build again (`CONFLICT_SECONDS`). Returns the
    request applied and the number of attempts it took."""
    import random
    import time

    deadline = time.monotonic() + CONFLICT_SECONDS
    attempts, pause = 0, 0.05
    while True:
        current = log if log is not None else cluster.log(namespace, name)
        request = build(current)
        attempts += 1
        try:
            cluster.apply(namespace, request)
            return request, attempts
        except ConflictError as e:
            if time.monotonic() + pause > deadline:
                raise PluginError(
                    f"{e}, {attempts} times in {CONFLICT_SECONDS:g}s: another writer keeps "
                    "changing it; try again"
                ) from None
        time.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(pause * 2, 1.0)
        log = None


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def request_for(args: argparse.Namespace, log: Mapping[str, Any], now: str) -> Request:
    """The request of a command other than status."""
    if args.command == "replace-volume":
        return replace_volume_request(log, args.ordinal, now)
    if args.command == "reinitialize":
        return reinitialize_request(log)
    if args.command == "step-down":
        return step_down_request(log, now)
    if args.command in ("pause", "resume"):
        return pause_request(log, args.command == "pause")
    if args.command == "backup":
        return backup_request(log, now)
    if args.command == "certificate":
        return certificate_request(
            log, args.client or args.revoke, args.role, args.days, args.secret, bool(args.revoke)
        )
    raise PluginError(f"unknown command {args.command!r}")


def run(args: argparse.Namespace) -> str:
    cluster = Cluster(args.kubeconfig, args.context)
    namespace = args.namespace or cluster.default_namespace
    log = cluster.log(namespace, args.name)
    if args.command == "status":
        return status_table(log)
    if args.command == "restore":
        manifest = restore_manifest(log, args.new, args.to_position)
        manifest["metadata"]["namespace"] = namespace
        if args.dry_run:
            import json

            return json.dumps(manifest, indent=2)
        cluster.create(namespace, manifest)
        where = f"up to position {args.to_position}" if args.to_position is not None else "whole"
        return f"{args.new}: created, restoring {args.name}'s archive ({where})"
    # a backup's request id is its time, precise enough that two requests differ
    now = (
        _now()
        if args.command != "backup"
        else dt.datetime.now(dt.UTC).isoformat(timespec="milliseconds")
    )
    request, _ = apply_fresh(
        cluster, namespace, args.name, lambda current: request_for(args, current, now), log
    )
    if args.command == "backup" and args.wait:
        return _wait_for_backup(cluster, namespace, args.name, now, args.timeout)
    if args.command == "certificate" and args.wait and args.client:
        secret = args.secret or f"{args.name}-client-{args.client}"
        _wait_for_secret(cluster, namespace, secret, args.timeout)
        return f"{request.done}: written"
    return request.done


def _wait_for_secret(cluster: Cluster, namespace: str, name: str, timeout: float) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cluster.secret_written(namespace, name):
        if time.monotonic() > deadline:
            raise PluginError(
                f"Secret {name} not written after {timeout:g}s (the operator's events on "
                "the ReplicatedLog say why)"
            )
        time.sleep(1.0)


def _wait_for_backup(
    cluster: Cluster, namespace: str, name: str, request: str, timeout: float
) -> str:
    import time

    deadline = time.monotonic() + timeout
    while True:
        done = backup_outcome(cluster.log(namespace, name), request)
        if done is not None:
            return done
        if time.monotonic() > deadline:
            raise PluginError(
                f"{name}: backup {request} not completed after {timeout:g}s "
                f"(`kubectl rlog status {name}` says why)"
            )
        time.sleep(1.0)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        print(run(args))
    except PluginError as e:
        print(f"kubectl rlog: {e}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
