"""Typed client errors, chosen by the reason an rlog server gives for an error.

Every error carries the server's one-line message (`str(error)`), the gRPC code, and the
endpoint that answered. An rlog server sends a machine-readable `Reason` with each error
(`rlog.wire`); the class follows from it, never from the message text:

| reason                     | gRPC code           | error                         |
| -------------------------- | ------------------- | ----------------------------- |
| TRUNCATED                  | OUT_OF_RANGE        | `Truncated` (with `begin`)    |
| PAST_END                   | OUT_OF_RANGE        | `PastEnd` (with `end`)        |
| INVALID_ARGUMENT           | INVALID_ARGUMENT    | `InvalidArgument`             |
| ENTRY_TOO_LARGE            | INVALID_ARGUMENT    | `EntryTooLarge`               |
| NOT_VOTING                 | FAILED_PRECONDITION | `NotVoting`                   |
| LOG_ID_MISMATCH            | FAILED_PRECONDITION | `LogIdMismatch`               |
| PROTOCOL_TOO_OLD (peers)   | FAILED_PRECONDITION | `FailedPrecondition`          |
| CONDITION_FAILED           | FAILED_PRECONDITION | `ConditionFailed` (with       |
|                            |                     | `next_position`, `epoch`)     |
| SESSION_EXPIRED            | FAILED_PRECONDITION | `SessionExpired`              |
| SEQUENCE_FORGOTTEN         | FAILED_PRECONDITION | `SequenceForgotten`           |
| EPOCH_FROM_FUTURE          | INVALID_ARGUMENT    | `EpochFromFuture`             |
| UNKNOWN_SESSION            | NOT_FOUND           | `UnknownSession`              |
| SESSION_NOT_YOURS          | PERMISSION_DENIED   | `SessionNotYours`             |
| NO_LEADER, NOT_LEADER,     | UNAVAILABLE         | `Unavailable` (the request    |
| LEADER_UNAVAILABLE,        |                     | changed nothing)              |
| NOT_LEARNED,               |                     |                               |
| LEADERSHIP_UNCONFIRMED     |                     |                               |
| STOPPING                   | UNAVAILABLE         | `Unavailable`                 |
| TIMEOUT                    | DEADLINE_EXCEEDED   | `Timeout`                     |
| OUTCOME_UNKNOWN            | ABORTED             | `OutcomeUnknown`              |
| INTERNAL                   | (the wrapped one's) | `RlogError`                   |
| (none: authorization)      | PERMISSION_DENIED   | `PermissionDenied`            |
| (none: unknown token)      | UNAUTHENTICATED     | `Unauthenticated`             |

An error without a reason did not come from an rlog server's own verdict (gRPC's transport
errors, a deadline that expired on the client's side, a message over gRPC's size limit):
its class follows from the gRPC status code alone (see `error_for`).

An append (or truncate) whose outcome is unknown -- it may or may not be in the log -- always
raises an `OutcomeUnknown`: besides OUTCOME_UNKNOWN, a timeout of an append raises
`OutcomeUnknownTimeout` (a `Timeout` and an `OutcomeUnknown`) and a connection lost (or a
replica stopping) while an append was in flight raises `OutcomeUnknownUnavailable` (an
`Unavailable` and an `OutcomeUnknown`). Never retry those blindly: read the log to find out.
(The client itself re-sends such an append in its session, where a retry cannot apply it
twice, until the append deadline; an append still unknown then raises one of these, or
`SessionExpiredOutcomeUnknown` if its session expired in between.)
"""

from __future__ import annotations

from typing import Any

import grpc

from rlog.proto import rlog_pb2 as pb
from rlog.wire import ErrorDetails, Reason, parse_reason


class RlogError(Exception):
    """Base class of every error the rlog client raises."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.endpoint = endpoint

    def __str__(self) -> str:
        return self.message


class Unavailable(RlogError):
    """No replica could serve the request: unreachable, no leader known, no quorum."""


class OutOfRange(RlogError):
    """A position outside [begin, end] of the log."""


class Truncated(OutOfRange):
    """The position is below the beginning of the log. `begin` is the first position left,
    when the server said so."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        endpoint: str | None = None,
        begin: int | None = None,
    ) -> None:
        super().__init__(message, code, endpoint)
        self.begin = begin


