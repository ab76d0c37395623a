"""The replica server: the gRPC services over a `Node` (the process around them:
runtime/process.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc

from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.protocol.peer_version import PROTOCOL
from rlog.runtime.appends import answer, answered, conditions_of, packed_values, prepared
from rlog.runtime.budgets import Ticket
from rlog.runtime.errors import RpcError
from rlog.runtime.faults import guarded, tolerant
from rlog.runtime.foreign import ForeignMessages
from rlog.runtime.node import Node
from rlog.runtime.plaintext import admin_refusal
from rlog.runtime.read_runs import response_of
from rlog.runtime.recover import recover_info
from rlog.runtime.write_stream import answer_to
from rlog.wire import FORWARDED, SERVER_OPTIONS, Reason

log = logging.getLogger("rlog.server")


def _forwarded(context: grpc.aio.ServicerContext) -> bool:
    return any(key == FORWARDED for key, _ in (context.invocation_metadata() or ()))


async def _abort(context: grpc.aio.ServicerContext, error: RpcError) -> None:
    """End the call with the error's code and message, and its reason (and fields, and
    whether the request changed nothing) in trailers: clients act on those, not the text."""
    await context.abort(error.code, error.message, trailing_metadata=error.details.trailers())


def _answer_by(context: grpc.aio.ServicerContext) -> float | None:
    """When to give up waiting (time.monotonic()), early enough for the error to reach the
    caller before its deadline; None if the call has no deadline. A fifth of the time left,
    at most half a second, is kept for the answer's way back: a tenth, at most 0.25 s, was
    too little on a loaded host (a 1.5-s read's "not learned by the deadline" arrived after
    the client had given up, in `make test` on 2 cores)."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return time.monotonic() + remaining - min(0.5, remaining / 5)


