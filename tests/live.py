"""Helpers for the tests against real replica processes (`DevCluster`): concurrent writers
and the consistency check of what they were acknowledged, one append call as sent, a
client with a role's certificate, replica statuses, a replica's metrics, and a follower
killed and restarted under load."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
import urllib.request
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from rlog.client import AsyncClient, Client
from rlog.client.errors import OutcomeUnknown, RlogError, Timeout, Unavailable, from_rpc_error
from rlog.client.packing import answered_positions
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.tools import consistency
from rlog.tools.dev import DevCluster
from rlog.wire import CLIENT_CHANNEL_OPTIONS

# -- writers and the consistency check ---------------------------------------------------------


class Writers:
    """Concurrent clients appending unique values through every replica; records what was
    acknowledged (position -> value). Appends with an unknown outcome are not counted as
    acknowledged, and never retried."""

    def __init__(self, endpoints: list[str], clients: int = 8, per_call: int = 5) -> None:
        self.endpoints = endpoints
        self.clients = clients
        self.per_call = per_call
        self.acknowledged: dict[int, bytes] = {}
        self.unknown = 0
        self.failures = 0
        self._seq = itertools.count()
        self._stop = asyncio.Event()

    async def _writer(self, i: int, limit: int | None) -> None:
        # Each writer talks to its "own" replica first (any replica forwards to the leader).
        order = (
            self.endpoints[i % len(self.endpoints) :] + self.endpoints[: i % len(self.endpoints)]
        )
        async with AsyncClient(order, append_timeout=15) as client:
            while not self._stop.is_set():
                if limit is not None and len(self.acknowledged) >= limit:
                    return
                values = [f"w{i}-{next(self._seq)}".encode() for _ in range(self.per_call)]
                try:
                    positions = await client.append(values)
                except OutcomeUnknown:
                    self.unknown += 1
                    continue
                except (Unavailable, Timeout, RlogError):
                    self.failures += 1
                    await asyncio.sleep(0.1)
                    continue
                for position, value in zip(positions, values, strict=True):
                    assert position not in self.acknowledged, f"{position} acknowledged twice"
                    self.acknowledged[position] = value

    async def run(self, limit: int | None = None) -> None:
        await asyncio.gather(*(self._writer(i, limit) for i in range(self.clients)))

    def stop(self) -> None:
        self._stop.set()


def append_acked(client: Client, values: list[bytes], attempts: int = 10) -> list[int]:
    """Append, retrying an unknown outcome or an unavailable leader (e.g. an election duel
    right after start-up). A retried value may end up in the log twice; callers check only
    the positions finally acknowledged."""
    for attempt in range(attempts):
        try:
            return client.append(values)
        except (OutcomeUnknown, Unavailable):
            if attempt == attempts - 1:
                raise
            time.sleep(0.2)
    raise AssertionError("unreachable")


def check(cluster: DevCluster, acknowledged: dict[int, bytes]) -> consistency.Report:
    report = consistency.check_sync(cluster.endpoints, acknowledged, settle_timeout=60)
    assert report.ok, str(report)
    return report


# -- one append call as sent, a client with a role's certificate ------------------------------


def raw_append(endpoint: str, request: pb.AppendRequest) -> list[int]:
    """One `Append` call as sent (no client retry), its typed error raised."""
    with grpc.insecure_channel(endpoint, options=CLIENT_CHANNEL_OPTIONS) as channel:
        try:
            response = pbg.LogStub(channel).Append(request, timeout=30)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc, endpoint, mutating=True) from None
        return list(answered_positions(response))


def client_as(
    cluster: DevCluster, name: str, i: int | None = None, *, timeout: float = 5.0, **kwargs: Any
) -> Client:
    """A client of a TLS cluster (`DevCluster(tls=True)`) presenting the certificate the dev
    PKI issued to `name` (its role: docs/security.md), of every replica (or only replica i)."""
    return cluster.client(i, credentials=cluster.credentials(name), timeout=timeout, **kwargs)


# -- statuses ----------------------------------------------------------------------------------


def names(found: list[pb.StatusResponse | None]) -> list[str]:
    return ["DOWN" if s is None else pb.Status.Name(s.status) for s in found]


def wait_all_voting(cluster: DevCluster, timeout: float = 60) -> None:
    cluster.wait_for(
        lambda found: all(s == "VOTING" for s in names(found)), timeout, "every replica VOTING"
    )


# Replicas whose catch-ups and pulls copy at 16 MiB/s (`rlog replica --catchup-rate`): a copy
# of tens of MB lasts seconds on any host, so a fault or a check can land while it runs.
CAPPED = ["--catchup-rate", str(16 * 1024 * 1024)]


def copying(victim: int, before: float = 1.0):  # type: ignore[no-untyped-def]
    """The victim has copied something, and less than the fraction `before` of its range."""

    def check(found: list[pb.StatusResponse | None]) -> bool:
        status = found[victim]
        if status is None or status.status != pb.RECOVERING:
            return False
        size = status.catchup_end - status.catchup_begin + 1
        return 0 < status.catchup_done < int(before * size)

    return check


# -- metrics, and a follower killed and restarted under load -----------------------------------


def scrape(cluster: DevCluster, i: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Replica i's metric samples: (name, sorted labels) -> value."""
    url = f"http://{cluster.host_of(i)}:{cluster.metrics_ports[i]}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def write_requests(cluster: DevCluster, i: int, rpc: str) -> float:
    """Write requests replica i handled on `rpc` (stream or unary) since it started."""
    return scrape(cluster, i).get(("rlog_write_requests_total", (("rpc", rpc),)), 0.0)