class PastEnd(OutOfRange):
    """The position is past the end of the log. `end` is the last learned position, when the
    server said so."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        endpoint: str | None = None,
        end: int | None = None,
    ) -> None:
        super().__init__(message, code, endpoint)
        self.end = end


class InvalidArgument(RlogError, ValueError):
    """The request is malformed (e.g. `from` after `to`)."""


class EntryTooLarge(InvalidArgument):
    """A value exceeds the maximum entry size (or the gRPC message limit)."""


class Timeout(RlogError):
    """The call did not complete within its deadline."""


class FailedPrecondition(RlogError):
    """The replica cannot serve the request in its current state."""


class NotVoting(FailedPrecondition):
    """The replica is not VOTING (EMPTY, STARTING or RECOVERING)."""


class LogIdMismatch(FailedPrecondition):
    """The replica belongs to another log."""


class ConditionFailed(FailedPrecondition):
    """An append's condition did not hold; nothing was appended. `next_position` and
    `epoch` are the log's next position and writer epoch when it was refused."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        endpoint: str | None = None,
        next_position: int | None = None,
        epoch: int | None = None,
    ) -> None:
        super().__init__(message, code, endpoint)
        self.next_position = next_position
        self.epoch = epoch


class SessionExpired(FailedPrecondition):
    """The append's session is past the log's session window (or was truncated away):
    nothing was appended, and whether an earlier try of it is in the log cannot be told."""


class SequenceForgotten(FailedPrecondition):
    """The append's sequence is below the answers its client already acknowledged."""


class UnknownSession(RlogError):
    """No session with this id was ever opened in the log."""


class EpochFromFuture(InvalidArgument):
    """The append's writer epoch was never taken in this log."""


class OutcomeUnknown(RlogError):
    """The append (or truncate) may or may not be in the log. Do not retry it blindly."""


class OutcomeUnknownTimeout(Timeout, OutcomeUnknown):
    """An append timed out: it may still be chosen."""


class OutcomeUnknownUnavailable(Unavailable, OutcomeUnknown):
    """The connection broke while an append was in flight: it may have been chosen."""


class ResourceExhausted(RlogError):
    """A replica refused the request for lack of a resource: its disk is full (DISK_FULL,
    nothing was proposed) or a configured limit was reached (LIMIT_EXCEEDED)."""


class DataCorrupt(RlogError):
    """A replica found a stored record that failed its checksum; it served none of it and is
    repairing itself. Another replica can serve the request."""


class SessionExpiredOutcomeUnknown(SessionExpired, OutcomeUnknown):
    """An exactly-once append's retry found its session expired: an earlier try may be in
    the log (the client re-sent it because that try's outcome was unknown)."""


class PermissionDenied(RlogError):
    """The caller's role does not allow the call (docs/security.md); it changed nothing."""


class SessionNotYours(PermissionDenied):
    """A session append without the secret OpenSession gave the session's opener (or in a
    session opened before sessions had secrets): nothing was appended."""


class Unauthenticated(PermissionDenied):
    """The replica does not know the caller's credentials (an unknown bearer token)."""


# Substrings of gRPC's own UNAVAILABLE details (the gRPC library's messages, not rlog's) that
# mean no connection was ever made, so the request certainly reached no server and is safe
# to send elsewhere.
_CONNECT_FAILURES = (
    "failed to connect",
    "connection refused",
    "connect failed",
    "dns resolution failed",
    "name resolution",
    "no route to host",
    "network is unreachable",
    "address not available",
    "cannot assign requested address",
)


def is_connect_failure(details: str) -> bool:
    """True if gRPC's UNAVAILABLE details say no connection could be made at all."""
    text = details.lower()
    return any(marker in text for marker in _CONNECT_FAILURES)


def short_details(details: str) -> str:
    """gRPC's connection errors are long; keep the one clause a user needs."""
    text = " ".join(details.split())
    lower = text.lower()
    for marker in ("connection refused", "no route to host", "network is unreachable"):
        if marker in lower:
            return marker
    if "dns resolution failed" in lower or "name resolution" in lower:
        return "name resolution failed"
    if "certificate_verify_failed" in lower:
        return (
            "TLS handshake failed: the replica's certificate does not verify against the CA "
            "given, or lacks the name dialled (--server-name)"
        )
    if "handshake" in lower:
        return "TLS handshake failed"
    if "failed to connect" in lower:
        return "failed to connect"
    return text


