"""The client's endpoints: a channel to each (made on first use), the current one, and going
round them as far as that is safe.

Any replica serves any request (appends, truncations and consistent reads are forwarded to
the leader), so several endpoints are only for availability. The client sticks to the
endpoint that last answered and moves to the next one when

- the request certainly reached no server (the connection could not be made), for every
  call, including appends;
- the server answered UNAVAILABLE or the call timed out, for calls that change nothing
  (status, read, tail, permits): those are safe to repeat. A read or tail broken mid-stream
  resumes after the last entry it yielded (`Endpoints.resumable`);
- a read or tail got no first answer within `start_timeout` and the endpoint then did not
  answer a status probe within `start_timeout` either: a replica that stopped (SIGSTOP, a
  partition) keeps its connection open, and the call waited for gRPC's connect timeout
  (about 20 s) or keepalive (about a minute) (`Endpoints.first_answer`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any, TypeVar

import grpc

from rlog.client.errors import RlogError, Timeout, Unavailable, from_rpc_error, is_connect_failure
from rlog.client.packing import last_position
from rlog.client.security import Credentials, secure_channel
from rlog.config import parse_address
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.wire import ErrorDetails, not_attempted

T = TypeVar("T")


class Endpoint:
    def __init__(
        self, address: str, options: list[tuple[str, Any]], credentials: Credentials | None
    ) -> None:
        self.address = address
        self.channel = secure_channel(address, credentials, options)
        self.log = pbg.LogStub(self.channel)
        self.admin = pbg.AdminStub(self.channel)


def never_connected(exc: grpc.aio.AioRpcError) -> bool:
    """Did this call fail because gRPC could make no connection (so no server saw it)?"""
    return (
        exc.code() == grpc.StatusCode.UNAVAILABLE
        and ErrorDetails.from_metadata(exc.trailing_metadata()) is None
        and is_connect_failure(exc.details() or "")
    )


def safe_to_move_on(exc: grpc.aio.AioRpcError, mutating: bool) -> bool:
    """May this failed call be sent to another endpoint?"""
    code = exc.code()
    trailers = exc.trailing_metadata()
    why = ErrorDetails.from_metadata(trailers)
    if why is not None and why.reason.not_attempted:
        return True  # the server said exactly that it changed nothing
    if code == grpc.StatusCode.UNAVAILABLE:
        if why is None and is_connect_failure(exc.details() or ""):
            return True  # gRPC made no connection: the request reached no server
        if why is None and not_attempted(trailers):
            return True  # a server that predates reasons said it changed nothing
        return not mutating
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return not mutating
    return False


def all_failed(errors: list[RlogError]) -> RlogError:
    if len(errors) == 1:
        return errors[0]
    if all(isinstance(e, Timeout) for e in errors):
        return Timeout("every endpoint timed out: " + "; ".join(str(e) for e in errors))
    return Unavailable("no endpoint could serve the request: " + "; ".join(str(e) for e in errors))


class StartExpired(Exception):
    """A read or tail got no first answer and its endpoint answered no probe (`error`)."""

    def __init__(self, error: RlogError) -> None:
        super().__init__(str(error))
        self.error = error


class Endpoints:
    """The endpoints of one client, in order; `current` indexes the one the next request
    goes to first. `connect_wait`: when no endpoint can be connected to, how long a call
    waits for one to accept a connection before it fails `Unavailable`. `start_timeout`:
    see `first_answer` (None: no bound)."""

    def __init__(
        self,
        addresses: list[str],
        options: list[tuple[str, Any]],
        credentials: Credentials | None,
        connect_wait: float,
        start_timeout: float | None = None,
    ) -> None:
        self._addresses = addresses
        self._options = options
        self._credentials = credentials
        self.connect_wait = connect_wait
        self.start_timeout = start_timeout
        self._endpoints: list[Endpoint | None] = [None] * len(addresses)
        self.current = 0
        self.closed = False  # every later request fails "the client is closed"

    @property
    def addresses(self) -> list[str]:
        return list(self._addresses)

    @property
    def current_address(self) -> str:
        return self._addresses[self.current]

    def endpoint(self, index: int) -> Endpoint:
        if self.closed:
            raise RlogError("the client is closed")
        endpoint = self._endpoints[index]
        if endpoint is None:
            endpoint = Endpoint(self._addresses[index], self._options, self._credentials)
            self._endpoints[index] = endpoint
        return endpoint

    def order(self) -> list[int]:
        n = len(self._addresses)
        return [(self.current + i) % n for i in range(n)]

    def index_of(self, endpoint: str) -> int:
        address = parse_address(endpoint, "endpoint")
        if address not in self._addresses:
            self._addresses.append(address)
            self._endpoints.append(None)
        return self._addresses.index(address)

    async def call(
        self,
        invoke: Callable[[Endpoint], Awaitable[T]],
        *,
        mutating: bool,
        endpoint: str | None = None,
    ) -> T:
        """Run a unary call, moving to the next endpoint only when that is safe; if no
        endpoint could even be connected to, wait (up to `connect_wait`) for one to accept a
        connection and go round once more."""
        order = self.order() if endpoint is None else [self.index_of(endpoint)]
        give_up_at: float | None = None
        while True:
            errors: list[RlogError] = []
            unreached = True  # every endpoint failed before a connection was made
            for index in order:
                target = self.endpoint(index)
                try:
                    result = await invoke(target)
                except grpc.aio.AioRpcError as exc:
                    error = from_rpc_error(exc, target.address, mutating)
                    if safe_to_move_on(exc, mutating):
                        errors.append(error)
                        unreached = unreached and never_connected(exc)
                        continue
                    raise error from None
                self.current = index
                return result
            give_up_at = await self.wait_for_a_connection(order, unreached, give_up_at)
            if give_up_at is None:
                raise all_failed(errors)

    async def wait_for_a_connection(
        self, order: list[int], unreached: bool, give_up_at: float | None
    ) -> float | None:
        """After a round in which no endpoint could be connected to: wait until one of them
        is connected, but not past `give_up_at` (set now to `connect_wait` from the first
        such round). Returns the time to give up at, or None if the caller should fail now.

        A replica that is up can still refuse for a moment: after a connection drops, gRPC
        waits (up to the reconnect back-off, 1 s) before dialling again, and a call in that
        window fails at once without trying. Failing the call then would make a client
        whose every connection was just cut fail though every replica is up."""
        if not unreached or self.connect_wait <= 0:
            return None
        loop = asyncio.get_running_loop()
        if give_up_at is None:
            give_up_at = loop.time() + self.connect_wait
        left = give_up_at - loop.time()
        if left <= 0:
            return None
        waits = [
            asyncio.ensure_future(self.endpoint(index).channel.channel_ready()) for index in order
        ]
        try:
            done, _ = await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return give_up_at if done else None

    async def resumable(
        self,
        open_call: Callable[[Endpoint, int | None], Any],
        from_: int | None,
        done: Callable[[int | None], bool],
        ended: Callable[[str], RlogError | None],
        endpoint: str | None = None,
    ) -> AsyncGenerator[pb.ReadResponse, None]:
        """Stream the non-empty responses of the endpoints in turn: a stream broken where
        moving on is safe resumes on the next endpoint after the last entry it yielded.
        `done(next)` says the wanted range is complete; `ended(address)` is raised when a
        stream ends normally (None: a normal end is the end). `endpoint`: that endpoint only,
        its error raised as it is."""
        next_from = from_
        order = self.order() if endpoint is None else [self.index_of(endpoint)]
        attempt = 0
        errors: list[RlogError] = []
        unreached = True  # every failure since the last response made no connection
        give_up_at: float | None = None
        while True:
            if done(next_from):
                return
            index = order[attempt % len(order)]
            target = self.endpoint(index)
            call = open_call(target, next_from)
            try:
                response = await self.first_answer(target, call)
                while isinstance(response, pb.ReadResponse):  # else EOF: the stream ended
                    last = last_position(response)
                    if last is not None:
                        self.current = index
                        errors.clear()
                        unreached, give_up_at = True, None
                        next_from = last + 1
                        yield response
                    response = await call.read()
            except (grpc.aio.AioRpcError, StartExpired) as exc:
                if isinstance(exc, StartExpired):
                    # As an UNAVAILABLE: the call changed nothing, and a connection was made
                    # (or is being made), so no waiting for one.
                    error, safe, unreached = exc.error, True, False
                else:
                    error = from_rpc_error(exc, target.address)
                    safe = safe_to_move_on(exc, mutating=False)
                    unreached = unreached and never_connected(exc)
                attempt += 1
                if safe and len(errors) + 1 < len(order):
                    errors.append(error)
                    continue
                if safe and unreached:
                    # A whole round reached no server: wait for a connection, as `call`.
                    give_up_at = await self.wait_for_a_connection(order, True, give_up_at)
                    if give_up_at is not None:
                        errors.clear()
                        continue
                if errors:
                    errors.append(error)
                    raise all_failed(errors) from None
                raise error from None
            finally:
                call.cancel()
            self.current = index
            end_error = ended(target.address)
            if end_error is not None:
                raise end_error
            return

    async def first_answer(self, target: Endpoint, call: Any) -> object:
        """The first answer of a read or tail `call` to `target` (a response, or
        grpc.aio.EOF), or `StartExpired` if none came within `start_timeout` and `target`
        then answered no status probe within `start_timeout` either (so at most twice
        `start_timeout`); the caller cancels the call and moves on.

        Why the probe: a tail from the end of the log rightly answers nothing until an
        entry is appended, and a read that waits for `min_position`, or a follower's
        forwarded start of a read (itself bounded by the replica: LEADER_UNAVAILABLE), may
        take longer; a replica that answers a probe is there, and its call is left to run.
        Only the start is bounded: once a stream answered, it may be idle for as long as
        the log is (a read's own deadline, `read_timeout`, still bounds the whole read)."""
        limit = self.start_timeout
        if limit is None:
            return await call.read()
        read = asyncio.ensure_future(call.read())
        try:
            done, _ = await asyncio.wait([read], timeout=limit)
            if done:
                return read.result()
            try:
                await target.log.Status(pb.StatusRequest(local=True), timeout=limit)
            except grpc.aio.AioRpcError as exc:
                silent = exc.code() in (
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    grpc.StatusCode.UNAVAILABLE,
                )
                if silent and not read.done():
                    raise StartExpired(
                        Unavailable(
                            f"{target.address} did not start the stream within {limit:g} s "
                            f"nor answer a status probe within {limit:g} s "
                            f"({exc.code().name})",
                            code=grpc.StatusCode.UNAVAILABLE,
                            endpoint=target.address,
                        )
                    ) from None
            return await read  # the replica answered: it is there
        finally:
            read.cancel()  # a no-op once done

    async def close(self) -> None:
        """Close every channel (`closed` is set first, by the client, as it begins closing)."""
        self.closed = True
        endpoints, self._endpoints = self._endpoints, [None] * len(self._addresses)
        for endpoint in endpoints:
            if endpoint is not None:
                await endpoint.channel.close(grace=None)


__all__ = [
    "Endpoint",
    "Endpoints",
    "StartExpired",
    "all_failed",
    "never_connected",
    "safe_to_move_on",
]
