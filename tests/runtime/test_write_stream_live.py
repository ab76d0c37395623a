"""The leader's writes to its followers on one `WriteStream` per follower (docs/data-path.md,
"Leader to followers: one stream per peer"), with real replica processes: the writes travel
on the stream (the followers' own request counters say so), a follower killed and restarted
mid-load gets a new stream, a connection cut mid-stream fails only the writes pending on it,
and a follower without WriteStream gets unary writes. Every acknowledged append is checked
on every replica with the consistency checker."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from faultproxy import FaultProxy
from live import (
    Writers,
    append_acked,
    check,
    kill_and_restart_mid_load,
    scrape,
    settled_failures,
    wait_until,
    write_failures,
    write_requests,
)

from rlog.config import NO_WRITE_STREAM_ENV
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow


def streams_opened(cluster: DevCluster, leader: int, peer: int) -> float:
    return scrape(cluster, leader).get(
        ("rlog_write_streams_opened_total", (("peer", str(peer)),)), 0.0
    )


def batches_sent(cluster: DevCluster, leader: int) -> float:
    """Write batches the leader has sent (each goes to every replica, itself included)."""
    return scrape(cluster, leader).get(("rlog_write_batch_entries_count", ()), 0.0)


class ProxiedCluster(DevCluster):
    """Replicas that reach each other only through a FaultProxy in front of each (clients
    connect directly), so a test can cut every connection into one replica at once."""

    proxies: list[FaultProxy]

    def prepare(self) -> ProxiedCluster:
        super().prepare()
        if not getattr(self, "proxies", None):
            self.proxies = [
                FaultProxy(address, 0.0, seed=i).start() for i, address in enumerate(self.addresses)
            ]
        return self

    def command(self, i: int) -> list[str]:
        cmd = super().command(i)
        cmd[cmd.index("--peers") + 1] = ",".join(p.address for p in self.proxies)
        return [*cmd, "--listen", self.addresses[i]]

    def stop(self) -> None:
        super().stop()
        for proxy in getattr(self, "proxies", []):
            proxy.stop()


def test_appends_travel_on_one_stream_per_follower(tmp_path):
    with DevCluster(3, tmp_path, metrics=True, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        followers = [i for i in range(3) if i != leader]
        acknowledged: dict[int, bytes] = {}
        with cluster.client() as client:
            # The leader's first writes to a follower not listening yet fail, and go on
            # failing while gRPC waits to dial it again (live.write_failures): appended until
            # both followers took a write on their stream, failures counted from there.
            def reached() -> bool:
                (position,) = append_acked(client, [b"first"])
                acknowledged[position] = b"first"
                return all(write_requests(cluster, i, "stream") >= 1 for i in followers)

            wait_until(reached, 30, "a stream write to both followers")
            failed = {i: settled_failures(cluster, leader, i) for i in followers}
            before = {i: write_requests(cluster, i, "stream") for i in followers}
            opened = {i: streams_opened(cluster, leader, i) for i in followers}
            for k in range(100):
                value = f"v{k}".encode()
                (position,) = append_acked(client, [value])
                acknowledged[position] = value
        assert cluster.leader() == leader, "the leader changed: the counts below mean nothing"
        for i in followers:
            # Every append is one write to every follower (an append retried after an
            # unknown outcome, more), all on the stream, none unary. An append is answered
            # once one follower has it: the other may count its last write a moment later.
            wait_until(
                lambda i=i: write_requests(cluster, i, "stream") - before[i] >= 100,
                30,
                f"follower {i} counting the 100 writes",
            )
            assert write_requests(cluster, i, "unary") == 0
            # One stream per follower, opened by the first write, carried them all.
            assert opened[i] >= 1
            assert streams_opened(cluster, leader, i) == opened[i]
            assert write_failures(cluster, leader, i) == failed[i]
        check(cluster, acknowledged)


def test_follower_killed_and_restarted_mid_load_gets_a_new_stream(tmp_path):
    with DevCluster(3, tmp_path, metrics=True, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        follower = next(i for i in range(3) if i != leader)
        writers = kill_and_restart_mid_load(cluster, follower, "stream")
        assert cluster.leader() == leader
        assert streams_opened(cluster, leader, follower) >= 2, "the stream was not reopened"
        assert write_requests(cluster, follower, "unary") == 0
        check(cluster, writers.acknowledged)


def test_a_cut_connection_fails_only_the_writes_pending_on_the_stream(tmp_path):
    with ProxiedCluster(3, tmp_path, metrics=True, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        follower = next(i for i in range(3) if i != leader)
        proposal = cluster.status(leader).proposal
        writers = Writers(
            [cluster.endpoints[i] for i in range(3) if i != follower], clients=4, per_call=2
        )
        seen: dict[str, float] = {}

        async def scenario() -> None:
            task = asyncio.create_task(writers.run())
            # Failures counted from the follower's first stream write on (live.write_failures).
            await asyncio.to_thread(
                wait_until,
                lambda: write_requests(cluster, follower, "stream") >= 1,
                30,
                "a first stream write to the follower",
            )
            await asyncio.sleep(1.5)
            seen["failed_before"] = await asyncio.to_thread(
                settled_failures, cluster, leader, follower
            )
            seen["batches_before"] = await asyncio.to_thread(batches_sent, cluster, leader)
            # Counted, not assumed to be 1: a stream may have ended with nothing pending on it
            # (no write failed) and been reopened before this point.
            opened = await asyncio.to_thread(streams_opened, cluster, leader, follower)
            # Paused, the follower answers nothing: the leader's writes to it pile up on the
            # stream (a quorum goes on without it), then its connections are cut.
            cluster.pause(follower)
            await asyncio.sleep(0.5)
            cut = await asyncio.to_thread(cluster.proxies[follower].cut_all)
            assert cut > 0, "no connection to cut"
            cluster.resume(follower)
            # The failed writes are counted by the tasks that sent them, which the broken
            # stream wakes one loop turn after it ends: a scrape can see the new stream
            # before the count. Wait for both; a failure count that never comes times out.
            await asyncio.to_thread(
                wait_until,
                lambda: (
                    streams_opened(cluster, leader, follower) > opened
                    and write_failures(cluster, leader, follower) > seen["failed_before"]
                ),
                30,
                "a new stream, and the writes pending on the cut one failed",
            )
            seen["failed"] = await asyncio.to_thread(settled_failures, cluster, leader, follower)
            seen["batches_after"] = await asyncio.to_thread(batches_sent, cluster, leader)
            seen["stream_writes"] = await asyncio.to_thread(
                write_requests, cluster, follower, "stream"
            )
            acked = len(writers.acknowledged)
            while len(writers.acknowledged) < acked + 300:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
            writers.stop()
            await task

        asyncio.run(scenario())
        failed = seen["failed"] - seen["failed_before"]
        # The writes pending on the cut stream failed (no timeout can have fired: 10 s) ...
        assert failed >= 1
        # ... and no more than were sent from just before the pause to the new stream (plus
        # the few in flight when the pause began).
        assert failed <= seen["batches_after"] - seen["batches_before"] + 16
        # The next ones succeed: no failure since, and they reach the follower on the stream.
        assert write_failures(cluster, leader, follower) == seen["failed"]
        assert write_requests(cluster, follower, "stream") > seen["stream_writes"]
        assert cluster.status(leader).proposal == proposal, "the leader was deposed"
        check(cluster, writers.acknowledged)


def test_a_follower_without_write_stream_gets_unary_writes(tmp_path):
    with DevCluster(3, tmp_path, metrics=True, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        old, new = [i for i in range(3) if i != leader]
        acknowledged: dict[int, bytes] = {}
        with cluster.client() as client:
            for k in range(20):
                (position,) = append_acked(client, [f"a{k}".encode()])
                acknowledged[position] = f"a{k}".encode()
            # The follower comes back as a build without WriteStream (the RPC unregistered).
            cluster.kill(old, signal.SIGTERM)
            cluster.env = {**os.environ, NO_WRITE_STREAM_ENV: "1"}
            cluster.start_replica(old)
            cluster.env = None

            # Until the leader reconnects, its writes to the follower fail (a quorum goes on).
            def reached() -> bool:
                (position,) = append_acked(client, [b"c"])
                acknowledged[position] = b"c"
                return write_requests(cluster, old, "unary") > 0

            wait_until(reached, 30, "a first unary write to the restarted follower")
            unary_before = write_requests(cluster, old, "unary")
            stream_before = write_requests(cluster, new, "stream")
            for k in range(100):
                (position,) = append_acked(client, [f"b{k}".encode()])
                acknowledged[position] = f"b{k}".encode()
            # A quorum (the leader and the other follower) may answer before it does. Not one
            # request per append: a follower that lags (a loaded host) gets several entries in
            # one write, so the counts only say which path each follower's writes took.
            wait_until(
                lambda: write_requests(cluster, old, "unary") > unary_before,
                30,
                "unary writes to the follower without WriteStream",
            )
        assert cluster.leader() == leader
        assert write_requests(cluster, old, "stream") == 0
        # The other follower still gets its writes on the stream.
        assert write_requests(cluster, new, "stream") > stream_before
        assert write_requests(cluster, new, "unary") == 0
        check(cluster, acknowledged)