# The class of each reason: (for a call that changes nothing, for an append or truncation).
REASON_CLASSES: dict[Reason, tuple[type[RlogError], type[RlogError]]] = {
    Reason.TRUNCATED: (Truncated, Truncated),
    Reason.PAST_END: (PastEnd, PastEnd),
    Reason.INVALID_ARGUMENT: (InvalidArgument, InvalidArgument),
    Reason.ENTRY_TOO_LARGE: (EntryTooLarge, EntryTooLarge),
    Reason.NOT_VOTING: (NotVoting, NotVoting),
    Reason.LOG_ID_MISMATCH: (LogIdMismatch, LogIdMismatch),
    # the peer protocol's only: a replica refusing an older build's peer message
    Reason.PROTOCOL_TOO_OLD: (FailedPrecondition, FailedPrecondition),
    Reason.CONDITION_FAILED: (ConditionFailed, ConditionFailed),
    Reason.SESSION_EXPIRED: (SessionExpired, SessionExpired),
    Reason.SEQUENCE_FORGOTTEN: (SequenceForgotten, SequenceForgotten),
    Reason.EPOCH_FROM_FUTURE: (EpochFromFuture, EpochFromFuture),
    Reason.UNKNOWN_SESSION: (UnknownSession, UnknownSession),
    Reason.SESSION_NOT_YOURS: (SessionNotYours, SessionNotYours),
    Reason.NO_LEADER: (Unavailable, Unavailable),
    Reason.NOT_LEADER: (Unavailable, Unavailable),
    Reason.LEADER_UNAVAILABLE: (Unavailable, Unavailable),
    Reason.NOT_LEARNED: (Unavailable, Unavailable),
    Reason.LEADERSHIP_UNCONFIRMED: (Unavailable, Unavailable),
    Reason.STOPPING: (Unavailable, OutcomeUnknownUnavailable),
    Reason.TIMEOUT: (Timeout, OutcomeUnknownTimeout),
    Reason.OUTCOME_UNKNOWN: (OutcomeUnknown, OutcomeUnknown),
    Reason.INTERNAL: (RlogError, RlogError),
    Reason.DISK_FULL: (ResourceExhausted, ResourceExhausted),
    Reason.LIMIT_EXCEEDED: (ResourceExhausted, ResourceExhausted),
    Reason.CORRUPT_RECORD: (DataCorrupt, OutcomeUnknown),
    Reason.DISK_FAILING: (Unavailable, OutcomeUnknownUnavailable),
}


def error_class(reason: Reason, mutating: bool = False) -> type[RlogError]:
    """The class of the error an rlog server's `reason` raises (`mutating`: for an append
    or truncation)."""
    return REASON_CLASSES[reason][1 if mutating else 0]


