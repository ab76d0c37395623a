"""The rlog client library: `AsyncClient` (grpc.aio) and `Client` (blocking).

    with Client("10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000") as log:
        first, second = log.append([b"a", "b"])
        for entry in log.read(from_=first):
            print(entry.position, entry.value)

Any replica serves any request (appends, truncations and consistent reads are forwarded to
the leader), so several endpoints are only for availability. The client sticks to the
endpoint that last answered and moves to the next one when

- the request certainly reached no server (the connection could not be made), for every
  call, including appends;
- the server answered UNAVAILABLE or the call timed out, for calls that change nothing
  (status, read, tail, permits): those are safe to repeat. A read or tail broken mid-stream
  resumes after the last entry it yielded.

Appends are exactly-once by default: the client opens a session (one SESSION entry in the
log, lazily, on its first append) and sends each append with (session, sequence number); an
append whose outcome is unknown (a lost connection, a leadership change, a replica stopping)
is sent again with the same pair until the append deadline, and the log answers a retry of
an append it already holds with the original positions. An append whose session expired
before its retry got through raises `SessionExpired` (its outcome stays unknown); the
client opens a new session for later appends. `exactly_once=False` turns sessions off: an
append is then never re-sent once it may have reached a server, and an unknown outcome
raises an `rlog.client.errors.OutcomeUnknown`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import (
    AsyncGenerator,
    Coroutine,
    Generator,
    Iterable,
    Iterator,
    Sequence,
)
from typing import Any, TypeVar

import grpc

from rlog import event_loop
from rlog.client.append_stream import AppendStreams
from rlog.client.carrier import (
    AppendFacts,
    Carrier,
    CarrierFacts,
    Route,
    choose_carrier,
    choose_route,
)
from rlog.client.endpoints import Endpoints
from rlog.client.errors import (
    OutcomeUnknownTimeout,
    OutcomeUnknownUnavailable,
    RlogError,
)
from rlog.client.grouping import AppendGroups
from rlog.client.lane import AppendLane, ConnectionBroken, answer_error
from rlog.client.packing import (
    Payload,
    answered_positions,
    pairs_of,
    runs_of,
)
from rlog.client.reads import read_responses, tail_responses
from rlog.client.security import Credentials
from rlog.client.sessions import ExactlyOnce
from rlog.client.values import Entry, Value, encode_value, parse_endpoints
from rlog.client.wire import CLIENT_CHANNEL_OPTIONS
from rlog.proto import rlog_pb2 as pb

T = TypeVar("T")

DEFAULT_TIMEOUT = 30.0
# Longer than the server's append timeout plus forwarding, so the server's own verdict
# (DEADLINE_EXCEEDED with its message, or ABORTED) normally arrives first.
DEFAULT_APPEND_TIMEOUT = 60.0
# How long a call waits for some endpoint to accept a connection when none could be
# connected to: twice gRPC's longest reconnect back-off here (rlog.client.wire).
DEFAULT_CONNECT_WAIT = 2.0
# The largest answer an append lane takes (an answer is a few dozen bytes; one listing
# positions one by one, from a server that predates ranges, can be larger).
LANE_MAX_ANSWER = 64 * 1024 * 1024


class AsyncClient:
    """An asyncio client of an rlog log. Use it within one event loop.

    `endpoints`: "H:P", "H:P,H:P,..." or a list of those. `timeout` bounds unary calls
    (status, admin), `append_timeout` appends and truncations, `read_timeout` a whole read
    (None: no deadline). Tails have no deadline. `stream=True` sends appends multiplexed on
    one `AppendStream` call per endpoint (cheaper per append for many concurrent writers);
    every append still gets its own result, and the same errors. `last_appended` is the
    highest position this client's appends were given (0: none yet): a stale read with
    `min_position=last_appended` sees them (read-your-writes). `connect_wait`: when no
    endpoint can be connected to, how long a call waits for one to accept a connection
    before it fails `Unavailable` (0: at once; a probe of one replica's state wants that).
    `lane=True`: appends that would be unary calls travel on the replica's append lane once
    it is open (docs/data-path.md, "The client's append lane": the same requests, answers,
    sessions and errors without gRPC's cost per call; on gRPC until then, and whenever the
    replica serves no lane).
    """

    def __init__(
        self,
        endpoints: str | Iterable[str],
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        append_timeout: float | None = DEFAULT_APPEND_TIMEOUT,
        read_timeout: float | None = None,
        channel_options: Iterable[tuple[str, Any]] = (),
        stream: bool = False,
        exactly_once: bool = True,
        credentials: Credentials | None = None,
        connect_wait: float = DEFAULT_CONNECT_WAIT,
        lane: bool = False,
    ) -> None:
        addresses = parse_endpoints(endpoints)
        self.credentials = credentials
        self.stream = stream
        if lane and stream:
            raise ValueError("an append lane replaces the unary calls: give lane or stream")
        if lane and credentials is not None and credentials.token is not None:
            raise ValueError(
                "the append lane authenticates by client certificate: a client with a "
                "bearer token appends on gRPC (lane=False)"
            )
        self.lane = lane
        self._lanes: dict[int, AppendLane] = {}
        self.exactly_once = exactly_once
        # Appends re-sent because their outcome was unknown (exactly-once mode).
        self.retried_appends = 0
        # AppendRequests sent (each try, each coalesced request, counts once).
        self.append_requests = 0
        self._exactly_once = ExactlyOnce(self, self._send_once, self._count_unknown_outcome)
        self._groups = AppendGroups(self._exactly_once.append)
        self.timeout = timeout
        self.append_timeout = append_timeout
        self.read_timeout = read_timeout
        extra = list(channel_options)
        keys = {key for key, _ in extra}
        options = [opt for opt in CLIENT_CHANNEL_OPTIONS if opt[0] not in keys] + extra
        self._endpoints = Endpoints(addresses, options, credentials, connect_wait)
        self._streams = AppendStreams(self._endpoints, self._count_request)
        self.last_appended = 0

    @property
    def endpoints(self) -> list[str]:
        return self._endpoints.addresses

    @property
    def current_endpoint(self) -> str:
        """The endpoint the next request goes to first."""
        return self._endpoints.current_address

    @property
    def connect_wait(self) -> float:
        return self._endpoints.connect_wait

    @connect_wait.setter
    def connect_wait(self, seconds: float) -> None:
        self._endpoints.connect_wait = seconds

    # ---- the log -----------------------------------------------------------------------

    async def append(
        self,
        values: Iterable[Value] | Value,
        *,
        if_next: int | None = None,
        epoch: int = 0,
    ) -> list[int]:
        """Append values (bytes, or str encoded as UTF-8) as consecutive entries; returns
        their positions. Raises `OutcomeUnknown` if the append may or may not be in the log.

        Conditions (all or nothing: a failed one raises `ConditionFailed`, which carries the
        log's next position and epoch, and appends nothing): `if_next=P` appends only if the
        log's next position is P; `epoch=E` only if E (from `take_epoch`) is still the log's
        highest writer epoch."""
        if isinstance(values, str | bytes | bytearray | memoryview):
            values = [values]
        payload = Payload.of_values([encode_value(v) for v in values])
        return list(await self._append_payload(payload, if_next, epoch))

    async def append_packed(
        self, data: bytes, offsets: bytes, *, if_next: int | None = None, epoch: int = 0
    ) -> Sequence[int]:
        """Like `append`, for values already packed (docs/data-path.md: `data`, and count+1
        little-endian uint32 `offsets`, an Arrow binary column's layout): no Python object
        per value on the way. Returns the positions as a `range` (a list from a server that
        predates packed answers). Bad offsets: `InvalidArgument`, nothing appended."""
        return await self._append_payload(Payload.of_packed(data, offsets), if_next, epoch)

    async def _append_payload(
        self, payload: Payload, if_next: int | None, epoch: int
    ) -> Sequence[int]:
        request = pb.AppendRequest(epoch=epoch)
        if if_next is not None:
            request.if_next = if_next
        if not payload.count and not payload.data:
            return []
        facts = AppendFacts(
            exactly_once=self.exactly_once,
            if_next=if_next is not None,
            epoch=bool(epoch),
            session_open=self._exactly_once.session.is_open,
        )
        choice = choose_route(facts)
        if choice.route is Route.GROUP:
            positions = await self._groups.append(payload, self._append_deadline())
        elif choice.route is Route.SESSION:
            positions = await self._exactly_once.append(
                payload, request, self._append_deadline(), renew=choice.renew
            )
        else:
            fields = request if facts.if_next or facts.epoch else None
            positions = await self._send_once(payload, fields, self.append_timeout)
        if len(positions) != payload.count:
            raise RlogError(
                f"the server returned {len(positions)} positions for {payload.count} values"
            )
        # Read-your-writes: a stale read with min_position=last_appended sees this append.
        self.last_appended = max(self.last_appended, positions[-1])
        return positions

    def _append_deadline(self) -> float | None:
        """The event-loop time an append starting now must be answered by (None: never)."""
        if self.append_timeout is None:
            return None
        return asyncio.get_running_loop().time() + self.append_timeout

    def _count_request(self) -> None:
        self.append_requests += 1

    def _count_unknown_outcome(self) -> None:
        self.retried_appends += 1

    async def _send_once(
        self, values: Payload, fields: pb.AppendRequest | None, deadline_s: float | None
    ) -> Sequence[int]:
        """One try of an append, on the carrier `choose_carrier` picks for it."""
        lane = self._lane(self._endpoints.current) if self.lane else None
        # `usable()` also starts opening a lane that is not open (in the background).
        facts = CarrierFacts(self.stream, lane is not None, lane is not None and lane.usable())
        carrier = choose_carrier(facts).carrier
        if carrier is Carrier.STREAM:
            return await self._streams.append(values, fields, deadline_s)
        request = pb.AppendRequest()
        if fields is not None:
            request.CopyFrom(fields)
        request.data, request.offsets = values.data, values.offsets
        self._count_request()
        if carrier is Carrier.LANE:
            assert lane is not None
            answer = await self._lane_append(lane, request, deadline_s)
            if answer is not None:
                return answer
        response = await self._endpoints.call(
            lambda e: e.log.Append(request, timeout=deadline_s), mutating=True
        )
        return answered_positions(response)

    def _lane(self, index: int) -> AppendLane:
        lane = self._lanes.get(index)
        if lane is None:
            endpoint = self._endpoints.endpoint(index)
            lane = AppendLane(
                endpoint.address,
                lambda: endpoint.log.Status(pb.StatusRequest(local=True), timeout=self.timeout),
                self.credentials,
                self.timeout or DEFAULT_TIMEOUT,
                LANE_MAX_ANSWER,
            )
            self._lanes[index] = lane
        return lane

    async def _lane_append(
        self, lane: AppendLane, request: pb.AppendRequest, deadline_s: float | None
    ) -> Sequence[int] | None:
        """One try of an append on the lane: its positions, or None when the replica said
        it changed nothing in a way another replica may not (not the leader, no quorum):
        the caller then goes round the endpoints on gRPC, as for a unary call."""
        try:
            response = await lane.append(request, deadline_s)
        except TimeoutError:
            raise OutcomeUnknownTimeout(
                f"the append was not acknowledged within {deadline_s:g} s on the append "
                f"lane to {lane.address}: outcome unknown",
                grpc.StatusCode.DEADLINE_EXCEEDED,
                lane.address,
            ) from None
        except ConnectionBroken as exc:
            raise OutcomeUnknownUnavailable(
                f"the append lane to {lane.address} broke with the append in flight ({exc}): "
                "outcome unknown",
                grpc.StatusCode.UNAVAILABLE,
                lane.address,
            ) from None
        if response.code == 0:
            return answered_positions(response)
        error, unchanged = answer_error(response, lane.address)
        if unchanged:
            return None
        raise error

    async def open_session(self) -> tuple[int, int]:
        """Open a new session in the log: (session id, window in positions). The client's
        own appends use one it opens itself; this is for callers that manage sessions."""
        response = await self._endpoints.call(
            lambda e: e.log.OpenSession(pb.OpenSessionRequest(), timeout=self.append_timeout),
            mutating=True,
        )
        return int(response.session), int(response.window)

    async def append_one(self, value: Value) -> int:
        """Append one value; returns its position."""
        (position,) = await self.append([value])
        return position

    async def take_epoch(self) -> int:
        """Take a new writer epoch (the log's highest + 1): from now on every append with a
        lower `epoch=` fails with `ConditionFailed`. Raises `OutcomeUnknown` if the EPOCH
        entry may or may not be in the log."""
        response = await self._endpoints.call(
            lambda e: e.log.TakeEpoch(pb.TakeEpochRequest(), timeout=self.append_timeout),
            mutating=True,
        )
        return int(response.epoch)

    async def truncate(self, to: int) -> int:
        """Truncate every position below `to`; returns the position of the TRUNCATE entry."""
        request = pb.TruncateRequest(to=to)
        response = await self._endpoints.call(
            lambda e: e.log.Truncate(request, timeout=self.append_timeout), mutating=True
        )
        return int(response.position)

    async def status(self, endpoint: str | None = None) -> pb.StatusResponse:
        """The status of a replica: the current endpoint's (moving on if it is down), or
        exactly `endpoint`'s if given."""
        return await self._endpoints.call(
            lambda e: e.log.Status(pb.StatusRequest(), timeout=self.timeout),
            mutating=False,
            endpoint=endpoint,
        )

    async def statuses(self) -> dict[str, pb.StatusResponse | RlogError]:
        """Every endpoint's status (or the error asking it), concurrently."""

        async def one(address: str) -> pb.StatusResponse | RlogError:
            try:
                return await self.status(address)
            except RlogError as error:
                return error

        addresses = self._endpoints.addresses
        results = await asyncio.gather(*(one(a) for a in addresses))
        return dict(zip(addresses, results, strict=True))

    def _read_responses(
        self,
        from_: int | None,
        to: int | None,
        stale: bool,
        max_batch: int,
        endpoint: str | None,
        min_position: int | None,
    ) -> AsyncGenerator[pb.ReadResponse, None]:
        # A read that may wait for a replica to catch up always carries a deadline.
        timeout = self.read_timeout
        if min_position is not None and timeout is None:
            timeout = self.timeout
        return read_responses(
            self._endpoints, from_, to, stale, max_batch, endpoint, min_position, timeout
        )

    async def read_batches(
        self,
        from_: int | None = None,
        to: int | None = None,
        stale: bool = False,
        max_batch: int = 0,
        endpoint: str | None = None,
        *,
        min_position: int | None = None,
    ) -> AsyncGenerator[list[Entry], None]:
        """Like `read`, in the batches the server sends."""
        responses = self._read_responses(from_, to, stale, max_batch, endpoint, min_position)
        async with contextlib.aclosing(responses):
            async for response in responses:
                yield [Entry(p, v) for p, v in pairs_of(response)]

    async def read_columns(
        self,
        from_: int | None = None,
        to: int | None = None,
        stale: bool = False,
        max_batch: int = 0,
        endpoint: str | None = None,
        *,
        min_position: int | None = None,
    ) -> AsyncGenerator[list[pb.Run], None]:
        """Like `read_batches`, each batch as the runs the server sent: `pb.Run`s (head
        unset) of values packed at consecutive positions `first ..` (`data`, and count+1
        little-endian uint32 `offsets`: an Arrow binary column's buffers), in position order,
        never empty. No Python object per entry: for bulk readers that build columnar data
        (the Spark source's Arrow batches). `rlog.packed.values_of` unpacks a run."""
        responses = self._read_responses(from_, to, stale, max_batch, endpoint, min_position)
        async with contextlib.aclosing(responses):
            async for response in responses:
                yield runs_of(response)

    async def read(
        self,
        from_: int | None = None,
        to: int | None = None,
        stale: bool = False,
        max_batch: int = 0,
        endpoint: str | None = None,
        *,
        min_position: int | None = None,
    ) -> AsyncGenerator[Entry, None]:
        """The APPEND entries in [from_, to] (inclusive; defaults: the beginning and the
        last learned position), in position order. `stale=True` reads the contacted
        replica's own learned entries instead of going through the leader. `max_batch`: at
        most this many positions per server message (0: the server's bounds, 4 MiB of values).
        `endpoint`: read from exactly that endpoint, never another (a stale read of one
        given replica; its errors are raised as they are, for the caller to move on).
        `min_position`: the replica serving the read first waits until it has learned this
        position (read-your-writes: pass `last_appended`), up to the read's deadline
        (`read_timeout`, else `timeout`); then `Unavailable` naming what it had learned.
        Raises `Truncated` below the beginning, `PastEnd` past the end."""
        batches = self.read_batches(
            from_, to, stale, max_batch, endpoint, min_position=min_position
        )
        try:
            async for batch in batches:
                for entry in batch:
                    yield entry
        finally:
            await batches.aclose()

    async def tail_batches(
        self, from_: int = 0, stale: bool = False
    ) -> AsyncGenerator[list[Entry], None]:
        """Like `tail`, in the batches the server sends."""
        responses = tail_responses(self._endpoints, from_, stale)
        async with contextlib.aclosing(responses):
            async for response in responses:
                yield [Entry(p, v) for p, v in pairs_of(response)]

    async def tail(self, from_: int = 0, stale: bool = False) -> AsyncGenerator[Entry, None]:
        """Every APPEND entry from `from_` on, waiting for new ones forever (served from
        the contacted replica's learned entries). The start is linearizable: the first
        entries cover every append acknowledged before the tail (re)started; `stale=True`
        starts from the contacted replica's own view instead, with no leader involved."""
        batches = self.tail_batches(from_, stale)
        try:
            async for batch in batches:
                for entry in batch:
                    yield entry
        finally:
            await batches.aclose()

    # ---- admin -------------------------------------------------------------------------

    async def grant_permit(
        self, log_id: str = "", endpoint: str | None = None
    ) -> pb.StatusResponse:
        """Grant the initialization permit (to `endpoint`, or the current endpoint)."""
        request = pb.PermitRequest(log_id=log_id)
        return await self._endpoints.call(
            lambda e: e.admin.GrantPermit(request, timeout=self.timeout),
            mutating=False,
            endpoint=endpoint,
        )

    async def revoke_permit(
        self, log_id: str = "", endpoint: str | None = None
    ) -> pb.StatusResponse:
        """Revoke the initialization permit (of `endpoint`, or the current endpoint)."""
        request = pb.PermitRequest(log_id=log_id)
        return await self._endpoints.call(
            lambda e: e.admin.RevokePermit(request, timeout=self.timeout),
            mutating=False,
            endpoint=endpoint,
        )

    async def step_down(self, endpoint: str | None = None) -> pb.StatusResponse:
        """Ask a replica (`endpoint`, or the current endpoint) to stop leading."""
        return await self._endpoints.call(
            lambda e: e.admin.StepDown(pb.StepDownRequest(), timeout=self.timeout),
            mutating=False,
            endpoint=endpoint,
        )

    # ---- lifecycle ---------------------------------------------------------------------

    async def close(self) -> None:
        self._endpoints.closed = True
        await self._groups.close()
        await self._streams.close()
        lanes, self._lanes = self._lanes, {}
        for lane in lanes.values():
            lane.close()
        await self._endpoints.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def _next(batches: AsyncGenerator[T, None]) -> T:
    return await batches.__anext__()


class Client:
    """A blocking client with the API of `AsyncClient`; it runs one on a private event-loop
    thread. Safe to share between threads."""

    def __init__(
        self,
        endpoints: str | Iterable[str],
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        append_timeout: float | None = DEFAULT_APPEND_TIMEOUT,
        read_timeout: float | None = None,
        channel_options: Iterable[tuple[str, Any]] = (),
        stream: bool = False,
        exactly_once: bool = True,
        credentials: Credentials | None = None,
        connect_wait: float = DEFAULT_CONNECT_WAIT,
        lane: bool = False,
    ) -> None:
        self._async = AsyncClient(
            endpoints,
            timeout=timeout,
            append_timeout=append_timeout,
            read_timeout=read_timeout,
            channel_options=channel_options,
            stream=stream,
            exactly_once=exactly_once,
            credentials=credentials,
            connect_wait=connect_wait,
            lane=lane,
        )
        self._loop = event_loop.new_event_loop()  # uvloop if installed (rlog.event_loop)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rlog-client", daemon=True
        )
        self._thread.start()
        self._closed = False

    @property
    def endpoints(self) -> list[str]:
        return self._async.endpoints

    @property
    def current_endpoint(self) -> str:
        return self._async.current_endpoint

    @property
    def last_appended(self) -> int:
        """The highest position an append through this client was given (0: none yet):
        `read(stale=True, min_position=client.last_appended)` reads this client's writes."""
        return self._async.last_appended

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RlogError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, batches: AsyncGenerator[list[Entry], None]) -> Iterator[Entry]:
        with contextlib.closing(self._batches(batches)) as items:
            for batch in items:
                yield from batch

    def _batches(self, batches: AsyncGenerator[T, None]) -> Generator[T, None, None]:
        """The items of an async generator of the client's loop, one loop round trip each."""
        try:
            while True:
                try:
                    yield self._run(_next(batches))
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                self._run(batches.aclose())

    def append(
        self, values: Iterable[Value] | Value, *, if_next: int | None = None, epoch: int = 0
    ) -> list[int]:
        return self._run(self._async.append(values, if_next=if_next, epoch=epoch))

    def take_epoch(self) -> int:
        return self._run(self._async.take_epoch())

    def open_session(self) -> tuple[int, int]:
        return self._run(self._async.open_session())

    def submit_append(
        self, values: Iterable[Value] | Value
    ) -> concurrent.futures.Future[list[int]]:
        """Start an append and return at once: a future of `append`'s result (its positions,
        or its error). Appends submitted one after another are handed to the client in that
        order; with `stream=True` they travel in that order on one `AppendStream`, so several
        can be in flight at once (a leader assigns their positions in the order it receives
        them; a follower forwards each on its own, in no guaranteed order)."""
        if self._closed:
            raise RlogError("the client is closed")
        return asyncio.run_coroutine_threadsafe(self._async.append(values), self._loop)

    def append_packed(
        self, data: bytes, offsets: bytes, *, if_next: int | None = None, epoch: int = 0
    ) -> Sequence[int]:
        return self._run(self._async.append_packed(data, offsets, if_next=if_next, epoch=epoch))

    def submit_append_packed(
        self, data: bytes, offsets: bytes
    ) -> concurrent.futures.Future[Sequence[int]]:
        """`submit_append` for values already packed (see `AsyncClient.append_packed`)."""
        if self._closed:
            raise RlogError("the client is closed")
        return asyncio.run_coroutine_threadsafe(
            self._async.append_packed(data, offsets), self._loop
        )

    def append_one(self, value: Value) -> int:
        return self._run(self._async.append_one(value))

    def truncate(self, to: int) -> int:
        return self._run(self._async.truncate(to))

    def status(self, endpoint: str | None = None) -> pb.StatusResponse:
        return self._run(self._async.status(endpoint))

    def statuses(self) -> dict[str, pb.StatusResponse | RlogError]:
        return self._run(self._async.statuses())

    def read(
        self,
        from_: int | None = None,
        to: int | None = None,
        stale: bool = False,
        max_batch: int = 0,
        endpoint: str | None = None,
        *,
        min_position: int | None = None,
    ) -> Iterator[Entry]:
        return self._iterate(
            self._async.read_batches(
                from_, to, stale, max_batch, endpoint, min_position=min_position
            )
        )

    def read_batches(
        self,
        from_: int | None = None,
        to: int | None = None,
        stale: bool = False,
        max_batch: int = 0,
        endpoint: str | None = None,
        *,
        min_position: int | None = None,
    ) -> Iterator[list[Entry]]:
        return self._batches(
            self._async.read_batches(
                from_, to, stale, max_batch, endpoint, min_position=min_position
            )
        )

    def read_columns(
        self,
        from_: int | None = None,
        to: int | None = None,
        stale: bool = False,
        max_batch: int = 0,
        endpoint: str | None = None,
        *,
        min_position: int | None = None,
    ) -> Iterator[list[pb.Run]]:
        return self._batches(
            self._async.read_columns(
                from_, to, stale, max_batch, endpoint, min_position=min_position
            )
        )

    def tail(self, from_: int = 0, stale: bool = False) -> Iterator[Entry]:
        return self._iterate(self._async.tail_batches(from_, stale))

    def grant_permit(self, log_id: str = "", endpoint: str | None = None) -> pb.StatusResponse:
        return self._run(self._async.grant_permit(log_id, endpoint))

    def revoke_permit(self, log_id: str = "", endpoint: str | None = None) -> pb.StatusResponse:
        return self._run(self._async.revoke_permit(log_id, endpoint))

    def step_down(self, endpoint: str | None = None) -> pb.StatusResponse:
        return self._run(self._async.step_down(endpoint))

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._async.close())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)


__all__ = ["AsyncClient", "Client"]
