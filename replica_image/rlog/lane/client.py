"""The client's append lane (docs/data-path.md, "The client's append lane"): appends sent to
a replica's lane port (its gRPC port + the `lane_offset` its Status gives) as
`AppendRequest` frames, answered with `AppendResponse` frames, instead of one gRPC call
each. The same requests and answers as the `AppendStream`, so the same sessions,
conditions and errors; what goes is gRPC's cost per call, on the client and on the replica.

The lane opens in the background (`FramedCaller`): the client asks the replica's Status for
its lane, connects and says hello, and until the lane is open (or while it is down, or when
the replica serves none) appends go on gRPC as before. Over TLS the lane is mutual TLS
only: the client presents its certificate (the roles of the gRPC port decide whether it
may append); a client that authenticates with a bearer token keeps to gRPC.

The error an answer carries is the client's to choose (`rlog.client.errors.answer_error`):
this module imports nothing of `rlog.client`, which imports it.
"""

from __future__ import annotations

import asyncio
import functools
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

import grpc

from rlog.lane.framed import (
    KINDS_VERSION,
    ConnectionBroken,
    Destination,
    FramedCaller,
    lane_address,
    parse,
)
from rlog.proto import rlog_pb2 as pb


class TlsCredentials(Protocol):
    """What the lane reads of the client's credentials (`rlog.client.Credentials`): PEM
    bytes of the CA, the client certificate and its key, and the name to check the
    replica's certificate for."""

    @property
    def ca(self) -> bytes | None: ...

    @property
    def cert(self) -> bytes | None: ...

    @property
    def key(self) -> bytes | None: ...

    @property
    def server_name(self) -> str | None: ...


def tls_context(credentials: TlsCredentials) -> ssl.SSLContext:
    """A client TLS context from PEM bytes: the CA (or the system's roots) verifies the
    replica, the client certificate is presented. Blocking (the standard library loads a
    certificate chain only from files: written to a private temporary directory, read,
    removed): call it off the event loop."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if credentials.ca is not None:
        context.load_verify_locations(cadata=credentials.ca.decode("ascii"))
    else:
        context.load_default_certs()
    if credentials.cert is not None and credentials.key is not None:
        with tempfile.TemporaryDirectory(prefix="rlog-lane-") as directory:
            cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
            for path, data in ((cert, credentials.cert), (key, credentials.key)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
            context.load_cert_chain(str(cert), str(key))
    return context


class AppendLane:
    """A client's append lane to the replica at `address` (its gRPC address)."""

    def __init__(
        self,
        address: str,
        status: Callable[[], Awaitable[pb.StatusResponse]],
        credentials: TlsCredentials | None,
        connect_timeout: float,
        max_answer: int,
    ) -> None:
        self.address = address
        self._status = status
        self._credentials = credentials
        self._tls: ssl.SSLContext | None = None
        self._caller: FramedCaller[pb.AppendResponse] = FramedCaller(
            self._locate,
            functools.partial(parse, pb.AppendResponse),
            connect_timeout,
            max_answer=max_answer,
        )

    @property
    def last_error(self) -> str:
        """Why the lane is not open, if it tried and failed ("" otherwise)."""
        return self._caller.last_error

    async def _locate(self) -> Destination:
        try:
            status = await self._status()
        except grpc.aio.AioRpcError as exc:
            raise ConnectionError(f"{self.address}: Status: {exc.details()}") from None
        if not status.lane_offset:
            raise ConnectionRefusedError(f"{self.address} serves no lane")
        host, port = lane_address(self.address, status.lane_offset)
        tls = None
        if status.transport and status.transport != "plaintext":
            credentials = self._credentials
            if credentials is None or credentials.cert is None:
                raise ConnectionRefusedError(
                    "the lane is mutual TLS only: the client has no certificate"
                )
            if self._tls is None:
                self._tls = await asyncio.to_thread(tls_context, credentials)
            tls = self._tls
        hello = pb.LaneHello(
            version=KINDS_VERSION,
            kind=pb.LANE_APPENDS,
            log_id=status.log_id,
            replica_id=status.id,
        )
        server_name = self._credentials.server_name if self._credentials else None
        return Destination(host, port, hello, tls, server_name)

    @property
    def is_open(self) -> bool:
        """Open now (nothing else is done: safe to ask from any thread)."""
        return self._caller.is_open

    def usable(self) -> bool:
        """Open now; if not, it opens in the background (after a back-off if it failed)."""
        return self._caller.usable()

    def append(
        self, request: pb.AppendRequest, deadline_s: float | None
    ) -> asyncio.Future[pb.AppendResponse]:
        """Send `request` (its id is set here) now; its answer in the future returned, or
        TimeoutError past `deadline_s`, or `ConnectionBroken` if the connection ends first
        (the append may or may not be in the log). Only while `usable()`."""
        request.id = self._caller.next_id()
        return self._caller.send(request.id, [request.SerializeToString()], deadline_s)

    def close(self) -> None:
        self._caller.close()

    async def aclose(self) -> None:
        """Close it and wait for an opening under way to end."""
        await self._caller.aclose()


__all__ = ["AppendLane", "ConnectionBroken", "TlsCredentials", "tls_context"]