def from_rpc_error(
    exc: grpc.RpcError,
    endpoint: str | None = None,
    mutating: bool = False,
) -> RlogError:
    """Map a gRPC error to a typed `RlogError`: by the reason in its trailers if an rlog
    server sent one, else by its status code. `mutating` marks appends and truncations,
    whose broken or timed-out calls have an unknown outcome."""
    code: grpc.StatusCode | None = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(code or exc)
    trailers: Any = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    return error_for(code, details, endpoint, mutating, ErrorDetails.from_metadata(trailers))


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def code_from_int(value: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a numeric code (as AppendStream responses carry it)."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


def error_for(
    code: grpc.StatusCode | None,
    details: str,
    endpoint: str | None = None,
    mutating: bool = False,
    why: ErrorDetails | None = None,
) -> RlogError:
    """The typed error for a gRPC status code, its details (the message) and, if an rlog
    server answered, the reason it gave (`why`); see the table above."""
    details = " ".join(str(details).split())
    if why is not None:
        return _for_reason(why, code, details, endpoint, mutating)
    return _for_code(code, details, endpoint, mutating)


def answer_error(response: pb.AppendResponse, endpoint: str) -> tuple[RlogError, bool]:
    """The error an append's answer on a stream or a lane carries (its code is not 0), and
    whether the server said it changed nothing (so the append may go elsewhere)."""
    reason = parse_reason(response.reason)
    why = (
        ErrorDetails(
            reason,
            response.begin if response.HasField("begin") else None,
            None,
            response.next_position,
            response.epoch,
        )
        if reason is not None
        else None
    )
    error = error_for(code_from_int(response.code), response.error, endpoint, True, why)
    return error, reason is not None and reason.not_attempted


def _for_reason(
    why: ErrorDetails,
    code: grpc.StatusCode | None,
    details: str,
    endpoint: str | None,
    mutating: bool,
) -> RlogError:
    where = f" ({endpoint})" if endpoint else ""
    cls = error_class(why.reason, mutating)
    if cls is Truncated:
        return Truncated(details, code, endpoint, begin=why.begin)
    if cls is PastEnd:
        return PastEnd(details, code, endpoint, end=why.end)
    if cls is ConditionFailed:
        return ConditionFailed(details, code, endpoint, why.next_position, why.epoch)
    if cls is Timeout:
        return Timeout(f"{details}{where}", code, endpoint)
    if cls is OutcomeUnknownUnavailable:
        return OutcomeUnknownUnavailable(f"{details}{where}: outcome unknown", code, endpoint)
    if cls is RlogError:
        return _unclassified(code, details, where, endpoint)
    # The server's message says it all (TIMEOUT's and OUTCOME_UNKNOWN's say "outcome
    # unknown" themselves).
    return cls(details, code, endpoint)


def _for_code(
    code: grpc.StatusCode | None, details: str, endpoint: str | None, mutating: bool
) -> RlogError:
    """An error that carries no rlog reason: gRPC's own (or a server's that predates
    reasons). Only gRPC's messages are looked at, never an rlog server's."""
    where = f" ({endpoint})" if endpoint else ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return InvalidArgument(details, code, endpoint)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # gRPC's message-size limit ("Sent message larger than max (9 vs. 8)"), prefixed with
        # the side whose limit it was.
        if "message" in details.lower() and "larger than max" in details.lower():
            if details.startswith("SERVER:"):
                # The server's answer was too big for the channel: not the caller's entry.
                return RlogError(f"response too large: {details}", code, endpoint)
            return EntryTooLarge(f"request too large: {details}", code, endpoint)
        return Unavailable(details, code, endpoint)
    if code == grpc.StatusCode.OUT_OF_RANGE:
        return OutOfRange(details, code, endpoint)
    if code == grpc.StatusCode.UNAVAILABLE:
        if is_connect_failure(details):
            return Unavailable(f"cannot reach {endpoint}: {short_details(details)}", code, endpoint)
        if mutating:
            return OutcomeUnknownUnavailable(
                f"connection lost during the request{where}: {details}: outcome unknown",
                code,
                endpoint,
            )
        return Unavailable(details, code, endpoint)
    if code == grpc.StatusCode.CANCELLED and mutating:
        # Our own cancellation never reaches here (the caller gets CancelledError): the
        # server ended the call, e.g. a replica stopping, or the connection under it. It may
        # have been applied, or forwarded to the leader and applied there.
        return OutcomeUnknownUnavailable(
            f"the replica cancelled the request{where}: {details}: outcome unknown",
            code,
            endpoint,
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if mutating:
            return OutcomeUnknownTimeout(f"{details}{where}: outcome unknown", code, endpoint)
        return Timeout(f"{details}{where}", code, endpoint)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return FailedPrecondition(details, code, endpoint)
    if code == grpc.StatusCode.ABORTED:
        return OutcomeUnknown(details, code, endpoint)
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return Unauthenticated(f"not authenticated{where}: {details}", code, endpoint)
    if code == grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"permission denied{where}: {details}", code, endpoint)
    return _unclassified(code, details, where, endpoint)


def _unclassified(
    code: grpc.StatusCode | None, details: str, where: str, endpoint: str | None
) -> RlogError:
    if code == grpc.StatusCode.CANCELLED:
        return RlogError(f"cancelled{where}: {details}", code, endpoint)
    name = code.name if code is not None else "error"
    return RlogError(f"{name}{where}: {details}", code, endpoint)


__all__ = [
    "REASON_CLASSES",
    "ConditionFailed",
    "DataCorrupt",
    "EntryTooLarge",
    "EpochFromFuture",
    "FailedPrecondition",
    "InvalidArgument",
    "LogIdMismatch",
    "NotVoting",
    "OutOfRange",
    "OutcomeUnknown",
    "OutcomeUnknownTimeout",
    "OutcomeUnknownUnavailable",
    "PastEnd",
    "PermissionDenied",
    "ResourceExhausted",
    "RlogError",
    "SequenceForgotten",
    "SessionExpired",
    "SessionExpiredOutcomeUnknown",
    "SessionNotYours",
    "Timeout",
    "Truncated",
    "Unauthenticated",
    "Unavailable",
    "UnknownSession",
    "code_from_int",
    "error_class",
    "error_for",
    "from_rpc_error",
    "is_connect_failure",
]
