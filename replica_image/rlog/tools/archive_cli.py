"""`rlog archive run|status|list|verify` and `rlog restore`: the archive (rlog.archive) from
the command line (docs/backup.md).

    rlog archive run -e H:P --bucket B [--prefix P] [--s3-endpoint URL]   follow the log
    rlog archive run ... --once        archive what the log has learned now, then exit
    rlog archive status [-e H:P] ...   the archived position (and the lag, given -e)
    rlog archive list ...              the segments
    rlog archive verify ...            check the archive end to end (exit 1: each problem)
    rlog restore --bucket B --data-dir DIR [--data-dir DIR ...] [--to-position P]

The S3 credentials are the usual $AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY, or files
(--access-key-file, --secret-key-file: a Kubernetes Secret mounted as files), else the pod's
workload identity (rlog.archive.credentials). `archive run`
may delete with other credentials ($RLOG_ARCHIVE_DELETE_ACCESS_KEY_ID /
$RLOG_ARCHIVE_DELETE_SECRET_ACCESS_KEY, or --delete-access-key-file/--delete-secret-key-file),
so that the writing ones need no right to delete; without them it deletes with the writing
ones. `--json` prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlog.arg_types import add_storage_engine_argument, nonnegative, positive_float
from rlog.tools.client_args import add_security_arguments, credentials_of

if TYPE_CHECKING:  # the archive's modules (and the S3 SDK) load only when a command runs
    from rlog.archive.format import SegmentInfo
    from rlog.archive.store import ObjectStore


def add_store_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument(
        "--s3-endpoint",
        default=env("RLOG_ARCHIVE_ENDPOINT"),
        metavar="URL",
        help="S3 endpoint, e.g. http://127.0.0.1:7070 (default $RLOG_ARCHIVE_ENDPOINT; none: AWS)",
    )
    parser.add_argument(
        "--bucket", default=env("RLOG_ARCHIVE_BUCKET"), help="default $RLOG_ARCHIVE_BUCKET"
    )
    parser.add_argument(
        "--prefix",
        default=env("RLOG_ARCHIVE_PREFIX", ""),
        help="key prefix of the archive in the bucket (default $RLOG_ARCHIVE_PREFIX)",
    )
    parser.add_argument("--region", default=env("AWS_REGION", "us-east-1"))
    parser.add_argument("--access-key-file", metavar="FILE", help="default: $AWS_ACCESS_KEY_ID")
    parser.add_argument("--secret-key-file", metavar="FILE", help="default: $AWS_SECRET_ACCESS_KEY")
    parser.add_argument("--json", action="store_true", help="print JSON")


def add_archive_arguments(
    parser: argparse.ArgumentParser, add_endpoint_arguments: Callable[[Any], None]
) -> None:
    parser.add_argument("action", choices=["run", "status", "list", "verify"], metavar="ACTION")
    add_endpoint_arguments(parser)
    add_store_arguments(parser)
    parser.add_argument(
        "--once", action="store_true", help="run: archive what is learned now, exit"
    )
    parser.add_argument(
        "--segment-bytes",
        type=nonnegative,
        default=8 << 20,
        metavar="N",
        help="run: cut a segment at N bytes of values (default 8 MiB)",
    )
    parser.add_argument(
        "--flush-interval",
        type=positive_float,
        default=10.0,
        metavar="SECONDS",
        help="run: ... or when the oldest unarchived entry is this old (default 10)",
    )
    parser.add_argument(
        "--poll-interval",
        type=positive_float,
        default=0.5,
        metavar="SECONDS",
        help="run: how often to ask the log for news (default 0.5)",
    )
    parser.add_argument(
        "--retention-max-age",
        type=positive_float,
        metavar="SECONDS",
        help="run: delete segments older than this (the newest is always kept)",
    )
    parser.add_argument(
        "--retention-keep-from",
        type=nonnegative,
        metavar="P",
        help="run: delete segments wholly below position P",
    )
    parser.add_argument(
        "--retention-keep-segments",
        type=nonnegative,
        default=1,
        metavar="N",
        help="run: never delete the newest N segments (default 1; at least 1)",
    )
    parser.add_argument(
        "--delete-access-key-file",
        metavar="FILE",
        help="run: delete with this access key (default $RLOG_ARCHIVE_DELETE_ACCESS_KEY_ID; "
        "none: with the writing credentials)",
    )
    parser.add_argument(
        "--delete-secret-key-file",
        metavar="FILE",
        help="run: ... and this secret (default $RLOG_ARCHIVE_DELETE_SECRET_ACCESS_KEY)",
    )
    parser.add_argument(
        "--metrics-port",
        type=nonnegative,
        metavar="PORT",
        help="run: serve GET /metrics on PORT (every interface)",
    )
    parser.add_argument(
        "--control-port",
        type=nonnegative,
        metavar="PORT",
        help="run: take POST /flush on PORT: HTTPS for --flush-subject's certificates with "
        "--ca/--cert/--key, else on 127.0.0.1 only (docs/backup.md)",
    )
    parser.add_argument(
        "--flush-subject",
        action="append",
        metavar="NAME",
        help="run: a certificate name allowed to flush (repeat; default rlog-operator)",
    )
    parser.add_argument(
        "--create-bucket", action="store_true", help="run: create the bucket if it is missing"
    )


def add_restore_arguments(parser: argparse.ArgumentParser) -> None:
    add_store_arguments(parser)
    add_security_arguments(parser)  # for --unless-peers-voting on a TLS log
    parser.add_argument(
        "--data-dir",
        action="append",
        default=[],
        metavar="DIR",
        help="a fresh data dir to restore into (repeat: one per replica of the new log)",
    )
    parser.add_argument(
        "--to-position",
        type=nonnegative,
        metavar="P",
        help="restore up to and including position P (default: all of the archive)",
    )
    add_storage_engine_argument(parser, "each data dir")
    parser.add_argument(
        "--verify-only", action="store_true", help="check every segment, write nothing"
    )
    parser.add_argument(
        "--starting",
        action="store_true",
        help="leave the dirs STARTING, not VOTING (the replicas finish initializing with a permit)",
    )
    parser.add_argument(
        "--unless-peers-voting",
        metavar="H:P[,H:P...]",
        help="do nothing (exit 0) if one of these replicas answers VOTING or RECOVERING: the "
        "log runs, and a lost volume recovers from it instead",
    )
    parser.add_argument(
        "--if-fresh",
        action="store_true",
        help="do nothing (exit 0) when a data dir is not fresh (an init container's re-run)",
    )


def _read_secret(path: str | None, variable: str) -> str | None:
    from rlog.archive.format import ArchiveError

    if path:
        try:
            return Path(path).read_text().strip()
        except OSError as exc:
            raise ArchiveError(f"cannot read {variable} from {path}: {exc.strerror}") from None
    return None


def store_of(args: argparse.Namespace, usage: Callable[[str], Exception]) -> ObjectStore:
    from rlog.archive.store import ObjectStore, StoreConfig

    if not args.bucket:
        raise usage("the following arguments are required: --bucket (or $RLOG_ARCHIVE_BUCKET)")
    return ObjectStore(
        StoreConfig(
            bucket=args.bucket,
            prefix=args.prefix or "",
            endpoint=args.s3_endpoint or None,
            region=args.region,
            access_key=_read_secret(args.access_key_file, "the access key"),
            secret_key=_read_secret(args.secret_key_file, "the secret key"),
        )
    )


ENV_DELETE_ACCESS_KEY = "RLOG_ARCHIVE_DELETE_ACCESS_KEY_ID"
ENV_DELETE_SECRET_KEY = "RLOG_ARCHIVE_DELETE_SECRET_ACCESS_KEY"


def deleter_of(args: argparse.Namespace, usage: Callable[[str], Exception]) -> ObjectStore | None:
    """The store that deletes with the delete credentials; None: none given (the writing
    credentials delete). Half of a pair is refused: it would silently delete as the writer."""
    from rlog.archive.store import ObjectStore, StoreConfig

    access = _read_secret(args.delete_access_key_file, "the delete access key") or (
        os.environ.get(ENV_DELETE_ACCESS_KEY) or None
    )
    secret = _read_secret(args.delete_secret_key_file, "the delete secret key") or (
        os.environ.get(ENV_DELETE_SECRET_KEY) or None
    )
    if access is None and secret is None:
        return None
    if access is None or secret is None:
        raise usage(
            "the delete credentials need both an access key and a secret "
            f"(${ENV_DELETE_ACCESS_KEY} and ${ENV_DELETE_SECRET_KEY}, or --delete-*-file)"
        )
    return ObjectStore(
        StoreConfig(
            bucket=args.bucket,
            prefix=args.prefix or "",
            endpoint=args.s3_endpoint or None,
            region=args.region,
            access_key=access,
            secret_key=secret,
        )
    )


def control_policy_of(args: argparse.Namespace) -> Any:
    """Who may POST /flush (rlog.archive.endpoint.ControlPolicy): with the archiver's own
    certificate, key and the log's CA, callers with a certificate named by --flush-subject;
    without, callers on loopback."""
    from rlog.archive.endpoint import OPERATOR_SUBJECT, ControlPolicy, TlsFiles

    subjects = frozenset(args.flush_subject or [OPERATOR_SUBJECT])
    if args.ca and args.cert and args.key:
        return ControlPolicy(TlsFiles(args.ca, args.cert, args.key), subjects)
    return ControlPolicy(None, subjects)


def _print(args: argparse.Namespace, body: dict[str, Any], text: str) -> None:
    print(json.dumps(body) if args.json else text, flush=True)


def _segment_row(s: SegmentInfo) -> dict[str, Any]:
    return vars(s)


async def _archive(args: argparse.Namespace, endpoint: str | None, usage: Any) -> int:
    from rlog.archive.archiver import Archiver, ArchiverConfig, Retention
    from rlog.archive.restore import read_manifest
    from rlog.client import AsyncClient

    store = store_of(args, usage)
    deleter = deleter_of(args, usage) if args.action == "run" else None
    credentials = credentials_of(args)
    try:
        if args.action == "list":
            manifest = await read_manifest(store)
            if args.json:
                print(
                    json.dumps(
                        {**manifest.summary(), "list": [_segment_row(s) for s in manifest.segments]}
                    )
                )
            else:
                for s in manifest.segments:
                    print(f"{s.first}\t{s.last}\t{s.entries}\t{s.bytes}\t{s.sha256[:16]}\t{s.key}")
            return 0
        if args.action == "verify":
            return await _verify(args, store)
        if args.action == "status":
            manifest = await read_manifest(store)
            body = manifest.summary()
            if endpoint:
                async with AsyncClient(
                    endpoint, timeout=args.timeout, credentials=credentials
                ) as client:
                    status = await client.status()
                archived = -1 if manifest.archived_through is None else manifest.archived_through
                body["log_learned"] = status.learned
                body["lag"] = max(status.learned - archived, 0)
            _print(args, body, "\n".join(f"{k}: {v}" for k, v in body.items()))
            return 0
        if not endpoint:
            raise usage("the following arguments are required: --endpoint")
        if args.create_bucket:
            await store.create_bucket()
        config = ArchiverConfig(
            segment_bytes=args.segment_bytes,
            flush_interval=args.flush_interval,
            poll_interval=args.poll_interval,
            retention=Retention(
                args.retention_max_age, args.retention_keep_from, args.retention_keep_segments
            ),
        )
        async with AsyncClient(endpoint, timeout=args.timeout, credentials=credentials) as client:
            archiver = Archiver(client, store, config, deleter=deleter)
            if args.once:
                manifest = await archiver.archive_now()
                body = manifest.summary()
                _print(args, body, f"archived through {manifest.archived_through}")
                return 0
            from rlog.archive import endpoint as http_endpoint

            if args.metrics_port is not None:
                from rlog.build_info import register_build_info
                from rlog.protocol.peer_version import PROTOCOL

                register_build_info("archiver", PROTOCOL)
                http_endpoint.serve_metrics(args.metrics_port)
            if args.control_port is not None:  # "archive now" (POST /flush)
                http_endpoint.serve_control(
                    archiver, asyncio.get_running_loop(), args.control_port, control_policy_of(args)
                )
            await archiver.open()  # fail fast on a wrong bucket, credentials or log
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            await archiver.run(stop)
            return 0
    finally:
        store.close()
        if deleter is not None:
            deleter.close()


async def _verify(args: argparse.Namespace, store: ObjectStore) -> int:
    from rlog.archive.scrub import scrub

    report = await scrub(store)
    if args.json:
        print(json.dumps(report.to_dict()), flush=True)
    else:
        for problem in report.problems:
            print(f"problem: {problem}", flush=True)
        n = len(report.problems)
        verdict = "sound" if report.sound else f"{n} problem{'' if n == 1 else 's'}"
        print(
            f"{report.where}: {verdict}: {report.checked} of {report.segments} segments "
            f"checked sound, {report.entries} entries, positions {report.begin}.."
            f"{report.archived_through}, {report.unlisted} unlisted segment objects",
            flush=True,
        )
    return 0 if report.sound else 1


def run_archive(args: argparse.Namespace, endpoint: str | None, usage: Any) -> int:
    logging.basicConfig(
        level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s"
    )
    return asyncio.run(_archive(args, endpoint, usage))


async def _restore(args: argparse.Namespace, usage: Any) -> int:
    from rlog.archive.format import ArchiveError
    from rlog.archive.restore import restore, verify

    store = store_of(args, usage)
    try:
        if args.verify_only:
            result = await verify(store, args.to_position)
            _print(
                args,
                {"verified": True, **result.to_dict()},
                f"verified {result.segments} segments, {result.entries} entries, up to "
                f"position {result.to_position}",
            )
            return 0
        if not args.data_dir:
            raise usage("the following arguments are required: --data-dir (or --verify-only)")
        dirs = [Path(d) for d in args.data_dir]
        from rlog.initialize import is_fresh
        from rlog.storage.restoring import RESTORING_NAME, abandon_restore, restoring

        marked = [d for d in dirs if restoring(d)]
        if args.if_fresh and not marked:
            if not all(is_fresh(d, args.storage_engine) for d in dirs):
                _print(args, {"restored": False}, "the data dir is not fresh: nothing restored")
                return 0
        if args.unless_peers_voting:
            running = await _running_peer(args.unless_peers_voting, credentials_of(args))
            if running:
                for d in marked:  # fresh again: the replica recovers from the running log
                    abandon_restore(d)
                _print(
                    args,
                    {"restored": False, "running_peer": running},
                    f"{running} runs the log: nothing restored (this replica recovers from it)",
                )
                return 0
        if args.if_fresh and marked:  # a dir already restored (another one's mark was
            # removed first) is left as it is; the marked and the fresh ones start over
            dirs = [d for d in dirs if d in marked or is_fresh(d, args.storage_engine)]
        for d in marked:
            print(
                f"rlog restore: {d} holds an unfinished restore ({RESTORING_NAME}): "
                "discarding it, starting over",
                file=sys.stderr,
                flush=True,
            )
        from rlog.proto import rlog_pb2 as pb
        from rlog.storage import StorageError

        status = pb.STARTING if args.starting else pb.VOTING
        try:
            result = await restore(
                store, dirs, args.to_position, args.storage_engine, status=status
            )
        except (ArchiveError, StorageError, OSError) as exc:
            unfinished = [str(d) for d in dirs if restoring(d)]
            if not unfinished:
                raise
            why = f"{exc.strerror}: {exc.filename}" if isinstance(exc, OSError) else str(exc)
            raise ArchiveError(
                f"restore failed: {why}; {', '.join(unfinished)} "
                f"{'holds' if len(unfinished) == 1 else 'hold'} an unfinished restore "
                f"(marked {RESTORING_NAME}, never served): run the same rlog restore again "
                "once the cause is fixed, it starts over"
            ) from None
        _print(
            args,
            {"restored": True, **result.to_dict()},
            f"restored positions {result.begin}..{result.to_position}: {result.entries} "
            f"entries from {result.segments} segments into {len(dirs)} data dirs",
        )
        return 0
    finally:
        store.close()


async def _running_peer(peers: str, credentials: Any = None) -> str | None:
    """The first peer that answers VOTING or RECOVERING (its own view, at once), if any. A
    peer that refuses us (unauthenticated, no role) is running: better no restore than one
    beside a live log."""
    from rlog.client import AsyncClient, parse_endpoints
    from rlog.client.errors import PermissionDenied, RlogError
    from rlog.proto import rlog_pb2 as pb

    async with AsyncClient(peers, timeout=2.0, credentials=credentials) as client:
        for peer in parse_endpoints(peers):
            try:
                status = await client.status(peer)
            except PermissionDenied:  # Unauthenticated is one too
                return peer
            except RlogError:
                continue  # unreachable: not (yet) running
            if status.status in (pb.VOTING, pb.RECOVERING):
                return peer
    return None


def run_restore(args: argparse.Namespace, usage: Any) -> int:
    return asyncio.run(_restore(args, usage))
