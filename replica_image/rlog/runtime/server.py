"""The replica server: gRPC services over a `Node`, and `serve(config)` for `rlog replica`."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

import grpc

from rlog import __version__, allocator, event_loop
from rlog.config import NO_WRITE_STREAM_ENV, ConfigError, ReplicaConfig, no_write_stream
from rlog.lane.framed import lane_address
from rlog.lane.server import LaneLimits, serve_lane
from rlog.lane.tls import LaneTls
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.protocol.peer_version import PROTOCOL
from rlog.runtime.access import lane_admission, log_security, peer_check_of
from rlog.runtime.appends import answer, answered, conditions_of, packed_values, prepared
from rlog.runtime.authz import AuthorizationInterceptor, PolicyFile
from rlog.runtime.budgets import Ticket
from rlog.runtime.errors import RpcError
from rlog.runtime.faults import guarded, tolerant
from rlog.runtime.foreign import ForeignMessages
from rlog.runtime.node import Node
from rlog.runtime.plaintext import admin_refusal, listen_addresses, listen_refusal
from rlog.runtime.read_runs import response_of
from rlog.runtime.recover import recover_info
from rlog.runtime.repair import (
    SetAside,
    disk_fault,
    identity_refusal,
    lost_earlier,
    set_aside,
)
from rlog.runtime.tls import certificates_of, read_token
from rlog.runtime.write_stream import answer_to
from rlog.storage import DataDirLocked, Storage, choose_engine, open_storage
from rlog.storage.base import StorageError, StorageLost
from rlog.storage.memory import MemoryStorage
from rlog.storage.restoring import refuse_if_restoring
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
    caller before its deadline; None if the call has no deadline."""
    remaining = context.time_remaining()
    if remaining is None:
        return None
    return time.monotonic() + remaining - min(0.25, remaining / 10)


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


LOCK_POLL = 0.5  # seconds between attempts to take a data dir another process holds
LOCK_REPORT = 10.0  # seconds between the log lines saying the replica still waits


async def open_when_free(data_dir: Path, engine: str, wait: float) -> tuple[Storage, str]:
    """Open the storage, waiting up to `wait` seconds while another live process holds the
    data dir; return it and, for the log, the engine opened and why (`engine` may be
    `auto`, rlog.storage.AUTO). The holder is typically the container this one replaces (a
    pod deleted without grace is replaced at once, while its process may still run on the
    node): it lets go within seconds, and a replica that exited instead would restart under
    a growing back-off. Two processes never use the data dir together either way. A dir
    that holds an unfinished restore is refused (RestoreUnfinished): never served."""
    refuse_if_restoring(data_dir)
    deadline = time.monotonic() + wait
    reported = 0.0
    while True:
        # Chosen again after each wait: the holder may have created the dir's store meanwhile.
        chosen, why = choose_engine(data_dir, engine)
        try:
            storage = open_storage(data_dir, chosen)
        except DataDirLocked as exc:
            now = time.monotonic()
            if now >= deadline:
                raise DataDirLocked(f"{exc} (waited {wait:g}s for it to be released)") from None
            if now - reported >= LOCK_REPORT:
                log.warning("%s; waiting up to %.0fs for it to be released", exc, deadline - now)
                reported = now
            await asyncio.sleep(min(LOCK_POLL, deadline - now))  # now < deadline here
            continue
        return storage, f"{chosen} engine ({why})"


DISK_RETRY = 1.0  # seconds between attempts to open the storage on a disk that cannot be written


async def open_on_a_working_disk(config: ReplicaConfig) -> tuple[Storage, str, SetAside | None]:
    """`open_when_free`, storage found lost set aside and a fresh store opened in its place;
    while the disk cannot be written (full, failing, read-only: `disk_fault`) tried again
    every DISK_RETRY seconds, the reason logged when it changes and every LOCK_REPORT
    seconds, instead of exiting: space freed or the disk remounted, the replica starts by
    itself. Status is not served meanwhile (there is no store to serve it from)."""
    said, reported = "", 0.0
    while True:
        try:
            try:
                storage, opened = await open_when_free(
                    config.data_dir, config.storage_engine, config.lock_wait
                )
                return storage, opened, None
            except StorageLost as exc:
                lost = set_aside(config.data_dir, exc)
                storage, opened = await open_when_free(
                    config.data_dir, lost.engine or config.storage_engine, config.lock_wait
                )
                return storage, opened, lost
        except (StorageError, OSError) as exc:
            if not disk_fault(exc):
                raise
            why, now = str(exc), time.monotonic()
            if why != said or now - reported >= LOCK_REPORT:
                log.error("%s: the disk cannot be written; trying again every %gs", why, DISK_RETRY)
                said, reported = why, now
            await asyncio.sleep(DISK_RETRY)


