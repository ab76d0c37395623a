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


# TEST ONLY: a replica started with this environment variable set to 1 serves no
# `WriteStream` (the RPC is left unregistered, as in a build that predates it), so a leader
# must fall back to unary `Write`s to it. Harmless (the protocol is the same), but never
# useful outside the test of that fallback.
NO_WRITE_STREAM_ENV = "RLOG_NO_WRITE_STREAM"


def no_write_stream() -> bool:
    """Whether the test-only switch leaving WriteStream unregistered is on."""
    return os.environ.get(NO_WRITE_STREAM_ENV) == "1"


def unsafe_no_dedupe() -> bool:
    """Whether the test-only dedupe switch is off (`RLOG_UNSAFE_NO_DEDUPE=1`)."""
    return os.environ.get(UNSAFE_NO_DEDUPE_ENV) == "1"


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
    log_id: str = ""
    max_entry_size: int = DEFAULT_MAX_ENTRY_SIZE
    storage_engine: str = "lmdb"
    election_timeout: float = 1.0  # seconds; randomized in [T, 2T)
    heartbeat_interval: float = 0.2
    append_timeout: float = 10.0
    retry_backoff: float = 0.1  # T of the random back-off in [T, 2T) after a rejection
    max_batch_entries: int = 4096
    max_batch_bytes: int = 8 * 1024 * 1024
    max_inflight_batches: int = 2  # measured: deeper pipelines make smaller batches
    # Client sessions (exactly-once appends) last this many positions (docs/protocol.md).
    session_window: int = DEFAULT_SESSION_WINDOW
    # Asked to stop (SIGTERM) while leading: step down first and keep serving (forwarding to
    # the next leader) until another replica leads, at most this long; 0 = stop at once.
    drain_timeout: float = 0.0

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
        if self.drain_timeout < 0:
            raise ConfigError("--drain-timeout must not be negative")

    @property
    def address(self) -> str:
        """The address peers and clients use to reach this replica."""
        return self.peers[self.id]

    @property
    def quorum(self) -> int:
        return quorum(len(self.peers))
