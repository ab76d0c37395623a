"""Replica configuration and the validation of its command-line values.

Every check raises `ConfigError` with a one-line message the CLI prints as is.
"""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

ALLOWED_REPLICA_COUNTS = (1, 3, 5, 7)
DEFAULT_MAX_ENTRY_SIZE = 4 * 1024 * 1024
DEFAULT_SESSION_WINDOW = 100_000  # positions a client session lasts (docs/protocol.md)
# Limits on what clients and peers may hold of a replica (docs/faults.md, "Limits").
DEFAULT_MAX_MESSAGE_SIZE = 64 * 1024 * 1024  # bytes of one request or response
DEFAULT_MAX_CONCURRENT_STREAMS = 1024  # HTTP/2 streams (calls in flight) per connection
DEFAULT_MAX_CONCURRENT_RPCS = 16384  # calls in flight on the whole server
DEFAULT_MAX_TAIL_READERS = 256  # Tail calls open at once (about 1 MB each when unread)
# Bytes of entries in one Tail response: what a reader that stops reading pins on the replica
# (with its flow-control window), so far below the 4 MiB chunks of Read (docs/faults.md).
DEFAULT_TAIL_RESPONSE_BYTES = 256 * 1024
# Bytes of clients' appends in flight (runtime/budgets.py, docs/security.md "Budgets"): per
# AppendStream or append-lane connection (over it the stream is not read), and on the whole
# replica. A batched load of 8 writers of 64 x 4 KiB appends holds about 8 x 2 MiB.
DEFAULT_MAX_STREAM_INFLIGHT_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_INFLIGHT_BYTES = 512 * 1024 * 1024
# Lane connections open at once (more are closed at once), and the seconds a new one has
# to send its hello, and a client an append once its length is read (docs/security.md
# "Budgets").
DEFAULT_MAX_LANE_CONNECTIONS = 1024
DEFAULT_LANE_FRAME_TIMEOUT = 10.0
DEFAULT_STREAM_WINDOW = 0  # HTTP/2 flow-control window per stream; 0: gRPC's own (BDP-sized)
# A leader refuses appends (DISK_FULL) while its data dir's file system has less than this
# free, so that promises, elections and learned marks still find room (docs/faults.md).
DEFAULT_MIN_FREE_BYTES = 64 * 1024 * 1024

# TEST ONLY, never in production: a replica started with this environment variable set to 1
# serves non-stale reads without confirming its leadership (no read index) and, as a leader,
# never steps down for want of a quorum (no check-quorum): reads behave as before either
# existed, so a deposed leader answers reads with a stale prefix. The consistency suite sets
# it (`python -m jepsen --unsafe-no-read-index`, docs/jepsen.md) to show that it catches
# that. (Check-quorum alone only narrows the window, to the moments between the majority's
# new leader acknowledging appends and the old leader stepping down.)
UNSAFE_NO_READ_INDEX_ENV = "RLOG_UNSAFE_NO_READ_INDEX"

# TEST ONLY, never in production: with this environment variable set to 1, a new leader's fill
# and catch-up's fill settle each position on its own (the fill of before client batches were
# marked), so the entries of one `Append` call accepted by a minority can end up chosen in
# part: some re-proposed, the rest NOPs. The randomized simulation (tests/paxos_sim.py) turns
# the same rule off to show that its all-or-none check catches that.
UNSAFE_SPLIT_FILL_ENV = "RLOG_UNSAFE_SPLIT_FILL"


# TEST ONLY, never in production: with this environment variable set to 1, a leader appends
# a session append again whose sequence number the log already answered, instead of
# returning the original positions: a client's retry of an append whose first try was
# chosen duplicates it (exactly-once appends off). The consistency suite sets it
# (`python -m jepsen --unsafe-no-dedupe`, docs/jepsen.md) to show that it catches that.
UNSAFE_NO_DEDUPE_ENV = "RLOG_UNSAFE_NO_DEDUPE"

# TEST ONLY, never in production: with this environment variable set to 1, the segment
# engine skips the fdatasync of every batch (a segment roll still syncs), so what a replica
# acknowledged is in the page cache only. A SIGKILL keeps it; a power cut loses it. The
# power-loss tests (tests/runtime/test_powerfs_live.py, `python -m jepsen --unsafe-no-sync`,
# docs/faults.md "Power loss") set it to show that they catch a missing sync.
UNSAFE_NO_SYNC_ENV = "RLOG_UNSAFE_NO_SYNC"