@guarded
class ReplicaService(pbg.ReplicaServicer):
    """The peer protocol (promise, write, learned, recover, fetch)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._unary_writes = node.metrics.write_requests.labels("unary")
        self._stream_writes = node.metrics.write_requests.labels("stream")

    async def Promise(
        self, request: pb.PromiseRequest, context: grpc.aio.ServicerContext
    ) -> pb.PromiseResponse:
        return await self.node.replica.handle_promise(request)

    async def Write(
        self, request: pb.WriteRequest, context: grpc.aio.ServicerContext
    ) -> pb.WriteResponse:
        self._unary_writes.inc()
        return await self.node.replica.handle_write(request)

    async def WriteStream(
        self,
        requests: AsyncIterator[pb.WriteRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.WriteResponse]:
        """The leader's writes on one stream: each handled as a `Write`, concurrently (so
        they share group commits), each response carrying its request's id, in the order
        they complete. A write that raises ends the stream with that error: the leader
        counts every write still pending on it as failed."""
        responses: asyncio.Queue[pb.WriteResponse | BaseException | None] = asyncio.Queue()
        # Writes whose batch is being made durable: the future -> its answer (with the id).
        pending: dict[asyncio.Future[None], pb.WriteResponse] = {}
        loop = asyncio.get_running_loop()

        def durable(future: asyncio.Future[None]) -> None:
            response = pending.pop(future)
            if not future.cancelled():
                error = future.exception()
                responses.put_nowait(response if error is None else error)

        link = self.node.leader_links.link()  # whose stream this is: its first write says

        async def read_all() -> None:
            async for request in requests:
                self._stream_writes.inc()
                link.saw(request.leader)
                # Decided here and now, in arrival order, its batch queued for the journal:
                # no task per write (a loop turn each on a serial append's path).
                try:
                    decided, future = self.node.replica.start_write(request)
                except Exception as exc:
                    responses.put_nowait(exc)
                    continue
                response = answer_to(request, decided)
                if future is None:
                    responses.put_nowait(response)
                else:
                    pending[future] = response
                    future.add_done_callback(durable)
            if pending:
                # each future's `durable` callback was added before asyncio.wait's own, so
                # every answer is queued before the end of the stream is
                await asyncio.wait(list(pending))
            responses.put_nowait(None)

        reader = loop.create_task(read_all())
        try:
            while (response := await responses.get()) is not None:
                if isinstance(response, BaseException):
                    raise response
                yield response
        finally:
            reader.cancel()
            link.close()

    async def Learned(
        self, request: pb.LearnedRequest, context: grpc.aio.ServicerContext
    ) -> pb.LearnedResponse:
        self.node.replica.handle_learned(request)
        # Our promise tells a leader's heartbeat whether we still follow it (read index).
        return pb.LearnedResponse(promised=self.node.core.promised, protocol=PROTOCOL)

    async def Recover(
        self, request: pb.RecoverRequest, context: grpc.aio.ServicerContext
    ) -> pb.RecoverResponse:
        return recover_info(self.node.core, self.node.config.log_id)

    async def Fetch(
        self, request: pb.FetchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        # Answers are serialized FetchResponses (runtime/fetch.py), passed through as bytes.
        for chunk in self.node.peers.fetch(request):
            yield chunk


@guarded
class LogService(pbg.LogServicer):
    """The client API. Appends, truncations and consistent reads go to the leader."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._tails = 0  # Tail calls open (--max-tail-readers)
        self._unary_appends = node.metrics.append_requests.labels("unary")
        self._stream_appends = node.metrics.append_requests.labels("stream")

    async def Append(
        self, request: pb.AppendRequest, context: grpc.aio.ServicerContext
    ) -> pb.AppendResponse:
        self._unary_appends.inc()
        # Its bytes are held in the replica's budget until it is answered (runtime/budgets.py).
        wait_until = time.monotonic() + self.node.config.append_timeout
        wait_until = min(wait_until, _answer_by(context) or wait_until)
        try:
            data, offsets = packed_values(request)
            ticket = await self.node.budget.admit_unary(len(data) + len(offsets), wait_until)
        except RpcError as error:
            await _abort(context, error)
        try:
            positions = await self.node.appender.append(
                data, offsets, _forwarded(context), conditions_of(request)
            )
        except RpcError as error:
            await _abort(context, error)
        finally:
            ticket.sent()
        return answered(positions)

    async def AppendStream(
        self,
        requests: AsyncIterator[pb.AppendRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.AppendResponse]:
        """Appends multiplexed on one stream; each response carries its request's id and
        status (a refusal's or a storage fault's error too: `answer`). Requests run
        concurrently, so their entries share write batches. An append that raises anything
        else (a bug) is logged and ends the stream with INTERNAL: the client fails every
        append still pending on it, instead of waiting for an answer that never comes.

        The stream's budget and the replica's (runtime/budgets.py): the next request is not
        read until the last one read fits both (backpressure, never an error); an append's
        bytes are held until its answer is handed to gRPC."""
        forwarded = _forwarded(context)
        budget = self.node.budget.stream()
        responses: asyncio.Queue[tuple[pb.AppendResponse, Ticket] | Exception | None] = (
            asyncio.Queue()
        )
        pending: set[asyncio.Task[None]] = set()

        async def one(
            request: pb.AppendRequest, packed: tuple[bytes, bytes] | RpcError, ticket: Ticket
        ) -> None:
            self._stream_appends.inc()
            try:
                response = await answer(self.node.appender, request, forwarded, packed)
            except asyncio.CancelledError:
                ticket.sent()
                raise
            except Exception as exc:
                ticket.sent()
                log.exception("an append on an AppendStream failed; ending the stream")
                responses.put_nowait(exc)
                return
            ticket.answered()
            responses.put_nowait((response, ticket))

        async def read_all() -> None:
            async for request in requests:
                # (the packed values' size: protobuf's ByteSize would encode the request)
                packed = prepared(request)
                size = len(packed[0]) + len(packed[1]) if isinstance(packed, tuple) else 0
                ticket = await budget.admit(size)
                task = asyncio.get_running_loop().create_task(one(request, packed, ticket))
                pending.add(task)
                task.add_done_callback(pending.discard)
            while pending:
                await asyncio.wait(set(pending))
            responses.put_nowait(None)

        reader = asyncio.get_running_loop().create_task(read_all())
        try:
            while (item := await responses.get()) is not None:
                if isinstance(item, Exception):
                    await context.abort(
                        grpc.StatusCode.INTERNAL, f"an append on this stream failed: {item!r}"
                    )
                response, ticket = item
                try:
                    yield response
                finally:
                    ticket.sent()
        finally:
            reader.cancel()
            for task in pending:
                task.cancel()  # each gives its bytes back as it ends
            while not responses.empty():  # answered, never sent
                left = responses.get_nowait()
                if isinstance(left, tuple):
                    left[1].sent()

    async def TakeEpoch(
        self, request: pb.TakeEpochRequest, context: grpc.aio.ServicerContext
    ) -> pb.TakeEpochResponse:
        try:
            return await self.node.coordinator_driver.take_epoch(_forwarded(context))
        except RpcError as error:
            await _abort(context, error)
            raise  # unreachable: abort raises

    async def OpenSession(
        self, request: pb.OpenSessionRequest, context: grpc.aio.ServicerContext
    ) -> pb.OpenSessionResponse:
        try:
            return await self.node.coordinator_driver.open_session(_forwarded(context))
        except RpcError as error:
            await _abort(context, error)
            raise  # unreachable: abort raises

    async def Truncate(
        self, request: pb.TruncateRequest, context: grpc.aio.ServicerContext
    ) -> pb.TruncateResponse:
        try:
            position = await self.node.coordinator_driver.truncate(request.to, _forwarded(context))
        except RpcError as error:
            await _abort(context, error)
        return pb.TruncateResponse(position=position)

    async def Read(
        self, request: pb.ReadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadResponse]:
        try:
            async for response in self.node.reads.read(
                request, _forwarded(context), _answer_by(context)
            ):
                yield response
        except RpcError as error:
            await _abort(context, error)

    async def Tail(
        self, request: pb.TailRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ReadResponse]:
        limit = self.node.config.max_tail_readers
        if self._tails >= limit:
            await _abort(
                context,
                RpcError(
                    Reason.LIMIT_EXCEEDED,
                    f"replica {self.node.config.id} serves {limit} Tail calls already "
                    "(--max-tail-readers)",
                ),
            )
        self._tails += 1
        try:
            # Each response waits for the reader's flow-control window (a reader that never
            # reads holds one response and the window, no more).
            async for runs in self.node.reads.tail(request):
                yield response_of(runs)
        except RpcError as error:
            await _abort(context, error)
        finally:
            self._tails -= 1

    async def Status(
        self, request: pb.StatusRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        if request.local:
            return self.node.status()
        # A leader confirms its leadership first, for at most T/2 or half the call's time
        # left: without a quorum it answers "follower" with no leader and a reason, and is
        # never withheld.
        bound = self.node.config.election_timeout / 2
        remaining = context.time_remaining()
        if remaining is not None:
            bound = min(bound, remaining / 2)
        return await self.node.confirmed_status(bound)


@guarded
class AdminService(pbg.AdminServicer):
    """Calls for the operator: the initialization permit and leader step-down."""

    def __init__(self, node: Node) -> None:
        self.node = node

    async def _check_caller(self, context: grpc.aio.ServicerContext) -> None:
        """Plaintext: callers on loopback only, unless --admin-from-anywhere
        (runtime/plaintext.py); with TLS the roles file has decided already."""
        if why := admin_refusal(self.node.config, context.peer()):
            log.warning("Admin call refused: %s", why)
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)

    async def _check_identity(
        self, request: pb.PermitRequest, context: grpc.aio.ServicerContext
    ) -> None:
        await self._check_caller(context)
        if self.node.config.log_id and request.log_id != self.node.config.log_id:
            error = RpcError(
                Reason.LOG_ID_MISMATCH,
                f"log id mismatch: this replica belongs to log {self.node.config.log_id!r}, "
                f"not {request.log_id!r}",
            )
            await _abort(context, error)

    async def GrantPermit(
        self, request: pb.PermitRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        await self._check_identity(request, context)
        self.node.set_permit(True)
        return self.node.status()

    async def RevokePermit(
        self, request: pb.PermitRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        await self._check_identity(request, context)
        self.node.set_permit(False)
        return self.node.status()

    async def StepDown(
        self, request: pb.StepDownRequest, context: grpc.aio.ServicerContext
    ) -> pb.StatusResponse:
        await self._check_caller(context)
        self.node.election.step_down()
        return self.node.status()


# A leader's write stream stays open while no write travels, and its channel's keepalive
# pings it every 10 s (wire.py); gRPC servers by default take pings without data more often
# than every 5 minutes as abuse and close the connection ("too_many_pings"), breaking the
# stream and anything else on that connection. Seen in a long live test: allow them.
REPLICA_SERVER_OPTIONS = [*SERVER_OPTIONS, ("grpc.http2.min_ping_interval_without_data_ms", 5000)]


def server_options(config: ReplicaConfig) -> list[tuple[str, Any]]:
    """The replica server's gRPC options with the configured limits (docs/faults.md)."""
    limited = {
        "grpc.max_receive_message_length": config.max_message_size,
        "grpc.max_send_message_length": config.max_message_size,
        "grpc.max_concurrent_streams": config.max_concurrent_streams,
    }
    options = [(k, v) for k, v in REPLICA_SERVER_OPTIONS if k not in limited]
    options.extend(limited.items())
    if config.stream_window:
        # A fixed window: BDP probing would grow it past the limit on a fast link.
        options += [
            ("grpc.http2.bdp_probe", 0),
            ("grpc.http2.lookahead_bytes", config.stream_window),
        ]
    return options


class _Handlers:
    """Takes the method handlers a generated `add_*_to_server` registers, unregistered."""

    def __init__(self) -> None:
        self.service = ""
        self.handlers: Mapping[str, Any] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: Mapping[str, Any]) -> None:
        self.service, self.handlers = service, handlers


def passing_bytes(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A response serializer that sends `bytes` as they are: a handler may answer a message
    it serialized itself (a Fetch answer is its records serialized one by one and joined:
    runtime/fetch.py)."""

    def serializer(response: Any) -> bytes:
        return response if isinstance(response, bytes) else serialize(response)

    return serializer


def _register(
    add: Callable[[Any, Any], None],
    service: object,
    server: grpc.aio.Server,
    without: tuple[str, ...] = (),
    same_log: ForeignMessages | None = None,
) -> None:
    """Register a generated service's methods with tolerant request deserializers (a request
    that does not parse reaches the handler as `Malformed`, answered INVALID_ARGUMENT, where
    gRPC would answer UNKNOWN), without the methods named (the server then answers
    UNIMPLEMENTED to them, as a build without them does). With `same_log` (the peer
    protocol) every request of another log is refused before its handler
    (runtime/foreign.py)."""
    taken = _Handlers()
    add(service, taken)
    methods = pb.DESCRIPTOR.services_by_name[taken.service.rpartition(".")[2]].methods_by_name

    def deserializer(name: str, parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
        parsing = tolerant(parse, methods[name].input_type.full_name)
        return parsing if same_log is None else same_log.deserializer(name, parsing)

    handlers = {
        name: h._replace(
            request_deserializer=deserializer(name, h.request_deserializer),
            response_serializer=passing_bytes(h.response_serializer),
        )
        for name, h in taken.handlers.items()
        if name not in without
    }
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(taken.service, handlers),)
    )
    server.add_registered_method_handlers(taken.service, handlers)  # type: ignore[attr-defined]


def add_services(
    server: grpc.aio.Server, node: Node, same_log: ForeignMessages, without: tuple[str, ...]
) -> None:
    """The replica's three services on `server`: the peer protocol (its log ids checked by
    `same_log`, the methods in `without` left out), the clients' and the operator's."""
    _register(pbg.add_ReplicaServicer_to_server, ReplicaService(node), server, without, same_log)
    _register(pbg.add_LogServicer_to_server, LogService(node), server)
    _register(pbg.add_AdminServicer_to_server, AdminService(node), server)
