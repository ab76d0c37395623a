"""`rlog replica`'s command-line arguments (docs/design.md lists the flags): what
tools/cli.py's parser adds for the replica command, kept apart so the CLI module keeps to
one job per file (the same split as tools/dev_cli.py)."""

from __future__ import annotations

import argparse

from rlog.arg_types import (
    add_storage_engine_argument,
    nonnegative,
    nonnegative_float,
    positive_float,
)
from rlog.config import (
    DEFAULT_LANE_FRAME_TIMEOUT,
    DEFAULT_MAX_CONCURRENT_RPCS,
    DEFAULT_MAX_CONCURRENT_STREAMS,
    DEFAULT_MAX_ENTRY_SIZE,
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_MAX_LANE_CONNECTIONS,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_MAX_STREAM_INFLIGHT_BYTES,
    DEFAULT_MAX_TAIL_READERS,
    DEFAULT_MIN_FREE_BYTES,
    DEFAULT_STREAM_WINDOW,
    DEFAULT_TAIL_RESPONSE_BYTES,
)
from rlog.log_format import LOG_FORMATS, default_format
from rlog.protocol.peer_version import MINIMUM as MINIMUM_PEER_PROTOCOL
from rlog.protocol.peer_version import PROTOCOL as PEER_PROTOCOL


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every flag of `rlog replica` (ReplicaConfig.from_args reads them)."""
    p.add_argument("--id", type=nonnegative, required=True, help="this replica's id (0-based)")
    p.add_argument(
        "--peers", required=True, metavar="H:P,H:P,...", help="every replica, in id order"
    )
    p.add_argument("--data-dir", required=True, metavar="DIR")
    p.add_argument("--listen", metavar="H:P", help="bind address (default: the --id'th peer)")
    p.add_argument(
        "--auto-initialize",
        action="store_true",
        help="hold the initialization permit from the start (local use)",
    )
    p.add_argument("--metrics-port", type=nonnegative, metavar="P")
    p.add_argument(
        "--health-port",
        type=nonnegative,
        metavar="P",
        help="serve grpc.health.v1 alone, in plaintext, on this port (Kubernetes grpc "
        "probes; service '' while serving, 'rlog.v1.Log' while VOTING)",
    )
    p.add_argument("--log-id", default="", metavar="ID", help="identity of the log")
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default_format(),
        help="text lines, or one JSON object per line (default: RLOG_LOG_FORMAT, else text)",
    )
    p.add_argument(
        "--min-peer-protocol",
        type=nonnegative,
        default=MINIMUM_PEER_PROTOCOL,
        metavar="V",
        help="refuse peer messages of a lower peer protocol version (default "
        f"{MINIMUM_PEER_PROTOCOL}: every build; this build speaks {PEER_PROTOCOL}; "
        "docs/upgrades.md)",
    )
    p.add_argument(
        "--max-entry-size", type=nonnegative, default=DEFAULT_MAX_ENTRY_SIZE, metavar="BYTES"
    )
    add_storage_engine_argument(p, "the data dir")
    p.add_argument(
        "--election-timeout",
        type=positive_float,
        default=1.0,
        metavar="SECONDS",
        help="randomized in [T, 2T) (default 1)",
    )
    p.add_argument("--heartbeat-interval", type=positive_float, metavar="SECONDS")
    p.add_argument("--append-timeout", type=positive_float, metavar="SECONDS")
    p.add_argument(
        "--session-window",
        type=nonnegative,
        metavar="POSITIONS",
        help="client sessions (exactly-once appends) last this many positions (default 100000)",
    )
    limits = p.add_argument_group("limits (docs/faults.md)")
    limits.add_argument(
        "--max-message-size",
        type=nonnegative,
        default=DEFAULT_MAX_MESSAGE_SIZE,
        metavar="BYTES",
        help="largest request accepted (default 64 MiB); larger: RESOURCE_EXHAUSTED",
    )
    limits.add_argument(
        "--max-concurrent-streams",
        type=nonnegative,
        default=DEFAULT_MAX_CONCURRENT_STREAMS,
        metavar="N",
        help="calls in flight per connection (default 1024; more wait in the client)",
    )
    limits.add_argument(
        "--max-concurrent-rpcs",
        type=nonnegative,
        default=DEFAULT_MAX_CONCURRENT_RPCS,
        metavar="N",
        help="calls in flight on the replica (default 16384; more: RESOURCE_EXHAUSTED)",
    )
    limits.add_argument(
        "--max-tail-readers",
        type=nonnegative,
        default=DEFAULT_MAX_TAIL_READERS,
        metavar="N",
        help="Tail calls open at once (default 256; more: RESOURCE_EXHAUSTED)",
    )
    limits.add_argument(
        "--tail-response-bytes",
        type=nonnegative,
        default=DEFAULT_TAIL_RESPONSE_BYTES,
        metavar="BYTES",
        help="entries' bytes in one Tail response, what a reader that stops reading pins "
        "(default 256 KiB; one larger entry still goes whole)",
    )
    add_budget_arguments(limits)
    limits.add_argument(
        "--min-free-bytes",
        type=nonnegative,
        default=DEFAULT_MIN_FREE_BYTES,
        metavar="BYTES",
        help="appends are refused (DISK_FULL) while the data dir's file system has less "
        "free (default 64 MiB; room kept for promises and elections)",
    )
    limits.add_argument(
        "--stream-window",
        type=nonnegative,
        default=DEFAULT_STREAM_WINDOW,
        metavar="BYTES",
        help="HTTP/2 flow-control window per call (default 0: gRPC's own, sized by BDP)",
    )
    limits.add_argument(
        "--catchup-rate",
        type=nonnegative,
        default=0,
        metavar="BYTES",
        help="a catching-up replica (and a follower pulling what it missed) copies at most "
        "this many bytes per second from its peers (default 0: no limit)",
    )
    security = p.add_argument_group(
        "security (docs/security.md; without --tls-cert the replica serves PLAINTEXT)"
    )
    security.add_argument(
        "--tls-cert", metavar="FILE", help="serve TLS with this certificate (PEM; reloaded)"
    )
    security.add_argument("--tls-key", metavar="FILE", help="the certificate's private key")
    security.add_argument(
        "--tls-client-ca",
        metavar="FILE",
        help="require a client certificate of this CA on every connection (mutual TLS); "
        "without --tls-peer-ca, peers' certificates are verified against it too",
    )
    security.add_argument(
        "--tls-peer-ca",
        metavar="FILE",
        help="the CA of the replicas and the operator: only its certificates may be peers or "
        "admins (--tls-cert must be one); without it peers are trusted by name",
    )
    security.add_argument(
        "--auth-config",
        metavar="FILE",
        help="roles (read, append, owner, admin, peer, none) of certificate subjects and "
        "bearer tokens (JSON or YAML; docs/security.md); without it authorization is off",
    )
    security.add_argument(
        "--auth-peer-token-file",
        metavar="FILE",
        help="bearer token this replica sends to its peers (when they know peers by token)",
    )
    for flag, what in (
        ("--insecure", "serve PLAINTEXT beyond loopback (refused without it)"),
        ("--admin-from-anywhere", "in plaintext, answer Admin calls from beyond loopback too"),
    ):
        security.add_argument(flag, action="store_true", help=what)
    p.add_argument(
        "--drain-timeout",
        type=nonnegative_float,
        metavar="SECONDS",
        help="on SIGTERM while leading, step down and keep serving until another replica "
        "leads, at most this long (default 0: stop at once)",
    )
    p.add_argument(
        "--write-lane-offset",
        type=nonnegative,
        metavar="N",
        help="serve the leader's writes on plain TCP (mutual TLS with --tls-client-ca) at "
        "the gRPC port + N and send them to each peer at its port + N, instead of on the "
        "gRPC stream (faster; every replica of the log needs the same N; default 0: off)",
    )


# The `ReplicaConfig` fields these arguments set (each the argument's dest).
BUDGET_KEYS = (
    "max_stream_inflight_bytes",
    "max_inflight_bytes",
    "max_lane_connections",
    "lane_frame_timeout",
)


def add_budget_arguments(limits: argparse._ArgumentGroup) -> None:
    """How many bytes of clients' appends the replica holds at once, and what a lane
    connection may hold (docs/security.md, "Budgets")."""
    limits.add_argument(
        "--max-stream-inflight-bytes",
        type=nonnegative,
        default=DEFAULT_MAX_STREAM_INFLIGHT_BYTES,
        metavar="BYTES",
        help="bytes of appends in flight on one AppendStream or append-lane connection "
        "(default 64 MiB); over it the stream is not read until answers go out",
    )
    limits.add_argument(
        "--max-inflight-bytes",
        type=nonnegative,
        default=DEFAULT_MAX_INFLIGHT_BYTES,
        metavar="BYTES",
        help="bytes of appends in flight on the replica (default 512 MiB); over it streams "
        "are not read, a unary Append waits, at its deadline RESOURCE_EXHAUSTED",
    )
    limits.add_argument(
        "--max-lane-connections",
        type=nonnegative,
        default=DEFAULT_MAX_LANE_CONNECTIONS,
        metavar="N",
        help="connections open on the lane port (default 1024); more are closed at once",
    )
    limits.add_argument(
        "--lane-frame-timeout",
        type=positive_float,
        default=DEFAULT_LANE_FRAME_TIMEOUT,
        metavar="SECONDS",
        help="a lane connection without its hello after this long, or a client's append "
        "not whole this long after its length, is closed (default 10)",
    )
