"""Prometheus metrics of one replica (each replica has its own registry)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily

from rlog.allocator import Heap
from rlog.build_info import register_build_info
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.peer_version import PROTOCOL

_LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1.0,
    2.0,
    5.0,
    10.0,
)
# The storage conditions of Status's `storage_condition` ("" is "healthy" here).
STORAGE_CONDITIONS = (
    "healthy",
    "corrupt-repaired",
    "storage-lost",
    "refusing",
    "disk-failing",
    "disk-full",
)
_BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)


class ReplicaMetrics:
    def __init__(self, replica_id: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        # A registry of its own (a test process runs several replicas), so the default
        # registry's process_* and python_info collectors are added here by hand.
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)
        register_build_info("replica", PROTOCOL, r)
        self.status = Gauge(
            "rlog_replica_status", "1 for the replica's current status", ["status"], registry=r
        )
        self.leader = Gauge("rlog_replica_is_leader", "1 if this replica leads", registry=r)
        self.begin = Gauge("rlog_log_begin_position", "First position not truncated", registry=r)
        self.end = Gauge("rlog_log_end_position", "Highest position holding a record", registry=r)
        self.learned = Gauge(
            "rlog_log_learned_position", "Highest position learned with no gap below", registry=r
        )
        self.read_rounds = Counter(
            "rlog_read_index_rounds", "Leadership confirmation rounds sent", registry=r
        )
        self.read_confirmations = Counter(
            "rlog_read_index_confirmations", "Reads (and Status) released by a round", registry=r
        )
        self.reads_waiting = Gauge(
            "rlog_reads_waiting_min_position",
            "Reads waiting for this replica to learn their min_position",
            registry=r,
        )
        self.tail_chunks = Counter(
            "rlog_tail_chunks",
            "Tail responses by where their entries came from: read from storage for one "
            "reader, or shared (kept from another reader's read)",
            ["source"],
            registry=r,
        )
        self.promised = Gauge("rlog_replica_promised", "Highest implicit promise", registry=r)
        self.proposal = Gauge("rlog_coordinator_proposal", "Proposal number in use", registry=r)
        self.appends = Counter("rlog_appends", "Entries appended through this leader", registry=r)
        self.append_bytes = Counter(
            "rlog_append_bytes", "Bytes appended through this leader", registry=r
        )
        self.append_failures = Counter(
            "rlog_append_failures", "Appends that failed", ["kind"], registry=r
        )
        self.append_latency = Histogram(
            "rlog_append_latency_seconds",
            "Client append latency at the leader",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.fsync_latency = Histogram(
            "rlog_fsync_latency_seconds",
            "Duration of one group-commit disk write",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.flush_actions = Histogram(
            "rlog_flush_actions",
            "Actions persisted per group commit",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.batch_entries = Histogram(
            "rlog_write_batch_entries",
            "Entries per write batch sent by the leader",
            buckets=_BATCH_BUCKETS,
            registry=r,
        )
        self.write_requests = Counter(
            "rlog_write_requests",
            "Write requests this replica handled, by RPC (stream: WriteStream, unary: Write, "
            "lane: the write lane)",
            ["rpc"],
            registry=r,
        )
        self.foreign_messages = Counter(
            "rlog_foreign_messages",
            "Peer messages of another log refused (LOG_ID_MISMATCH), by RPC (lane: a lane's "
            "hello or frame): an address shared by two logs, or a misconfigured --peers",
            ["rpc"],
            registry=r,
        )
        self.old_peer_messages = Counter(
            "rlog_old_peer_messages",
            "Peer messages refused for a protocol version below --min-peer-protocol "
            "(PROTOCOL_TOO_OLD), by RPC: a replica of an older build still in the log",
            ["rpc"],
            registry=r,
        )
        self.append_requests = Counter(
            "rlog_append_requests",
            "Append requests from clients this replica handled, by RPC (unary: Append, "
            "stream: AppendStream, lane: the append lane)",
            ["rpc"],
            registry=r,
        )
        self.append_inflight_bytes = Gauge(
            "rlog_append_inflight_bytes",
            "Bytes of clients' appends admitted and not yet answered (--max-inflight-bytes)",
            registry=r,
        )
        self.append_budget_waits = Counter(
            "rlog_append_budget_waits",
            "Appends that waited for room in a budget before the replica read on, by budget "
            "(stream: --max-stream-inflight-bytes, replica: --max-inflight-bytes, announced: "
            "half of it, for lane appends whose bytes are still to come)",
            ["budget"],
            registry=r,
        )
        self.append_budget_refusals = Counter(
            "rlog_append_budget_refusals",
            "Unary appends refused (LIMIT_EXCEEDED) for want of room in --max-inflight-bytes",
            registry=r,
        )
        self.lane_connections_refused = Counter(
            "rlog_lane_connections_refused",
            "Lane connections closed at once, by why (cap: --max-lane-connections, hello: no "
            "hello within --lane-frame-timeout)",
            ["reason"],
            registry=r,
        )
        self.catchup_fetches = Counter(
            "rlog_catchup_fetches",
            "Spans a catching-up replica fetched from its peers, by how (lane: the peer's "
            "fetch lane, grpc: a Fetch call)",
            ["via"],
            registry=r,
        )
        self.pull_fetches = Counter(
            "rlog_pull_fetches",
            "Spans a VOTING replica fetched from its peers to learn positions it missed (back "
            "from a restart or a partition; a leader whose own write failed), by how (lane: "
            "the peer's fetch lane, grpc: a Fetch call)",
            ["via"],
            registry=r,
        )
        self.copy_paced = Counter(
            "rlog_copy_paced_seconds",
            "Seconds catch-ups (copy=catchup) and pulls (copy=pull) waited to keep to "
            "--catchup-rate",
            ["copy"],
            registry=r,
        )
        self.write_lanes_opened = Counter(
            "rlog_write_lanes_opened",
            "Write lane connections this replica opened to a peer (again after each break)",
            ["peer"],
            registry=r,
        )
        self.write_streams_opened = Counter(
            "rlog_write_streams_opened",
            "WriteStream calls this replica opened to a peer (again after each break)",
            ["peer"],
            registry=r,
        )
        self.peer_write_failures = Counter(
            "rlog_peer_write_failures",
            "Writes to a peer that failed in transport (timeout, broken stream, RPC error)",
            ["peer"],
            registry=r,
        )
        self.elections = Counter(
            "rlog_elections", "Elections this replica started, by result", ["result"], registry=r
        )
        self.rejects = Counter(
            "rlog_rejects",
            "Promise or write requests this replica rejected",
            ["kind"],
            registry=r,
        )
        self.permit = Gauge(
            "rlog_initialization_permit",
            "1 while the replica holds the initialization permit (may auto-initialize an "
            "all-EMPTY log)",
            registry=r,
        )
        self.catchup_remaining = Gauge(
            "rlog_catchup_remaining_positions", "Positions left to catch up", registry=r
        )
        self.corrupt_records = Counter(
            "rlog_storage_corrupt_records",
            "Stored records that failed their checksum (dropped, repaired from the peers)",
            registry=r,
        )
        self.disk_full = Gauge(
            "rlog_disk_full",
            "1 while writes fail for lack of space (ENOSPC, LMDB map full); appends refused",
            registry=r,
        )
        self.storage_condition = Gauge(
            "rlog_storage_condition",
            "1 for the storage's current condition (docs/faults.md): healthy, corrupt-repaired, "
            "storage-lost, refusing, disk-failing, disk-full",
            ["condition"],
            registry=r,
        )
        self._condition = ""
        self._condition_watched = False
        for name in STORAGE_CONDITIONS:
            self.storage_condition.labels(name).set(1 if name == "healthy" else 0)
        self.disk_used = Gauge(
            "rlog_disk_data_dir_bytes", "Bytes the data dir's files occupy on disk", registry=r
        )
        self.disk_available = Gauge(
            "rlog_disk_available_bytes",
            "Bytes available to the replica on the data dir's file system",
            registry=r,
        )
        self.disk_capacity = Gauge(
            "rlog_disk_capacity_bytes", "Size of the data dir's file system", registry=r
        )
        self._status = -1
        for name in pb.Status.keys():
            self.status.labels(name).set(0)

    def watch_disk(self, data_dir: str | Path) -> None:
        """Read the data dir's disk usage at each scrape (statvfs and a walk of its files)."""
        path = Path(data_dir)
        self.disk_used.set_function(lambda: float(_dir_bytes(path)))
        self.disk_available.set_function(lambda: float(_statvfs(path)[0]))
        self.disk_capacity.set_function(lambda: float(_statvfs(path)[1]))

    def watch_heap(self, heap: Callable[[], Heap | None]) -> None:
        """Read the C heap's bytes in use and free-but-kept at each scrape (not exported
        where the C library cannot say: `heap()` is None)."""
        if heap() is not None:
            self.registry.register(_HeapCollector(heap))

    def observe_flush(self, seconds: float, actions: int) -> None:
        self.fsync_latency.observe(seconds)
        self.flush_actions.observe(actions)

    def set_status(self, status: int) -> None:
        if status == self._status:
            return
        self._status = status
        for value, name in enumerate(pb.Status.keys()):
            self.status.labels(name).set(1 if value == status else 0)

    def watch_storage_condition(self, condition: Callable[[], str]) -> None:
        """Read the storage's condition (as Status says it, "" healthy) at each scrape: it
        moves with the free space too (disk-full under --min-free-bytes), and asking it at
        every metrics update (six per append on the leader) cost two dozen calls per append
        (docs/performance.md, "Before/after the driver split and storage-fault checks")."""
        self._condition_watched = True

        def is_now(name: str) -> Callable[[], float]:
            return lambda: 1.0 if (condition() or "healthy") == name else 0.0

        for name in STORAGE_CONDITIONS:
            self.storage_condition.labels(name).set_function(is_now(name))

    def set_storage_condition(self, condition: str) -> None:
        """`condition` as Status says it ("" healthy); nothing once watched
        (`watch_storage_condition`)."""
        if condition == self._condition or self._condition_watched:
            return
        self._condition = condition
        for name in STORAGE_CONDITIONS:
            self.storage_condition.labels(name).set(1 if name == (condition or "healthy") else 0)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        start_http_server(port, addr=host, registry=self.registry)


class _HeapCollector:
    """rlog_heap_bytes{state}: one reading of the heap per scrape serves both states (a
    reading walks the allocator's free lists under its locks)."""

    def __init__(self, heap: Callable[[], Heap | None]) -> None:
        self._heap = heap

    def _family(self) -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "rlog_heap_bytes",
            "The C heap: bytes in use (handed out, mapped buffers included) and free but kept "
            "by the allocator for the next allocations (not given back to the kernel)",
            labels=["state"],
        )

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()  # the name, without reading the heap at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family, now = self._family(), self._heap()
        if now is not None:
            family.add_metric(["in_use"], float(now.in_use))
            family.add_metric(["free"], float(now.free))
        yield family


def _statvfs(path: Path) -> tuple[int, int]:
    """(bytes available to an unprivileged writer, size) of the file system holding path."""
    try:
        st = os.statvfs(path)
    except OSError:
        return 0, 0
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def _dir_bytes(path: Path) -> int:
    """Bytes allocated to the files under path (sparse files count what they use)."""
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                pass
    return total