async def start_server(
    config: ReplicaConfig,
) -> tuple[grpc.aio.Server, Node, asyncio.Server | None]:
    """Open the storage, bind the port (and the write lane's) and start the node; errors
    are one-line messages."""
    # Plaintext beyond loopback only with --insecure (runtime/plaintext.py), and
    # certificates and roles: a refusal or a bad file stops the start before the data is
    # opened.
    if config.transport == "plaintext":
        loop = asyncio.get_running_loop()
        addresses = await loop.run_in_executor(None, listen_addresses, config.listen)
        if why := listen_refusal(config, addresses):
            raise ConfigError(why)
    certificates = certificates_of(config)
    policy = PolicyFile(config.auth_config) if config.auth_config is not None else None
    peer_token = read_token(config.auth_peer_token_file)
    peer_check = peer_check_of(certificates)
    interceptors = [AuthorizationInterceptor(policy, peer_check)] if policy is not None else []
    # Storage found lost is set aside and a fresh store opened; a data dir of another log or
    # replica is closed untouched and the replica answers Status only (runtime/repair.py).
    storage, opened, lost = await open_on_a_working_disk(config)
    lost = lost or lost_earlier(config.data_dir, storage)
    refusal = identity_refusal(storage.metadata(), config)
    if refusal:
        storage.close()
        storage, opened = MemoryStorage(), "no storage (refusing the data dir)"
    node = Node(config, storage, lost, refusal)
    if certificates is not None:
        node.peers.credentials = lambda: certificates.peer_credentials(peer_token)
        node.certificates = certificates
    server = grpc.aio.server(
        options=server_options(config),
        interceptors=interceptors,
        maximum_concurrent_rpcs=config.max_concurrent_rpcs,
    )
    without: tuple[str, ...] = ()
    if no_write_stream():
        log.warning("%s=1: WriteStream is not served (test only)", NO_WRITE_STREAM_ENV)
        without = ("WriteStream",)
    # The one place the peer protocol's log ids are checked (the lane checks its own).
    same_log = ForeignMessages(config.log_id, node.metrics, config.min_peer_protocol)
    _register(pbg.add_ReplicaServicer_to_server, ReplicaService(node), server, without, same_log)
    _register(pbg.add_LogServicer_to_server, LogService(node), server)
    _register(pbg.add_AdminServicer_to_server, AdminService(node), server)
    try:
        if certificates is None:
            server.add_insecure_port(config.listen)
        else:
            server.add_secure_port(config.listen, certificates.server_credentials())
    except RuntimeError:
        storage.close()
        raise ConfigError(f"cannot listen on {config.listen}: address in use or invalid") from None
    lane = None
    if config.write_lane_offset:
        host, port = lane_address(config.listen, config.write_lane_offset)
        lane_tls = LaneTls(certificates) if certificates is not None else None
        if lane_tls is not None:
            node.peers.lane_tls = lane_tls.client
        try:
            lane = await serve_lane(
                node.lane_replica(),
                host,
                port,
                config.log_id,
                config.id,
                config.max_message_size,
                node.metrics.write_requests.labels("lane").inc,
                node.metrics.append_requests.labels("lane").inc,
                LaneLimits(
                    config.max_lane_connections,
                    config.lane_frame_timeout,
                    node.budget,
                    lambda why: node.metrics.lane_connections_refused.labels(why).inc(),
                ),
                lane_tls.server if lane_tls is not None else None,
                lane_admission(policy, peer_check) if policy is not None else None,
                same_log.seen,
                same_log.old_refusal if config.min_peer_protocol else None,
            )
        except OSError as exc:
            storage.close()
            raise ConfigError(f"cannot listen for the write lane on {host}:{port}: {exc}") from None
    await server.start()
    node.start()
    if config.metrics_port:
        host = config.listen.rpartition(":")[0].strip("[]")
        node.metrics.serve(config.metrics_port, host if host not in ("", "0.0.0.0") else "0.0.0.0")
    # Said once nothing can fail any more: a start refused is one line on stderr.
    log.info("storage: %s", opened)
    return server, node, lane


async def _serve(config: ReplicaConfig, allocation: str) -> None:
    server, node, lane = await start_server(config)
    node.metrics.watch_heap(allocator.heap)
    log.info(
        "replica %d of %d listening on %s (data dir %s, status %s; rlog %s, peer protocol %d)",
        config.id,
        len(config.peers),
        config.listen,
        config.data_dir,
        pb.Status.Name(node.core.status),
        __version__,
        PROTOCOL,
    )
    if lane is not None:
        host, port = lane_address(config.listen, config.write_lane_offset)
        how = "mutual TLS" if config.tls_cert is not None else "plaintext"
        log.info("lane: leaders' writes and clients' appends served on %s:%d (%s)", host, port, how)
    log.info("%s", allocation)
    log_security(config)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("stopping")
    await drain(node, config.drain_timeout)
    if lane is not None:
        lane.close()
    await server.stop(grace=1.0)
    await node.stop()


async def drain(node: Node, seconds: float) -> bool:
    """A leader asked to stop steps down first and keeps serving until another replica
    leads (at most `seconds`): its in-flight appends finish or fail as a step-down
    makes them, and while it stays up it forwards appends to the next leader instead of
    refusing connections. Returns whether another replica was seen leading. A follower
    (or `seconds` 0) returns at once."""
    if seconds <= 0 or not node.coordinator.leading:
        return False
    log.info("leading while asked to stop: stepping down first (drain up to %gs)", seconds)
    node.election.step_down()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while loop.time() < deadline:
        leader = node.election.leader_id
        if leader is not None and leader != node.config.id and node.election.live_leader:
            log.info("replica %d leads now: stopping", leader)
            return True
        await asyncio.sleep(0.05)
    log.warning("no other replica leads after %gs: stopping anyway", seconds)
    return False


def serve(config: ReplicaConfig) -> None:
    """Run a replica until SIGTERM or SIGINT. Raises ConfigError/StorageError on bad setup."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # Before the replica allocates anything large; said once it listens, so a replica that
    # refuses to start says only why.
    allocation = allocator.keep_large_buffers()
    event_loop.run(_serve(config, allocation))