# TEST ONLY: a replica started with this environment variable set to 1 serves no
# `WriteStream` (the RPC is left unregistered, as in a build that predates it), so a leader
# must fall back to unary `Write`s to it. Harmless (the protocol is the same), but never
# useful outside the test of that fallback.
NO_WRITE_STREAM_ENV = "RLOG_NO_WRITE_STREAM"


# TEST ONLY: a replica started with this environment variable set to a number of seconds
# hands each write and learned message of its own rounds to its own acceptor and learner
# that much later (in order), as a slow local disk would. Harmless (the followers' votes may
# choose a batch before the leader's own), but it makes the interleavings of a leader's own
# writes with its disk filling up reproducible (tests/runtime/test_disk_faults_live.py).
SLOW_SELF_ENV = "RLOG_TEST_SLOW_SELF"


# TEST ONLY: the segment engine's segment size in bytes (default 64 MiB), so that live tests
# of lost or cut segments fill several segments with a few MB of appends. Harmless.
SEGMENT_BYTES_ENV = "RLOG_TEST_SEGMENT_BYTES"


def test_segment_bytes() -> int | None:
    """The test-only segment size (None: the default)."""
    text = os.environ.get(SEGMENT_BYTES_ENV, "")
    try:
        return max(4096, int(text)) if text else None
    except ValueError:
        raise ConfigError(f"{SEGMENT_BYTES_ENV}={text!r}: not a number of bytes") from None


def slow_self() -> float:
    """The test-only delay of a leader's messages to itself (0: none)."""
    text = os.environ.get(SLOW_SELF_ENV, "")
    try:
        return max(0.0, float(text)) if text else 0.0
    except ValueError:
        raise ConfigError(f"{SLOW_SELF_ENV}={text!r}: not a number of seconds") from None


def no_write_stream() -> bool:
    """Whether the test-only switch leaving WriteStream unregistered is on."""
    return os.environ.get(NO_WRITE_STREAM_ENV) == "1"


def unsafe_no_dedupe() -> bool:
    """Whether the test-only dedupe switch is off (`RLOG_UNSAFE_NO_DEDUPE=1`)."""
    return os.environ.get(UNSAFE_NO_DEDUPE_ENV) == "1"


def unsafe_no_sync() -> bool:
    """Whether the test-only switch skipping the batches' fdatasync is on
    (`RLOG_UNSAFE_NO_SYNC=1`)."""
    return os.environ.get(UNSAFE_NO_SYNC_ENV) == "1"


def unsafe_split_fill() -> bool:
    """Whether the test-only split fill is on (`RLOG_UNSAFE_SPLIT_FILL=1`)."""
    return os.environ.get(UNSAFE_SPLIT_FILL_ENV) == "1"


class ConfigError(ValueError):
    """A configuration value is invalid; the message is shown to the user as is."""


