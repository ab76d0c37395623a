"""The wire contract: what clients and replicas, and replicas among themselves, agree on
besides the messages in `rlog.proto`.

- the gRPC channel options (`SERVER_OPTIONS`, `PEER_CHANNEL_OPTIONS`,
  `CLIENT_CHANNEL_OPTIONS`, all derived from one base list);
- the metadata keys: `FORWARDED` on a request a replica forwards to the leader, and on an
  error the trailers `REASON`, `BEGIN`, `END` and `NOT_ATTEMPTED`;
- `Reason`: why a replica refused or failed a request, in a form a program can rely on. The
  error message is for people and may be reworded at any time; clients choose what to
  raise from the reason and its structured fields (`ErrorDetails`), never from the text.

Why a plain trailer (`rlog-reason: TRUNCATED`) and not a `google.rpc.ErrorInfo` status
detail: ErrorInfo needs two more dependencies (googleapis-common-protos and grpcio-status)
on every client and replica, packs the detail into a binary `grpc-status-details-bin`
trailer that must be decoded before it says anything, and still cannot travel in an
`AppendStream` response, which reports each append's error inside a message (the
`AppendResponse.reason` field carries the same `Reason` values there). A trailer is readable
with `trailing_metadata()` on both the blocking and the asyncio gRPC APIs and by any gRPC
tool, and an rlog server that predates it is recognisable by its absence.

Session secrets (docs/security.md, "Sessions"). `OpenSessionResponse.secret` is a random
16-byte secret the leader chose; every append in the session carries it
(`AppendRequest.session_secret`), on gRPC and on the append lane alike, and the log
refuses a session append without it (PERMISSION_DENIED, `SESSION_NOT_YOURS`) before it
looks up the sequence's answer. A client that predates secrets never sends one, so its session
appends are refused, loudly, with that reason; it can still append without a session (at
most once). Rejected: taking a session append without a secret as before (for old
clients), which is the hole itself: anyone could send (session, n) for a session not
theirs, and the owner's own append n would come back a duplicate of it, acknowledged but
not in the log. A refusal is the one answer that neither loses an acknowledged append nor
needs the old client to know anything new.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import grpc

MAX_MESSAGE_LENGTH = 64 * 1024 * 1024
CONNECT_TIMEOUT_MS = 2000  # one connection attempt (see BASE_OPTIONS)

# Every endpoint of rlog's gRPC traffic: replicas' servers, replica-to-replica channels and
# clients' channels. (A server ignores the channel-only options.)
BASE_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.max_send_message_length", MAX_MESSAGE_LENGTH),
    ("grpc.max_receive_message_length", MAX_MESSAGE_LENGTH),
    ("grpc.keepalive_time_ms", 10_000),
    # A restarted peer must be reachable again within an election timeout, not after gRPC's
    # default reconnect back-off (up to 120 s): a replica that hears no heartbeat stands for
    # election, and a client waits for the replica it talks to.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    # Despite its name, gRPC takes this as the time one connection attempt may take (TCP,
    # TLS handshake, the server's first HTTP/2 frame) before it is abandoned and the call
    # fails UNAVAILABLE, not as a back-off. At 100 ms (once set here beside the back-off) a
    # replica busy for a tenth of a second, e.g. on a loaded node, failed fresh connections;
    # 2 s is far more than a handshake needs and still fails over from an address that
    # swallows packets (a deleted pod's) before a call's own timeout.
    ("grpc.min_reconnect_backoff_ms", CONNECT_TIMEOUT_MS),
    # A peer recreated under the same DNS name (a Kubernetes pod) has a new address: re-resolve
    # at most a second after a disconnect, not gRPC's default 30 s, else the channel keeps
    # dialling the old address and the peer stays unreachable that long.
    ("grpc.dns_min_time_between_resolutions_ms", 1000),
]

SERVER_OPTIONS: list[tuple[str, Any]] = list(BASE_OPTIONS)
# Replica to replica (the peer protocol and forwarding to the leader).
PEER_CHANNEL_OPTIONS: list[tuple[str, Any]] = list(BASE_OPTIONS)
CLIENT_CHANNEL_OPTIONS: list[tuple[str, Any]] = [
    *BASE_OPTIONS,
    # Never let gRPC re-send a call on its own: appends are not idempotent.
    ("grpc.enable_retries", 0),
]

# Request metadata: set by a replica forwarding a request to the leader, so the leader
# answers it itself (or refuses) instead of forwarding it again.
FORWARDED = "rlog-forwarded"

# Trailing metadata of an error answered by an rlog server:
REASON = "rlog-reason"  # a `Reason` value
BEGIN = "rlog-begin"  # TRUNCATED: the first position the log still holds
END = "rlog-end"  # PAST_END: the last learned position
NEXT = "rlog-next"  # CONDITION_FAILED: the log's next position at the refusal
EPOCH = "rlog-epoch"  # CONDITION_FAILED: the log's writer epoch at the refusal
# The request changed nothing, so it may be sent again elsewhere. Implied by the reason
# (`Reason.not_attempted`); a key of its own because clients and replicas that predate
# reasons (during a rolling upgrade) read only this.
NOT_ATTEMPTED = "rlog-not-attempted"


class Reason(enum.Enum):
    """Why an rlog server answered a request with an error. Each reason always travels with
    the same gRPC status code (`code`); `not_attempted` reasons guarantee that the request
    changed nothing, so it may be sent again (to this or another replica)."""

    # OUT_OF_RANGE
    TRUNCATED = "TRUNCATED"  # the position is below the log's beginning (BEGIN says where)
    PAST_END = "PAST_END"  # the position is past the log's end (END says where, for reads)
    # INVALID_ARGUMENT
    INVALID_ARGUMENT = "INVALID_ARGUMENT"  # a malformed request (`from` after `to`)
    ENTRY_TOO_LARGE = "ENTRY_TOO_LARGE"  # a value exceeds the replica's maximum entry size
    EPOCH_FROM_FUTURE = "EPOCH_FROM_FUTURE"  # an append's epoch was never taken
    # NOT_FOUND
    UNKNOWN_SESSION = "UNKNOWN_SESSION"  # no session with this id was opened in the log
    # FAILED_PRECONDITION
    NOT_VOTING = "NOT_VOTING"  # the replica is not VOTING: it cannot serve a stale read
    LOG_ID_MISMATCH = "LOG_ID_MISMATCH"  # the replica belongs to another log
    # a peer message of a build older than the replica serves (protocol/peer_version.py)
    PROTOCOL_TOO_OLD = "PROTOCOL_TOO_OLD"
    # an append's condition (if_next, epoch) does not hold: NEXT and EPOCH say what does;
    # nothing was appended
    CONDITION_FAILED = "CONDITION_FAILED"
    SESSION_EXPIRED = "SESSION_EXPIRED"  # the session is past the window (or truncated)
    # the sequence is below the answers the client acknowledged: its answer is forgotten
    SEQUENCE_FORGOTTEN = "SEQUENCE_FORGOTTEN"
    # PERMISSION_DENIED: a session append without its session's secret (docs/security.md,
    # "Sessions"); nothing was appended or answered from the session
    SESSION_NOT_YOURS = "SESSION_NOT_YOURS"
    # UNAVAILABLE, not attempted
    NO_LEADER = "NO_LEADER"  # no leader is known or elected
    NOT_LEADER = "NOT_LEADER"  # this replica does not lead (any more), and did nothing
    LEADER_UNAVAILABLE = "LEADER_UNAVAILABLE"  # forwarding: the leader could not be reached
    NOT_LEARNED = "NOT_LEARNED"  # a read reached a position this replica has not learned
    # a leader could not confirm in time that a quorum still follows it, so it did not
    # serve the linearizable read (it may have been deposed); retry, here or elsewhere
    LEADERSHIP_UNCONFIRMED = "LEADERSHIP_UNCONFIRMED"
    # UNAVAILABLE, outcome unknown for an append or truncation
    STOPPING = "STOPPING"  # the replica is shutting down
    # DEADLINE_EXCEEDED: an append or truncation found no quorum in time; outcome unknown
    TIMEOUT = "TIMEOUT"
    # ABORTED: leadership was lost (or the leader unreachable) during an append or
    # truncation; it may or may not be in the log
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    # Any other code: the leader answered a forwarded request with an error of gRPC's own
    INTERNAL = "INTERNAL"
    # RESOURCE_EXHAUSTED: the leader's disk is full (or under --min-free-bytes); nothing was
    # proposed. Not marked "not attempted" on purpose: another endpoint would forward to the
    # same leader. Reads still work; appends work again once space returns.
    DISK_FULL = "DISK_FULL"
    # RESOURCE_EXHAUSTED: a limit of the replica (--max-* flags) refused the request
    LIMIT_EXCEEDED = "LIMIT_EXCEEDED"
    # DATA_LOSS: a stored record failed its checksum; the replica served none of it and is
    # repairing itself from its peers (RECOVERING). Retry on another replica.
    CORRUPT_RECORD = "CORRUPT_RECORD"
    # UNAVAILABLE: the replica's disk fails its writes (EIO, EROFS): it left the quorum until
    # the disk works again, and what it was asked to store is not stored. An append or a
    # peer's write that met it may or may not be chosen (others may have stored it).
    DISK_FAILING = "DISK_FAILING"

    @property
    def not_attempted(self) -> bool:
        return self in _NOT_ATTEMPTED

    @property
    def code(self) -> grpc.StatusCode | None:
        """The gRPC status code this reason is sent with (None: INTERNAL keeps whatever code
        the underlying error had)."""
        return _CODES.get(self)


_NOT_ATTEMPTED = frozenset(
    {
        Reason.NO_LEADER,
        Reason.NOT_LEADER,
        Reason.LEADER_UNAVAILABLE,
        Reason.NOT_LEARNED,
        Reason.LEADERSHIP_UNCONFIRMED,
    }
)

_CODES = {
    Reason.TRUNCATED: grpc.StatusCode.OUT_OF_RANGE,
    Reason.PAST_END: grpc.StatusCode.OUT_OF_RANGE,
    Reason.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.ENTRY_TOO_LARGE: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.NOT_VOTING: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.LOG_ID_MISMATCH: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.PROTOCOL_TOO_OLD: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.EPOCH_FROM_FUTURE: grpc.StatusCode.INVALID_ARGUMENT,
    Reason.UNKNOWN_SESSION: grpc.StatusCode.NOT_FOUND,
    Reason.CONDITION_FAILED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.SESSION_EXPIRED: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.SEQUENCE_FORGOTTEN: grpc.StatusCode.FAILED_PRECONDITION,
    Reason.SESSION_NOT_YOURS: grpc.StatusCode.PERMISSION_DENIED,
    Reason.NO_LEADER: grpc.StatusCode.UNAVAILABLE,
    Reason.NOT_LEADER: grpc.StatusCode.UNAVAILABLE,
    Reason.LEADER_UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    Reason.NOT_LEARNED: grpc.StatusCode.UNAVAILABLE,
    Reason.LEADERSHIP_UNCONFIRMED: grpc.StatusCode.UNAVAILABLE,
    Reason.STOPPING: grpc.StatusCode.UNAVAILABLE,
    Reason.TIMEOUT: grpc.StatusCode.DEADLINE_EXCEEDED,
    Reason.OUTCOME_UNKNOWN: grpc.StatusCode.ABORTED,
    Reason.DISK_FULL: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.LIMIT_EXCEEDED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    Reason.CORRUPT_RECORD: grpc.StatusCode.DATA_LOSS,
    Reason.DISK_FAILING: grpc.StatusCode.UNAVAILABLE,
}


def parse_reason(text: str | bytes | None) -> Reason | None:
    """The `Reason` named by a trailer or an `AppendResponse.reason`; None if absent or
    unknown (a newer server's reason: the client falls back to the status code)."""
    if isinstance(text, bytes):
        text = text.decode("ascii", errors="replace")
    if not text:
        return None
    try:
        return Reason(text)
    except ValueError:
        return None


@dataclass(frozen=True)
class ErrorDetails:
    """What an rlog server says about an error besides its code and message: the reason,
    and the structured fields some reasons carry."""

    reason: Reason
    begin: int | None = None  # TRUNCATED
    end: int | None = None  # PAST_END
    next_position: int | None = None  # CONDITION_FAILED
    epoch: int | None = None  # CONDITION_FAILED

    def trailers(self) -> tuple[tuple[str, str], ...]:
        """The trailing metadata that carries these details."""
        items = [(REASON, self.reason.value)]
        if self.begin is not None:
            items.append((BEGIN, str(self.begin)))
        if self.end is not None:
            items.append((END, str(self.end)))
        if self.next_position is not None:
            items.append((NEXT, str(self.next_position)))
        if self.epoch is not None:
            items.append((EPOCH, str(self.epoch)))
        if self.reason.not_attempted:
            items.append((NOT_ATTEMPTED, "1"))
        return tuple(items)

    @classmethod
    def from_metadata(cls, metadata: Iterable[Any] | None) -> ErrorDetails | None:
        """The details in an error's trailing metadata (from `grpc` or `grpc.aio`); None if
        it carries no (known) reason: the error did not come from an rlog server."""
        values = _metadata_dict(metadata)
        reason = parse_reason(values.get(REASON))
        if reason is None:
            return None
        return cls(
            reason,
            _int_or_none(values.get(BEGIN)),
            _int_or_none(values.get(END)),
            _int_or_none(values.get(NEXT)),
            _int_or_none(values.get(EPOCH)),
        )


def not_attempted(metadata: Iterable[Any] | None) -> bool:
    """Whether an rlog server said, in an error's trailing metadata, that it did nothing."""
    return NOT_ATTEMPTED in _metadata_dict(metadata)


def _metadata_dict(metadata: Iterable[Any] | None) -> dict[str, str | bytes]:
    # Both APIs iterate metadata as (key, value) pairs (grpc.aio.Metadata, or a tuple of
    # grpc's _Metadatum).
    return {key: value for key, value in (metadata or ())}


def _int_or_none(value: str | bytes | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


__all__ = [
    "BASE_OPTIONS",
    "BEGIN",
    "CLIENT_CHANNEL_OPTIONS",
    "END",
    "EPOCH",
    "FORWARDED",
    "MAX_MESSAGE_LENGTH",
    "NEXT",
    "NOT_ATTEMPTED",
    "PEER_CHANNEL_OPTIONS",
    "REASON",
    "SERVER_OPTIONS",
    "ErrorDetails",
    "Reason",
    "not_attempted",
    "parse_reason",
]
