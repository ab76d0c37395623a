"""Typed client errors: one class per gRPC status code the replica server uses.

Every error carries the server's one-line message (`str(error)`), the gRPC code, and the
endpoint that answered. The mapping (see `from_rpc_error`):

| gRPC code           | error                                                      |
| ------------------- | ---------------------------------------------------------- |
| INVALID_ARGUMENT    | `InvalidArgument` (`EntryTooLarge` for an oversized value) |
| OUT_OF_RANGE        | `Truncated` / `PastEnd` (both `OutOfRange`)                |
| UNAVAILABLE         | `Unavailable`                                              |
| DEADLINE_EXCEEDED   | `Timeout`                                                  |
| FAILED_PRECONDITION | `NotVoting` / `LogIdMismatch` (both `FailedPrecondition`)  |
| ABORTED             | `OutcomeUnknown`                                           |

An append (or truncate) whose outcome is unknown -- it may or may not be in the log -- always
raises an `OutcomeUnknown`: besides ABORTED, a timeout of an append raises
`OutcomeUnknownTimeout` (a `Timeout` and an `OutcomeUnknown`) and a connection lost while an
append was in flight raises `OutcomeUnknownUnavailable` (an `Unavailable` and an
`OutcomeUnknown`). Never retry those blindly: read the log to find out.
"""

from __future__ import annotations

import re

import grpc


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
    ) -> None:
        super().__init__(message, code, endpoint)
        match = re.search(r"begins at (\d+)", message)
        self.begin: int | None = int(match.group(1)) if match else None


class PastEnd(OutOfRange):
    """The position is past the end of the log. `end` is the last learned position, when the
    server said so."""

    def __init__(
        self,
        message: str,
        code: grpc.StatusCode | None = None,
        endpoint: str | None = None,
    ) -> None:
        super().__init__(message, code, endpoint)
        match = re.search(r"\(end (\d+)\)", message)
        self.end: int | None = int(match.group(1)) if match else None


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


class OutcomeUnknown(RlogError):
    """The append (or truncate) may or may not be in the log. Do not retry it blindly."""


class OutcomeUnknownTimeout(Timeout, OutcomeUnknown):
    """An append timed out: it may still be chosen."""


class OutcomeUnknownUnavailable(Unavailable, OutcomeUnknown):
    """The connection broke while an append was in flight: it may have been chosen."""


# Substrings of gRPC's own UNAVAILABLE details that mean no connection was ever made, so the
# request certainly reached no server and is safe to send elsewhere.
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

# Server-side UNAVAILABLE messages for requests the server never attempted (rlog.runtime.node).
_NOT_ATTEMPTED = (
    "no leader",
    "this replica is not the leader",
    "not the leader",
    "not attempted",
)


def is_connect_failure(details: str) -> bool:
    """True if gRPC's UNAVAILABLE details say no connection could be made at all."""
    text = details.lower()
    return any(marker in text for marker in _CONNECT_FAILURES)


def _strip_leader_prefix(message: str) -> str:
    while message.startswith("leader: "):
        message = message[len("leader: ") :]
    return message


def short_details(details: str) -> str:
    """gRPC's connection errors are long; keep the one clause a user needs."""
    text = " ".join(details.split())
    lower = text.lower()
    for marker in ("connection refused", "no route to host", "network is unreachable"):
        if marker in lower:
            return marker
    if "dns resolution failed" in lower or "name resolution" in lower:
        return "name resolution failed"
    if "failed to connect" in lower:
        return "failed to connect"
    return text


def from_rpc_error(
    exc: grpc.RpcError,
    endpoint: str | None = None,
    mutating: bool = False,
) -> RlogError:
    """Map a gRPC error to a typed `RlogError`. `mutating` marks appends and truncations,
    whose broken or timed-out calls have an unknown outcome."""
    code: grpc.StatusCode | None = exc.code() if hasattr(exc, "code") else None
    details = (exc.details() if hasattr(exc, "details") else None) or str(code or exc)
    return error_for(code, details, endpoint, mutating)


_CODES = {code.value[0]: code for code in grpc.StatusCode}


def code_from_int(value: int) -> grpc.StatusCode:
    """The grpc.StatusCode of a numeric code (as AppendStream responses carry it)."""
    return _CODES.get(value, grpc.StatusCode.UNKNOWN)


def error_for(
    code: grpc.StatusCode | None,
    details: str,
    endpoint: str | None = None,
    mutating: bool = False,
) -> RlogError:
    """The typed error for a gRPC status code and its details (see `from_rpc_error`)."""
    details = " ".join(str(details).split())
    where = f" ({endpoint})" if endpoint else ""
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        if "exceeds the maximum entry size" in details:
            return EntryTooLarge(details, code, endpoint)
        return InvalidArgument(details, code, endpoint)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        if "message" in details.lower() and "larger than max" in details.lower():
            if details.startswith("SERVER:"):
                # The server's answer was too big for the channel: not the caller's entry.
                return RlogError(f"response too large: {details}", code, endpoint)
            return EntryTooLarge(f"request too large: {details}", code, endpoint)
        return Unavailable(details, code, endpoint)
    if code == grpc.StatusCode.OUT_OF_RANGE:
        if "truncated" in details or "already begins at" in details:
            return Truncated(details, code, endpoint)
        if "past the end" in details:
            return PastEnd(details, code, endpoint)
        return OutOfRange(details, code, endpoint)
    if code == grpc.StatusCode.UNAVAILABLE:
        if is_connect_failure(details) and not details.startswith("leader: "):
            return Unavailable(f"cannot reach {endpoint}: {short_details(details)}", code, endpoint)
        inner = _strip_leader_prefix(details)
        if mutating and not is_connect_failure(inner) and not inner.startswith(_NOT_ATTEMPTED):
            return OutcomeUnknownUnavailable(
                f"connection lost during the request{where}: {details}: outcome unknown",
                code,
                endpoint,
            )
        return Unavailable(details, code, endpoint)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        if mutating:
            if "outcome unknown" not in details:
                details = f"{details}{where}: outcome unknown"
            return OutcomeUnknownTimeout(details, code, endpoint)
        return Timeout(f"{details}{where}", code, endpoint)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        if "log id mismatch" in details:
            return LogIdMismatch(details, code, endpoint)
        return NotVoting(details, code, endpoint)
    if code == grpc.StatusCode.ABORTED:
        return OutcomeUnknown(details, code, endpoint)
    if code == grpc.StatusCode.CANCELLED:
        return RlogError(f"cancelled{where}: {details}", code, endpoint)
    name = code.name if code is not None else "error"
    return RlogError(f"{name}{where}: {details}", code, endpoint)


__all__ = [
    "EntryTooLarge",
    "FailedPrecondition",
    "InvalidArgument",
    "LogIdMismatch",
    "NotVoting",
    "OutOfRange",
    "OutcomeUnknown",
    "OutcomeUnknownTimeout",
    "OutcomeUnknownUnavailable",
    "PastEnd",
    "RlogError",
    "Timeout",
    "Truncated",
    "Unavailable",
    "code_from_int",
    "error_for",
    "from_rpc_error",
    "is_connect_failure",
]
