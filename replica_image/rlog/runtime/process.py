"""A replica process: open the storage on a disk that works, bind the ports, start the node,
serve until SIGTERM or SIGINT, drain a leader and stop (`serve(config)` for `rlog replica`).
The gRPC services themselves are in runtime/server.py."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import NamedTuple

import grpc

from rlog import __version__, allocator, event_loop
from rlog.config import NO_WRITE_STREAM_ENV, ConfigError, ReplicaConfig, no_write_stream
from rlog.lane.framed import lane_address
from rlog.lane.server import LaneLimits, LaneReplica, serve_lane
from rlog.lane.tls import LaneTls
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.peer_version import PROTOCOL
from rlog.runtime.access import lane_admission, log_security, peer_check_of
from rlog.runtime.authz import AuthorizationInterceptor, PolicyFile
from rlog.runtime.foreign import ForeignMessages
from rlog.runtime.health import serve_health
from rlog.runtime.node import Node
from rlog.runtime.plaintext import listen_addresses, listen_refusal
from rlog.runtime.repair import (
    SetAside,
    disk_fault,
    identity_refusal,
    lost_earlier,
    set_aside,
)
from rlog.runtime.server import add_services, server_options
from rlog.runtime.tls import certificates_of, read_token
from rlog.storage import DataDirLocked, Storage, choose_engine, open_storage
from rlog.storage.base import StorageError, StorageLost
from rlog.storage.memory import MemoryStorage
from rlog.storage.restoring import refuse_if_restoring

log = logging.getLogger("rlog.server")

LOCK_POLL = 0.5  # seconds between attempts to take a data dir another process holds
LOCK_REPORT = 10.0  # seconds between the log lines saying the replica still waits


def lane_replica(node: Node) -> LaneReplica:
    """What the lane port serves of this replica (rlog/lane/server.py)."""
    replica = node.replica
    return LaneReplica(replica.start_write, replica.lane_fetch, node.appender, node.leader_links)


def bind_host(config: ReplicaConfig) -> str:
    """The host of --listen, where the metrics and health ports listen too (every address
    when --listen names none)."""
    return config.listen.rpartition(":")[0].strip("[]") or "0.0.0.0"


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


class Started(NamedTuple):
    server: grpc.aio.Server  # the replica's gRPC services
    node: Node
    lane: asyncio.Server | None  # the write lane, if served
    health: grpc.aio.Server | None  # the health port, if served


async def start_server(config: ReplicaConfig) -> Started:
    """Open the storage, bind the port (and the write lane's and health's) and start the
    node; errors are one-line messages."""
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
    add_services(server, node, same_log, without)
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
                lane_replica(node),
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
    health = None
    if config.health_port:
        host = bind_host(config)
        try:
            health = await serve_health(node.health, host, config.health_port)
        except OSError as exc:
            storage.close()
            raise ConfigError(f"cannot serve health: {exc}") from None
    await server.start()
    node.start()
    await node.health.serving()
    if config.metrics_port:
        node.metrics.serve(config.metrics_port, bind_host(config))
    # Said once nothing can fail any more: a start refused is one line on stderr.
    log.info("storage: %s", opened)
    return Started(server, node, lane, health)


async def _serve(config: ReplicaConfig, allocation: str) -> None:
    server, node, lane, health = await start_server(config)
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
    if health is not None:
        log.info("health: grpc.health.v1 served in plaintext on port %d", config.health_port)
    log.info("%s", allocation)
    log_security(config)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    log.info("stopping")
    await node.health.stopping()  # not ready from now on: no new client is sent here
    await drain(node, config.drain_timeout)
    if lane is not None:
        lane.close()
    await server.stop(grace=1.0)
    if health is not None:
        await health.stop(grace=None)
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