def parse_address(text: str, what: str = "address") -> str:
    """Validate `H:P` (host name, IPv4, or [IPv6]) and return it normalized."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host:
        raise ConfigError(f"invalid {what} {text!r}: expected HOST:PORT")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"invalid {what} {text!r}: port {port_text!r} is not a number") from None
    if not 0 < port < 65536:
        raise ConfigError(f"invalid {what} {text!r}: port {port} is out of range 1-65535")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not all(part and part.replace("-", "").isalnum() for part in bare.split(".")):
            raise ConfigError(f"invalid {what} {text!r}: bad host {host!r}") from None
    return f"{host}:{port}"


def parse_peers(text: str) -> list[str]:
    """Parse `--peers H:P,H:P,...`: every replica including this one, in id order."""
    if not text.strip():
        raise ConfigError("--peers is empty: list every replica as HOST:PORT,HOST:PORT,...")
    peers = [parse_address(item, "peer") for item in text.split(",")]
    if len(set(peers)) != len(peers):
        raise ConfigError(f"--peers lists an address twice: {text}")
    check_replica_count(len(peers))
    return peers


def check_replica_count(count: int) -> None:
    if count not in ALLOWED_REPLICA_COUNTS:
        raise ConfigError(
            f"a log has 1, 3, 5 or 7 replicas, not {count}: "
            "an even count adds no fault tolerance and reconfiguration is not supported"
        )


def quorum(replicas: int) -> int:
    return replicas // 2 + 1


@dataclass
class ReplicaConfig:
    id: int  # 0-based, the index of this replica in `peers`
    peers: list[str]  # every replica including this one, in id order
    data_dir: Path
    listen: str = ""  # defaults to peers[id]
    auto_initialize: bool = False
    metrics_port: int | None = None
    # grpc.health.v1 in plaintext for the kubelet's probes (runtime/health.py); None: off
    health_port: int | None = None
    log_id: str = ""
    # Peer requests stating a lower protocol version are refused (protocol/peer_version.py).
    min_peer_protocol: int = 0
    max_entry_size: int = DEFAULT_MAX_ENTRY_SIZE
    storage_engine: str = "auto"  # rlog.storage.AUTO: the engine of the data dir's store
    election_timeout: float = 1.0  # seconds; randomized in [T, 2T)
    heartbeat_interval: float = 0.2
    append_timeout: float = 10.0
    retry_backoff: float = 0.1  # T of the random back-off in [T, 2T) after a rejection
    max_batch_entries: int = 4096
    max_batch_bytes: int = 8 * 1024 * 1024
    max_inflight_batches: int = 2  # measured: deeper pipelines make smaller batches
    # Client sessions (exactly-once appends) last this many positions (docs/protocol.md).
    session_window: int = DEFAULT_SESSION_WINDOW
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    max_concurrent_streams: int = DEFAULT_MAX_CONCURRENT_STREAMS
    max_concurrent_rpcs: int = DEFAULT_MAX_CONCURRENT_RPCS
    max_tail_readers: int = DEFAULT_MAX_TAIL_READERS
    tail_response_bytes: int = DEFAULT_TAIL_RESPONSE_BYTES
    max_stream_inflight_bytes: int = DEFAULT_MAX_STREAM_INFLIGHT_BYTES
    max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES
    max_lane_connections: int = DEFAULT_MAX_LANE_CONNECTIONS
    lane_frame_timeout: float = DEFAULT_LANE_FRAME_TIMEOUT
    stream_window: int = DEFAULT_STREAM_WINDOW
    min_free_bytes: int = DEFAULT_MIN_FREE_BYTES
    # Seconds to wait for a data dir another process still holds (a replacement pod started
    # before the process it replaces has exited) before giving up: waiting in the process,
    # not crash-looping, keeps the container's restart back-off from growing to minutes.
    lock_wait: float = 60.0
    # Transport security (docs/security.md): the replica's certificate and key (serve TLS,
    # and present them to peers), and the CA client and peer certificates must chain to
    # (requires one on every connection: mutual TLS). None: plaintext.
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    # The peer CA (rlog.runtime.tls): only certificates it issued may be peers or admins,
    # whatever names they carry. None: peers are trusted by name (a warning says so).
    tls_peer_ca: Path | None = None
    # Authorization: the roles file (rlog.runtime.authz); None: every caller may call anything.
    auth_config: Path | None = None
    # A bearer token this replica sends to its peers (when they know peers by token, not by
    # certificate).
    auth_peer_token_file: Path | None = None
    # Plaintext (runtime/plaintext.py, docs/security.md): serve without TLS beyond loopback
    # (--insecure), and answer Admin calls from any address, not loopback only
    # (--admin-from-anywhere). Both are refused with TLS, where they would mean nothing.
    insecure: bool = False
    admin_from_anywhere: bool = False
    # Asked to stop (SIGTERM) while leading: step down first and keep serving (forwarding to
    # the next leader) until another replica leads, at most this long; 0 = stop at once.
    drain_timeout: float = 0.0
    # The write lane (rlog.lane): >0 serves the leader's writes on plain TCP (mutual
    # TLS when the replica has TLS) at the gRPC port + this offset, and writes to each peer at
    # its port + the same offset; 0: the gRPC stream only.
    write_lane_offset: int = 0
    # Catch-up and pulls copy at most this many bytes per second from the peers (the peers'
    # disks and network stay the clients'); 0: as fast as they go.
    catchup_rate: int = 0

    def __post_init__(self) -> None:
        check_replica_count(len(self.peers))
        if not 0 <= self.id < len(self.peers):
            raise ConfigError(
                f"--id {self.id} is out of range: --peers lists {len(self.peers)} replicas "
                f"(ids 0..{len(self.peers) - 1})"
            )
        if not self.listen:
            self.listen = self.peers[self.id]
        else:
            self.listen = parse_address(self.listen, "--listen address")
        if self.max_entry_size <= 0:
            raise ConfigError("--max-entry-size must be positive")
        if self.session_window <= 0:
            raise ConfigError("--session-window must be positive")
        for flag, value in (
            ("--max-message-size", self.max_message_size),
            ("--max-concurrent-streams", self.max_concurrent_streams),
            ("--max-concurrent-rpcs", self.max_concurrent_rpcs),
            ("--max-tail-readers", self.max_tail_readers),
            ("--tail-response-bytes", self.tail_response_bytes),
            ("--max-stream-inflight-bytes", self.max_stream_inflight_bytes),
            ("--max-inflight-bytes", self.max_inflight_bytes),
            ("--max-lane-connections", self.max_lane_connections),
            ("--lane-frame-timeout", self.lane_frame_timeout),
        ):
            if value <= 0:
                raise ConfigError(f"{flag} must be positive")
        if self.max_message_size < self.max_entry_size + 64 * 1024:
            raise ConfigError(
                f"--max-message-size {self.max_message_size} cannot carry an entry of "
                f"--max-entry-size {self.max_entry_size} bytes (allow 64 KiB more)"
            )
        if self.min_free_bytes < 0:
            raise ConfigError("--min-free-bytes must be 0 or positive")
        if self.stream_window < 0:
            raise ConfigError("--stream-window must be 0 (gRPC's own) or positive")
        if self.drain_timeout < 0:
            raise ConfigError("--drain-timeout must not be negative")
        if self.catchup_rate < 0:
            raise ConfigError("--catchup-rate must be 0 (no limit) or positive")
        self._check_security_files()
        self._check_write_lane()

    def _check_write_lane(self) -> None:
        offset = self.write_lane_offset
        if offset == 0:
            return
        if offset < 0:
            raise ConfigError("--write-lane-offset must be 0 (off) or positive")
        if self.tls_cert is not None and self.tls_client_ca is None:
            raise ConfigError(
                "--write-lane-offset with TLS needs mutual TLS (--tls-client-ca): the lane "
                "knows its peers by their certificates, not by bearer tokens (leave it 0)"
            )
        for what, address in (("--listen", self.listen), *(("peer", p) for p in self.peers)):
            port = int(address.rpartition(":")[2])
            if port + offset > 65535:
                raise ConfigError(
                    f"--write-lane-offset {offset}: {what} {address} would have its write "
                    f"lane at port {port + offset}, out of range (max 65535)"
                )

    def _check_security_files(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ConfigError("--tls-cert and --tls-key go together: give both or neither")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ConfigError("--tls-client-ca needs --tls-cert and --tls-key (TLS to verify with)")
        for flag, given in (
            ("--insecure", self.insecure),
            ("--admin-from-anywhere", self.admin_from_anywhere),
        ):
            if given and self.tls_cert is not None:
                raise ConfigError(
                    f"{flag} is for a replica without TLS; with TLS the roles file "
                    "(--auth-config) says who may call what"
                )
        if self.tls_peer_ca is not None and self.tls_client_ca is None:
            raise ConfigError(
                "--tls-peer-ca needs --tls-client-ca: peers are told from clients among "
                "callers that all present a certificate (mutual TLS)"
            )
        if self.auth_peer_token_file is not None and self.tls_cert is None:
            raise ConfigError("--auth-peer-token-file needs TLS: a token never travels in clear")
        for flag, path in (
            ("--tls-cert", self.tls_cert),
            ("--tls-key", self.tls_key),
            ("--tls-client-ca", self.tls_client_ca),
            ("--tls-peer-ca", self.tls_peer_ca),
            ("--auth-config", self.auth_config),
            ("--auth-peer-token-file", self.auth_peer_token_file),
        ):
            if path is not None and not path.is_file():
                raise ConfigError(f"{flag} {path}: no such file")

    @property
    def transport(self) -> str:
        """How this replica's connections are secured: plaintext, tls (server certificate
        only) or mutual-tls (every caller presents a certificate of the client CA)."""
        if self.tls_cert is None:
            return "plaintext"
        return "mutual-tls" if self.tls_client_ca is not None else "tls"

    @property
    def peer_trust(self) -> str:
        """How peers and admins are told from clients: "ca" (only certificates of the peer
        CA), "names" (any certificate carrying a name the roles file makes peer or admin),
        or "" (no authorization: everybody may do anything)."""
        if self.auth_config is None:
            return ""
        return "ca" if self.tls_peer_ca is not None else "names"

    @property
    def address(self) -> str:
        """The address peers and clients use to reach this replica."""
        return self.peers[self.id]

    @property
    def quorum(self) -> int:
        return quorum(len(self.peers))
