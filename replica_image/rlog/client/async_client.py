"""`AsyncClient`: the asyncio client of an rlog log (grpc.aio).

It holds the parts and wires them: the endpoints and going round them (`endpoints`), how
an append travels (`carrier`: its route, then each try's carrier), the exactly-once
appends in sessions (`sessions`, `retry`), their groups (`grouping`), the append streams
(`append_stream`), the append lanes (`lane`), and reads and tails (`reads`).
`exactly_once=False` turns sessions off: an append is then never re-sent once it may have
reached a server, and an unknown outcome raises an `rlog.client.errors.OutcomeUnknown`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Iterable, Sequence
from typing import Any

import grpc

from rlog.client.append_stream import AppendStreams
from rlog.client.carrier import (
    AppendFacts,
    Carrier,
    CarrierFacts,
    Route,
    choose_carrier,
    choose_route,
    lane_wanted,
)
from rlog.client.endpoints import Endpoints
from rlog.client.errors import (
    OutcomeUnknownTimeout,
    OutcomeUnknownUnavailable,
    RlogError,
    answer_error,
)
from rlog.client.grouping import AppendGroups
from rlog.client.packing import Payload, answered_positions, pairs_of, runs_of
from rlog.client.reads import read_responses, tail_responses
from rlog.client.security import Credentials
from rlog.client.sessions import ExactlyOnce, SessionGrant
from rlog.client.values import Entry, Value, encode_value, parse_endpoints
from rlog.lane.client import AppendLane, ConnectionBroken
from rlog.proto import rlog_pb2 as pb
from rlog.wire import CLIENT_CHANNEL_OPTIONS

DEFAULT_TIMEOUT = 30.0
# Longer than the server's append timeout plus forwarding, so the server's own verdict
# (DEADLINE_EXCEEDED with its message, or ABORTED) normally arrives first.
DEFAULT_APPEND_TIMEOUT = 60.0
# How long a call waits for some endpoint to accept a connection when none could be
# connected to: twice gRPC's longest reconnect back-off here (rlog.wire).
DEFAULT_CONNECT_WAIT = 2.0
# How long a read or tail waits for an endpoint's first answer, and then for its answer to
# a status probe, before moving on (`Endpoints.first_answer`): a live replica answers a
# local status at once; one that stopped answers nothing, and gRPC would wait ~20 s to 1 min.
DEFAULT_START_TIMEOUT = 5.0
# The largest answer an append lane takes (an answer is a few dozen bytes; one listing
# positions one by one, from a server that predates ranges, can be larger).
LANE_MAX_ANSWER = 64 * 1024 * 1024


class AsyncClient:
    """An asyncio client of an rlog log. Use it within one event loop.

    `endpoints`: "H:P", "H:P,H:P,..." or a list of those. `timeout` bounds unary calls
    (status, admin), `append_timeout` appends and truncations, `read_timeout` a whole read
    (None: no deadline). Tails have no deadline (their start has: `start_timeout`).
    `stream=True` sends appends multiplexed on one `AppendStream` call per endpoint
    (cheaper per append for many concurrent writers); every append still gets its own
    result, and the same errors. `last_appended` is the
    highest position this client's appends were given (0: none yet): a stale read with
    `min_position=last_appended` sees them (read-your-writes). `connect_wait`: when no
    endpoint can be connected to, how long a call waits for one to accept a connection
    before it fails `Unavailable` (0: at once; a probe of one replica's state wants that).
    `start_timeout`: a read or tail whose endpoint sends no first answer within it, and then
    answers no status probe within it either, moves on to the next endpoint as from an
    UNAVAILABLE one (a replica that stopped, or a partition, keeps its connection open);
    only the start is bounded, a tail may then be idle for as long as the log is (None: no
    bound).
    `lane`: appends that would be unary calls travel on the replica's append lane once it
    is open (docs/data-path.md, "The client's append lane": the same requests, answers,
    sessions and errors without gRPC's cost per call; on gRPC until then, and whenever the
    replica serves no lane). None (the default): on wherever it can be, that is, unless the
    client appends on a stream or authenticates by bearer token; True: the same, and a
    stream or a token is an error; False: every append is a gRPC call.
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
        lane: bool | None = None,
        start_timeout: float | None = DEFAULT_START_TIMEOUT,
    ) -> None:
        addresses = parse_endpoints(endpoints)
        self.credentials = credentials
        self.stream = stream
        self.lane = lane_wanted(
            lane, stream, credentials is not None and credentials.token is not None
        )
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
        self._endpoints = Endpoints(addresses, options, credentials, connect_wait, start_timeout)
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

    async def open_session(self) -> SessionGrant:
        """Open a new session in the log: its id, window (in positions) and secret, which
        every append in it carries (`session_secret`). The client's own appends use one it
        opens itself; this is for callers that manage sessions."""
        response = await self._endpoints.call(
            lambda e: e.log.OpenSession(pb.OpenSessionRequest(), timeout=self.append_timeout),
            mutating=True,
        )
        return SessionGrant(int(response.session), int(response.window), response.secret)

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
            await lane.aclose()
        await self._endpoints.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


__all__ = [
    "DEFAULT_APPEND_TIMEOUT",
    "DEFAULT_CONNECT_WAIT",
    "DEFAULT_START_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "AsyncClient",
]