def write_failures(cluster: DevCluster, leader: int, peer: int) -> float:
    """Writes to `peer` that failed in transport since the leader's process started (its
    first ones, the election's fill, may go to a peer not listening yet)."""
    return scrape(cluster, leader).get(
        ("rlog_peer_write_failures_total", (("peer", str(peer)),)), 0.0
    )


def settled_failures(cluster: DevCluster, leader: int, peer: int) -> float:
    """The leader's failed writes to `peer` once three scrapes 0.2 s apart agree (a broken
    stream's writes are counted within one turn of the replica's event loop)."""
    reads = [write_failures(cluster, leader, peer)]
    while len(reads) < 3 or len(set(reads[-3:])) > 1:
        time.sleep(0.2)
        reads.append(write_failures(cluster, leader, peer))
    return reads[-1]


def lanes_opened(cluster: DevCluster, leader: int, peer: int) -> float:
    """Write lanes the leader opened to `peer` since it started."""
    return scrape(cluster, leader).get(
        ("rlog_write_lanes_opened_total", (("peer", str(peer)),)), 0.0
    )


def wait_until(predicate, timeout: float, what: str) -> None:  # type: ignore[no-untyped-def]
    """Wait for `predicate`; a replica not serving its metrics yet counts as not yet."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if predicate():
                return
        except OSError:
            pass
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def logged(cluster: DevCluster, replica: int, *lines: str, timeout: float = 30) -> str:
    """The replica's log once it holds every one of `lines`. A replica persists a change
    (which its status then reports) before it logs it, so a check that saw the status can
    read the log a moment too early."""
    path = cluster.log_file(replica)
    wait_until(lambda: all(line in path.read_text() for line in lines), timeout, f"{lines} logged")
    return path.read_text()


def kill_and_restart_mid_load(cluster: DevCluster, follower: int, rpc: str) -> Writers:
    """SIGKILL `follower` under 4 writers (through the other replicas), start it again,
    and wait until it has served 50 writes on `rpc` (its counters start at 0: they came on
    a connection the leader opened to the new process) and 200 more appends were
    acknowledged; the writers, stopped."""
    writers = Writers(
        [cluster.endpoints[i] for i in range(3) if i != follower], clients=4, per_call=2
    )

    async def scenario() -> None:
        task = asyncio.create_task(writers.run())
        await asyncio.sleep(1.5)
        cluster.kill(follower, signal.SIGKILL)
        await asyncio.sleep(1.0)
        cluster.start_replica(follower)
        acked = len(writers.acknowledged)
        await asyncio.to_thread(
            wait_until,
            lambda: write_requests(cluster, follower, rpc) >= 50,
            60,
            f"{rpc} writes to the restarted follower",
        )
        while len(writers.acknowledged) < acked + 200:  # noqa: ASYNC110
            await asyncio.sleep(0.1)
        writers.stop()
        await task

    asyncio.run(scenario())
    return writers
