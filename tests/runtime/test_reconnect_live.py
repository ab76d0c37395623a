"""A certificate rotation reopens a replica's peer channels (`Peers.reconnect`). A new
channel's first call waits for the name to resolve and the connection (and TLS handshake)
to be made; on kind that took 2-3 s (docs/kind.md), and a leader whose heartbeats waited
there lost its quorum at every rotation. Here a real replica sits behind a proxy that, once
told to, holds every NEW connection for 1.5 s before passing it on: the heartbeats a
`Peers` sends through `reconnect` must keep being answered within their 1 s limit, on the
old channel until the new one is connected."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import grpc
import pytest
from faultproxy import FaultProxy

from rlog.certs import DevPki
from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.peers import Peers
from rlog.tools.dev import DevCluster

HOLD = 1.5  # seconds each new connection waits in the proxy: over a heartbeat's 1 s limit, under
# the 2 s a connection attempt may take (wire.CONNECT_TIMEOUT_MS)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    # TLS, as in a rotation: gRPC shares a connection between channels with the same
    # target and credentials, so only new credentials make a new connection.
    with DevCluster(3, tmp_path_factory.mktemp("reconnect"), tls=True) as c:
        yield c


async def test_heartbeats_are_answered_in_time_across_a_reconnect(cluster, tmp_path: Path):
    proxy = FaultProxy(cluster.endpoints[1], cut=0.0, seed=0).start()
    # A fourth process's view: itself (id 0, never dialled), replica 1 behind the proxy and
    # replica 2 directly.
    config = ReplicaConfig(
        id=0, peers=["127.0.0.1:1", proxy.address, cluster.endpoints[2]], data_dir=tmp_path
    )
    peers = Peers(
        config,
        None,  # type: ignore[arg-type]  # core, local and callbacks: unused by these calls
        None,  # type: ignore[arg-type]
        spawn=lambda coro: None,
        on_reply=lambda send, response: None,
        on_failure=lambda send: None,
        promise_timeout=1.0,
    )
    pki = DevPki(cluster.tls_dir)
    me = pki.replica(0)  # the identity of a replica: only replicas may send heartbeats

    def credentials() -> grpc.ChannelCredentials:  # a new object each time, as after a rotation
        return grpc.ssl_channel_credentials(
            pki.ca.read_bytes(), pki.key(me).read_bytes(), pki.cert(me).read_bytes()
        )

    peers.credentials = credentials
    peers.connect()
    beat = pb.LearnedRequest(log_id=cluster.log_id)  # a message of another log is refused
    try:
        assert await peers.heartbeat(peers[1], beat) is not None  # connected, fast
        old_channel = peers[1].channel
        proxy.hold_new(HOLD)
        reconnecting = asyncio.ensure_future(peers.reconnect(grace=HOLD + 2))
        slowest, answers = 0.0, []
        until = time.monotonic() + HOLD + 1
        while time.monotonic() < until:
            started = time.monotonic()
            answers.append(await peers.heartbeat(peers[1], beat))  # 1 s limit each
            slowest = max(slowest, time.monotonic() - started)
            await asyncio.sleep(0.1)
        assert proxy.held >= 1, "the new channel never connected through the proxy"
        assert all(a is not None for a in answers), (
            f"{answers.count(None)} of {len(answers)} heartbeats unanswered during the "
            f"reconnect (slowest {slowest:.2f} s)"
        )
        assert slowest < 1.0
        await asyncio.wait_for(reconnecting, HOLD + 10)
        # After the switch the new channel carries the calls.
        assert peers[1].channel is not None and peers[1].channel is not old_channel
        assert await peers.heartbeat(peers[1], beat) is not None
    finally:
        await peers.close()
        proxy.stop()
