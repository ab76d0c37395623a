"""`kubectl rlog`'s arguments and commands, over the ReplicatedLog's documented annotations
and status.

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
PATH by that name). Each command is a pure request builder (`patches.py`: what to patch) and
one generic execution through the kubernetes client (`cluster.py`); errors are one line on
stderr, exit 1.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from rlog import __version__
from rlog.arg_types import nonnegative, positive_float
from rlog_operator.plugin.cluster import Cluster, apply_fresh
from rlog_operator.plugin.patches import (
    CLIENT_ROLES,
    PluginError,
    Request,
    backup_outcome,
    backup_request,
    certificate_request,
    pause_request,
    reinitialize_request,
    replace_volume_request,
    restore_manifest,
    step_down_request,
)
from rlog_operator.plugin.report import replica_logs, version, write_report
from rlog_operator.plugin.views import (
    OUTPUTS,
    logs_table,
    rendered,
    status_document,
    status_table,
)

EXIT_ERROR = 1


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
    sp = sub.add_parser(
        "status",
        help="the replicas' state, role, positions and catch-up progress; without NAME, "
        "every log of the namespace (-A: of every namespace)",
        parents=[common],
    )
    sp.add_argument("name", metavar="NAME", nargs="?", help="the ReplicatedLog")
    sp.add_argument(
        "-A", "--all-namespaces", action="store_true", help="every namespace's logs (no NAME)"
    )
    _add_output(sp)
    sp = sub.add_parser(
        "version", help="this plugin's build, the operator's and each log's", parents=[common]
    )
    sp.add_argument(
        "-A", "--all-namespaces", action="store_true", help="the logs of every namespace"
    )
    _add_output(sp)
    sp = sub.add_parser(
        "logs",
        help="every replica's log, each line prefixed with its pod (oldest pod first)",
        parents=[common],
    )
    sp.add_argument("name", metavar="NAME", help="the ReplicatedLog")
    sp.add_argument("--since", type=_seconds, metavar="SECONDS", help="only this recent")
    sp.add_argument("--tail", type=nonnegative, metavar="N", help="the last N lines of each")
    sp.add_argument(
        "-p", "--previous", action="store_true", help="the previous container's (after a crash)"
    )
    sp = sub.add_parser(
        "report",
        help="a support bundle (.tar.gz): the log, its objects, events, every replica's and "
        "the operator's logs, versions",
        parents=[common],
    )
    sp.add_argument("name", metavar="NAME", help="the ReplicatedLog")
    sp.add_argument(
        "-f", "--file", metavar="FILE", help="where to write it (default NAME-report-<time>.tar.gz)"
    )
    for name, text in (
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


def _add_output(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "-o", "--output", choices=OUTPUTS, help="json or yaml instead of a table (for scripts)"
    )


def _seconds(text: str) -> int:
    if not text.isdigit() or int(text) == 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (1, 2, ...)")
    return int(text)


def _ordinal(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not an ordinal (0, 1, 2, ...)")
    return int(text)


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
    if args.command in ("status", "version") and args.all_namespaces and args.namespace:
        raise PluginError("-A and -n exclude each other: every namespace, or this one")
    if args.command == "status" and args.all_namespaces and args.name:
        raise PluginError("-A lists every namespace's logs: it takes no NAME")
    cluster = Cluster(args.kubeconfig, args.context)
    namespace = args.namespace or cluster.default_namespace
    if args.command == "version":
        return version(cluster, None if args.all_namespaces else namespace, args.output)
    if args.command == "status" and not args.name:
        logs = cluster.logs(None if args.all_namespaces else namespace)
        if args.output:
            return rendered({"items": [status_document(log) for log in logs]}, args.output)
        return logs_table(logs)
    log = cluster.log(namespace, args.name)
    if args.command == "status":
        return rendered(status_document(log), args.output) if args.output else status_table(log)
    if args.command == "logs":
        return replica_logs(cluster, namespace, args.name, args.since, args.tail, args.previous)
    if args.command == "report":
        return write_report(cluster, namespace, log, args.file)
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
