"""`RpcError`: an error a replica answers a request with, and its reason on the wire."""

from __future__ import annotations

import grpc

from rlog.client.errors import is_connect_failure
from rlog.wire import ErrorDetails, Reason, not_attempted


class RpcError(Exception):
    """An error for the client: its `Reason` (which fixes the gRPC status code, see
    `rlog.wire`), a one-line message for people, and the structured fields the
    reason carries (`begin` for TRUNCATED, `end` for PAST_END, `next_position` and `epoch`
    for CONDITION_FAILED). `code` is only for
    `Reason.INTERNAL`, which keeps the code of the error it wraps."""

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        begin: int | None = None,
        end: int | None = None,
        next_position: int | None = None,
        epoch: int | None = None,
        code: grpc.StatusCode | None = None,
    ) -> None:
        super().__init__(message)
        resolved = reason.code or code
        if resolved is None:
            raise ValueError(f"{reason.name} needs an explicit status code")
        self.code: grpc.StatusCode = resolved
        self.message = message
        self.details = ErrorDetails(reason, begin, end, next_position, epoch)

    @property
    def reason(self) -> Reason:
        return self.details.reason

    @classmethod
    def from_leader(cls, exc: grpc.aio.AioRpcError, mutating: bool) -> RpcError:
        """The error to answer a forwarded request with when the leader's call failed.
        The leader's own verdict passes through with its reason and fields; an error of
        gRPC's own (no reason) is classified: for an append or truncation (`mutating`), a
        connection broken after the request may have reached the leader is an unknown
        outcome."""
        details = exc.details() or ""
        trailers = exc.trailing_metadata()
        verdict = ErrorDetails.from_metadata(trailers)
        message = f"leader: {details}"
        if verdict is not None:
            return cls(
                verdict.reason,
                message,
                begin=verdict.begin,
                end=verdict.end,
                next_position=verdict.next_position,
                epoch=verdict.epoch,
                code=exc.code(),
            )
        code = exc.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            if not mutating or not_attempted(trailers) or is_connect_failure(details):
                return cls(Reason.LEADER_UNAVAILABLE, message)
            return cls(Reason.OUTCOME_UNKNOWN, f"{message} (outcome unknown)")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return cls(Reason.TIMEOUT, f"{message} (outcome unknown)" if mutating else message)
        return cls(Reason.INTERNAL, message, code=code)
