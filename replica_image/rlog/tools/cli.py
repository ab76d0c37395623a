"""The `rlog` command line (docs/design.md, "The command line", lists every subcommand).

Every failure is one line on stderr, `rlog: error: ...`, and no traceback (set RLOG_DEBUG=1
for one). Exit codes: 0 ok, 1 runtime error, 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import argparse
import base64
import faulthandler
import json
import logging
import os
import socket
import sys
import traceback
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

# gRPC core prints its own multi-line errors to stderr (e.g. on connection failures); the
# client commands report every error in one line themselves. Must precede `import grpc`.
# A replica keeps gRPC's default logging (it goes to its log).
if "replica" not in sys.argv[1:2] and "GRPC_VERBOSITY" not in os.environ:
    os.environ["GRPC_VERBOSITY"] = "NONE"
    os.environ["RLOG_QUIETED_GRPC"] = "1"

from rlog import __version__, log_format
from rlog.arg_types import (
    add_storage_engine_argument,
    nonnegative,
    positive_float,
)
from rlog.client.errors import RlogError
from rlog.config import (
    ConfigError,
    ReplicaConfig,
    parse_peers,
)
from rlog.initialize import initialize
from rlog.protocol.peer_version import PROTOCOL as PEER_PROTOCOL
from rlog.storage import StorageError
from rlog.tools.client_args import add_security_arguments, credentials_of
from rlog.tools.replica_cli import BUDGET_KEYS

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130

# Values sent per Append request by `rlog append --stdin` (positions stay in input order).
STDIN_BATCH_VALUES = 1000
STDIN_BATCH_BYTES = 8 * 1024 * 1024
STDIN_MAX_LINE = 64 * 1024 * 1024  # a longer line cannot be sent in one gRPC message anyway


class UsageError(Exception):
    """A bad command line: exit 2."""

    def __init__(self, message: str, prog: str = "rlog") -> None:
        super().__init__(message)
        self.prog = prog


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (no usage dump, no SystemExit)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.prog)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--endpoint",
        "-e",
        default=os.environ.get("RLOG_ENDPOINT"),
        metavar="H:P[,H:P...]",
        help="replica(s) to talk to; any replica serves any request (default $RLOG_ENDPOINT)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_float,
        default=30.0,
        metavar="SECONDS",
        help="deadline of each call (default 30)",
    )
    add_security_arguments(parser)


def _endpoint(args: argparse.Namespace) -> str:
    if not args.endpoint:
        raise UsageError("the following arguments are required: --endpoint", args.prog)
    return str(args.endpoint)


def _client(args: argparse.Namespace) -> Any:
    from rlog.client import Client

    return Client(
        _endpoint(args),
        timeout=args.timeout,
        append_timeout=max(args.timeout, 1.0),
        read_timeout=args.timeout if args.command == "read" else None,
        credentials=credentials_of(args),
    )


# ---- commands ----------------------------------------------------------------------------


def cmd_replica(args: argparse.Namespace) -> int:
    # A fatal signal (SIGBUS from a mapped file cut short, SIGSEGV in a C extension) kills
    # the process before Python can say anything: print where it was, in the replica's log.
    faulthandler.enable()
    config = ReplicaConfig(
        id=args.id,
        peers=parse_peers(args.peers),
        data_dir=Path(args.data_dir),
        listen=args.listen or "",
        auto_initialize=args.auto_initialize,
        metrics_port=args.metrics_port,
        health_port=args.health_port,
        log_id=args.log_id,
        min_peer_protocol=args.min_peer_protocol,
        max_entry_size=args.max_entry_size,
        storage_engine=args.storage_engine,
        election_timeout=args.election_timeout,
        max_message_size=args.max_message_size,
        max_concurrent_streams=args.max_concurrent_streams,
        max_concurrent_rpcs=args.max_concurrent_rpcs,
        max_tail_readers=args.max_tail_readers,
        tail_response_bytes=args.tail_response_bytes,
        **{key: getattr(args, key) for key in BUDGET_KEYS},
        stream_window=args.stream_window,
        min_free_bytes=args.min_free_bytes,
        catchup_rate=args.catchup_rate,
        tls_cert=_path(args.tls_cert),
        tls_key=_path(args.tls_key),
        tls_client_ca=_path(args.tls_client_ca),
        tls_peer_ca=_path(args.tls_peer_ca),
        auth_config=_path(args.auth_config),
        auth_peer_token_file=_path(args.auth_peer_token_file),
        insecure=args.insecure,
        admin_from_anywhere=args.admin_from_anywhere,
        **{
            key: getattr(args, key)
            for key in (
                "heartbeat_interval",
                "append_timeout",
                "session_window",
                "drain_timeout",
                "write_lane_offset",
            )
            if getattr(args, key) is not None
        },
    )
    _check_listen(config.listen)
    try:
        log_format.configure(logging.INFO, args.log_format)
    except ValueError as exc:  # RLOG_LOG_FORMAT, the default argparse does not check
        raise RlogError(f"{exc} (--log-format or {log_format.ENV})") from None
    try:
        from rlog.runtime.process import serve
    except ImportError as exc:
        raise RlogError(f"the replica server is not available: {exc}") from None
    try:
        serve(config)
    except ConfigError as exc:  # e.g. the port is in use: a runtime error, not usage
        raise RlogError(str(exc)) from None
    return EXIT_OK


def _path(text: str | None) -> Path | None:
    return Path(text) if text else None


def _check_listen(address: str) -> None:
    """Fail in one line if the listen address is taken (gRPC's own bind error is verbose)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        infos = socket.getaddrinfo(host or None, int(port), type=socket.SOCK_STREAM)
    except (OSError, ValueError):
        return  # let the server report it
    for family, kind, proto, _, sockaddr in infos[:1]:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(sockaddr)
            except OSError as exc:
                raise RlogError(f"cannot listen on {address}: {exc.strerror or exc}") from None


def _stdin_values(binary: bool) -> Iterator[bytes]:
    number = 0
    while True:
        line = sys.stdin.buffer.readline(STDIN_MAX_LINE + 1)
        if not line:
            return
        number += 1
        if len(line) > STDIN_MAX_LINE:
            raise RlogError(f"input line {number} is longer than {STDIN_MAX_LINE} bytes")
        if line.endswith(b"\n"):
            line = line[:-1]
        yield _decode_b64(line) if binary else line


def _decode_b64(text: bytes | str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except ValueError:
        raise UsageError(f"value {_one_line(str(text))[:40]!r} is not valid base64") from None


def cmd_append(args: argparse.Namespace) -> int:
    if args.stdin and args.values:
        raise UsageError("give values as arguments or --stdin, not both", args.prog)
    if not args.stdin and not args.values:
        raise UsageError("nothing to append: give VALUE... or --stdin", args.prog)
    _endpoint(args)
    if args.stdin:
        values: Iterator[bytes] = _stdin_values(args.base64)
    else:
        values = iter(
            [
                _decode_b64(v) if args.base64 else v.encode("utf-8", "surrogateescape")
                for v in args.values
            ]
        )
    from rlog.client import batched

    # With --if-next the values go in one call: the condition holds for all or none.
    batches = (
        iter([list(values)])
        if args.if_next is not None
        else batched(values, STDIN_BATCH_VALUES, STDIN_BATCH_BYTES)
    )
    with _client(args) as client:
        for batch in batches:
            positions = client.append(batch, if_next=args.if_next, epoch=args.epoch)
            sys.stdout.write("".join(f"{p}\n" for p in positions))
            sys.stdout.flush()
    return EXIT_OK


def cmd_epoch(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(client.take_epoch())
    return EXIT_OK


def _print_entries(entries: Iterator[Any], as_json: bool) -> None:
    out = sys.stdout
    for entry in entries:
        if as_json:
            value = base64.b64encode(entry.value).decode("ascii")
            out.write(f'{{"position": {entry.position}, "value": "{value}"}}\n')
        else:
            text = entry.value.decode("utf-8", errors="backslashreplace")
            out.write(f"{entry.position}\t{text}\n")
    out.flush()


def cmd_read(args: argparse.Namespace) -> int:
    if args.from_ is not None and args.to is not None and args.from_ > args.to:
        raise UsageError(f"--from {args.from_} is after --to {args.to}", args.prog)
    with _client(args) as client:
        entries = client.read(args.from_, args.to, stale=args.stale, min_position=args.min_position)
        _print_entries(entries, args.json)
    return EXIT_OK


def cmd_tail(args: argparse.Namespace) -> int:
    with _client(args) as client:
        _print_entries(_flushing(client.tail(args.from_, stale=args.stale)), args.json)
    return EXIT_OK


def _flushing(entries: Iterator[Any]) -> Iterator[Any]:
    for entry in entries:
        yield entry
        sys.stdout.flush()


def print_status(status: Mapping[str, Any]) -> None:
    width = max(len(key) for key in status) + 2
    for key, value in status.items():
        if value is None:
            value = "-"
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        print(f"{key + ':':<{width}}{value}")


def cmd_status(args: argparse.Namespace) -> int:
    from rlog.client import status_to_dict

    with _client(args) as client:
        if args.all:
            failed = False
            for endpoint, result in client.statuses().items():
                if isinstance(result, RlogError):
                    failed = True
                    row: dict[str, Any] = {"endpoint": endpoint, "error": str(result)}
                else:
                    row = {"endpoint": endpoint, **status_to_dict(result)}
                if args.json:
                    print(json.dumps(row))
                else:
                    print_status(row)
                    print()
            return EXIT_ERROR if failed else EXIT_OK
        status = status_to_dict(client.status())
    if args.json:
        print(json.dumps(status))
    else:
        print_status(status)
    return EXIT_OK


def cmd_truncate(args: argparse.Namespace) -> int:
    with _client(args) as client:
        print(client.truncate(args.to))
    return EXIT_OK


def cmd_admin(args: argparse.Namespace) -> int:
    from rlog.client import status_to_dict

    with _client(args) as client:
        if args.action == "grant-permit":
            status = client.grant_permit(args.log_id)
        elif args.action == "revoke-permit":
            status = client.revoke_permit(args.log_id)
        else:
            status = client.step_down()
    if args.json:
        print(json.dumps(status_to_dict(status)))
    else:
        print_status(status_to_dict(status))
    return EXIT_OK


def cmd_initialize(args: argparse.Namespace) -> int:
    initialize(args.data_dir, args.storage_engine)
    print(f"initialized the log at {args.data_dir}: replica status VOTING")
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    """Print the shell's completion script, generated from this parser by shtab (a new
    command or flag completes without a script to keep by hand)."""
    import shtab

    print(shtab.complete(build_parser(), shell=args.shell))
    return EXIT_OK


def cmd_dev(args: argparse.Namespace) -> int:
    from rlog.tools import dev_cli

    return dev_cli.run(args)


def cmd_state(args: argparse.Namespace) -> int:
    from rlog.tools import state_cli

    return state_cli.run(args, _endpoint(args), lambda message: UsageError(message, args.prog))


def cmd_archive(args: argparse.Namespace) -> int:
    from rlog.tools import archive_cli

    return archive_cli.run_archive(
        args, args.endpoint, lambda message: UsageError(message, args.prog)
    )


def cmd_restore(args: argparse.Namespace) -> int:
    from rlog.tools import archive_cli

    return archive_cli.run_restore(args, lambda message: UsageError(message, args.prog))


def cmd_bench(args: argparse.Namespace) -> int:
    from rlog.tools import bench

    _endpoint(args)
    return bench.run(args)


# ---- parser --------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rlog",
        description="rlog: a Paxos replicated log (Mesos replicated-log design)",
    )
    parser.add_argument(
        "--version",
        action="version",
        version=f"rlog {__version__} (peer protocol {PEER_PROTOCOL})",
        help="print the project version and the peer protocol version, then exit",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    from rlog.tools import dev_cli, replica_cli

    p = sub.add_parser("replica", help="run a replica")
    replica_cli.add_arguments(p)
    p.set_defaults(func=cmd_replica)

    p = sub.add_parser(
        "completion",
        help='print a shell completion script: eval "$(rlog completion bash)"',
    )
    p.add_argument("shell", choices=("bash", "zsh", "tcsh"))
    p.set_defaults(func=cmd_completion)

    p = sub.add_parser("dev", help="run a local N-replica log as processes")
    dev_cli.add_arguments(p)
    p.set_defaults(func=cmd_dev)

    p = sub.add_parser("append", help="append values; prints their positions")
    add_endpoint_arguments(p)
    p.add_argument("values", nargs="*", metavar="VALUE")
    p.add_argument("--stdin", action="store_true", help="append each line of stdin")
    p.add_argument("--base64", action="store_true", help="values are base64-encoded")
    p.add_argument(
        "--if-next",
        type=nonnegative,
        metavar="P",
        help="append only if the log's next position is P (all values in one call)",
    )
    p.add_argument(
        "--epoch",
        type=nonnegative,
        default=0,
        metavar="E",
        help="append only if writer epoch E (`rlog epoch take`) is still the highest",
    )
    p.set_defaults(func=cmd_append)

    p = sub.add_parser(
        "epoch",
        help="writer epochs: `take` prints a new one (fences older; role owner or admin)",
    )
    add_endpoint_arguments(p)
    p.add_argument("action", choices=["take"])
    p.set_defaults(func=cmd_epoch)

    p = sub.add_parser("read", help="print the entries in [--from, --to]")
    add_endpoint_arguments(p)
    p.add_argument("--from", dest="from_", type=nonnegative, metavar="P")
    p.add_argument("--to", type=nonnegative, metavar="P", help="inclusive")
    p.add_argument("--json", action="store_true", help='{"position": P, "value": "<base64>"}')
    p.add_argument("--stale", action="store_true", help="read the contacted replica's entries")
    p.add_argument(
        "--min-position",
        type=nonnegative,
        metavar="P",
        help="the serving replica first waits (up to --timeout) until it has learned P",
    )
    p.set_defaults(func=cmd_read)

    p = sub.add_parser("tail", help="print entries from --from on, following new ones")
    add_endpoint_arguments(p)
    p.add_argument("--from", dest="from_", type=nonnegative, default=0, metavar="P")
    p.add_argument("--json", action="store_true")
    p.add_argument(
        "--stale",
        action="store_true",
        help="start from the contacted replica's entries (default: everything acknowledged "
        "before the tail started comes first, through the leader)",
    )
    p.set_defaults(func=cmd_tail)

    p = sub.add_parser("status", help="print a replica's status")
    add_endpoint_arguments(p)
    p.add_argument("--json", action="store_true")
    p.add_argument("--all", action="store_true", help="every endpoint's status, one each")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("truncate", help="drop every entry below --to (role owner or admin)")
    add_endpoint_arguments(p)
    p.add_argument("--to", type=nonnegative, required=True, metavar="P")
    p.set_defaults(func=cmd_truncate)

    p = sub.add_parser("initialize", help="set a fresh data dir VOTING (offline)")
    p.add_argument("--data-dir", required=True, metavar="DIR")
    add_storage_engine_argument(p, "the data dir")
    p.set_defaults(func=cmd_initialize)

    p = sub.add_parser("admin", help="operator calls: permits and step-down")
    add_endpoint_arguments(p)
    p.add_argument("action", choices=["grant-permit", "revoke-permit", "step-down"])
    p.add_argument("--log-id", default="", metavar="ID")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_admin)

    from rlog.tools import state_cli

    p = sub.add_parser("state", help="versioned variables kept in the log (rlog.state)")
    add_endpoint_arguments(p)
    state_cli.add_arguments(p)
    p.set_defaults(func=cmd_state)

    from rlog.tools import archive_cli

    p = sub.add_parser("archive", help="archive the log to S3: run | status | list | verify")
    archive_cli.add_archive_arguments(p, add_endpoint_arguments)
    p.set_defaults(func=cmd_archive)

    p = sub.add_parser("restore", help="build a new log's data dirs from an S3 archive")
    archive_cli.add_restore_arguments(p)
    p.set_defaults(func=cmd_restore)

    from rlog.tools import bench

    p = sub.add_parser("bench", help="append benchmark (serial like mesos-log, or concurrent)")
    add_endpoint_arguments(p)
    bench.add_arguments(p)
    p.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from rlog import allocator
    from rlog.tools.dev import die_with_parent_if_asked

    die_with_parent_if_asked()
    # Every rlog process, the clients too: `rlog bench` and `rlog append` build and copy
    # batch-sized buffers as the replicas do (docs/performance.md, "What each change
    # bought"). The client library leaves the allocator of the program it runs in alone.
    allocator.keep_large_buffers()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.prog = f"rlog {args.command}"
        return int(args.func(args))
    except UsageError as exc:
        _fail(f"{exc.prog}: error: {exc}")
        return EXIT_USAGE
    except ConfigError as exc:
        _fail(f"rlog: error: {exc}")
        return EXIT_USAGE
    except (RlogError, StorageError) as exc:
        _fail(f"rlog: error: {exc}")
        return EXIT_ERROR
    except KeyboardInterrupt:
        _fail("rlog: interrupted")
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`rlog read | head`): not an error of ours.
        _silence_stdout()
        return EXIT_OK
    except OSError as exc:
        _fail(f"rlog: error: {exc.strerror or exc}" + (f": {exc.filename}" if exc.filename else ""))
        return EXIT_ERROR
    except Exception as exc:
        _fail(f"rlog: internal error: {type(exc).__name__}: {exc}")
        return EXIT_ERROR


def _fail(message: str) -> None:
    if os.environ.get("RLOG_DEBUG"):
        traceback.print_exc()
    try:
        print(_one_line(message), file=sys.stderr)
        sys.stderr.flush()
    except OSError:
        pass


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
