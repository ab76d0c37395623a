"""Errors the replica answers its clients with, shared by the node, its peers and the server."""

from __future__ import annotations

import grpc

NOT_ATTEMPTED = "rlog-not-attempted"  # trailing metadata: the request changed nothing


def not_attempted(exc: grpc.aio.AioRpcError) -> bool:
    """Whether an rlog server said (exactly, by trailing metadata) that it did nothing."""
    trailers = exc.trailing_metadata()
    return trailers is not None and NOT_ATTEMPTED in trailers


class RpcError(Exception):
    """An error for the client, with the gRPC status code to send."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
