"""Forwarding without processes: which leader a follower forwards to, and the retry rule of a
forwarded call (a call that broke after it may have reached the leader has an unknown
outcome and must not look retryable)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.protocol.replica import ReplicaCore
from rlog.runtime import forwarding as forwarding_module
from rlog.runtime.errors import RpcError
from rlog.runtime.forwarding import Forwarding, KnownLeader
from rlog.runtime.peers import Peer
from rlog.storage.memory import MemoryStorage
from rlog.tools.dev import free_port
from rlog.wire import NOT_ATTEMPTED, ErrorDetails, Reason

PEERS = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]


def forwarding(
    known: KnownLeader,
    status: int = pb.VOTING,
    election_timeout: float = 60.0,
    peers: dict[int, Peer] | None = None,
    append_timeout: float = 10.0,
) -> Forwarding:
    config = ReplicaConfig(
        0,
        PEERS,
        Path("unused"),
        election_timeout=election_timeout,
        append_timeout=append_timeout,
    )
    storage = MemoryStorage()
    core = ReplicaCore(storage)
    batch = core.set_status(status)
    storage.apply(batch)
    core.persisted(batch)
    if peers is None:
        peers = {i: Peer(i, PEERS[i], None, None) for i in (1, 2)}  # type: ignore[arg-type]
    return Forwarding(config, core, peers, lambda: known)


async def test_a_leader_forwards_nowhere():
    assert await forwarding(KnownLeader(True, 0, 1e9, "")).await_leader(False) is None


async def test_a_follower_forwards_to_the_leader_it_heard():
    leader = await forwarding(KnownLeader(False, 2, 0.0, "")).await_leader(False)
    assert leader is not None and leader.id == 2


async def test_a_forwarded_request_is_not_forwarded_again():
    known = KnownLeader(False, 2, 0.0, "")
    with pytest.raises(RpcError) as error:  # after waiting for this replica to lead
        await forwarding(known, election_timeout=0.01).await_leader(True)
    assert error.value.reason == Reason.NOT_LEADER
    assert error.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_replica_that_is_not_voting_says_why():
    known = KnownLeader(False, None, 1e9, "catching up [1, 9]")
    with pytest.raises(RpcError) as error:
        await forwarding(known, pb.RECOVERING).await_leader(False)
    assert error.value.reason == Reason.NO_LEADER
    assert error.value.message == "no leader: this replica is RECOVERING (catching up [1, 9])"


def failed_call(code: grpc.StatusCode, details: str, trailers: Any = None) -> Any:
    async def call() -> None:
        raise grpc.aio.AioRpcError(
            code, grpc.aio.Metadata(), grpc.aio.Metadata(*(trailers or ())), details
        )

    return call()


@pytest.mark.parametrize(
    "code, details, trailers, expected",
    [
        # Broke after it may have reached the leader: the outcome is unknown.
        (grpc.StatusCode.UNAVAILABLE, "Socket closed", None, grpc.StatusCode.ABORTED),
        # The leader said it did nothing, or no connection was made: safe to retry.
        (
            grpc.StatusCode.UNAVAILABLE,
            "no leader",
            ((NOT_ATTEMPTED, "1"),),
            grpc.StatusCode.UNAVAILABLE,
        ),
        (
            grpc.StatusCode.UNAVAILABLE,
            "failed to connect to all addresses",
            None,
            grpc.StatusCode.UNAVAILABLE,
        ),
        # Anything else is passed on as the leader said it.
        (grpc.StatusCode.OUT_OF_RANGE, "past the end", None, grpc.StatusCode.OUT_OF_RANGE),
    ],
)
async def test_a_forwarded_call_keeps_the_retry_rule(code, details, trailers, expected):
    forward = forwarding(KnownLeader(False, 2, 0.0, ""))
    with pytest.raises(RpcError) as error:
        # the peer has no channel to wait on, so a connect failure is passed on at once
        await forward._forwarded_call(
            forward.peers[2], lambda peer: failed_call(code, details, trailers)
        )
    assert error.value.code == expected
    assert error.value.message.startswith(f"leader: {details}")
    assert error.value.message.endswith("(outcome unknown)") == (
        expected == grpc.StatusCode.ABORTED
    )


def unreachable_leader(peer_id: int) -> tuple[grpc.aio.Channel, dict[int, Peer]]:
    """A real channel to a port nothing listens on: every call fails to connect."""
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}")
    stub = pbg.LogStub(channel)
    return channel, {peer_id: Peer(peer_id, "unreachable", None, stub, channel)}  # type: ignore[arg-type]


async def test_a_leader_still_heard_is_waited_for_until_the_append_timeout():
    channel, peers = unreachable_leader(2)
    forward = forwarding(KnownLeader(False, 2, 0.0, ""), peers=peers, append_timeout=1.5)
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(RpcError) as error:
            await forward.append(peers[2], b"x", b"")
    finally:
        await channel.close()
    assert error.value.reason == Reason.LEADER_UNAVAILABLE  # nothing was sent: retryable
    assert loop.time() - started >= 1.4
    assert forward.leader_connect_waits >= 2


async def test_a_leader_no_longer_heard_is_not_waited_on_and_no_other_leader_means_no_answer():
    channel, peers = unreachable_leader(2)
    forward = forwarding(KnownLeader(False, 2, 1e9, ""), peers=peers, append_timeout=0.5)
    try:
        with pytest.raises(RpcError) as error:
            await forward.append(peers[2], b"x", b"")
    finally:
        await channel.close()
    assert error.value.reason == Reason.LEADER_UNAVAILABLE  # nothing was sent: retryable
    assert forward.leader_connect_waits == 0


class Elected:
    """What the election knows: replica 2, heard `heard_ago` seconds ago, until `elected`;
    then replica 1, just heard."""

    def __init__(self, heard_ago: float) -> None:
        self.heard_ago = heard_ago
        self.elected = False

    def __call__(self) -> KnownLeader:
        return (
            KnownLeader(False, 1, 0.0, "")
            if self.elected
            else KnownLeader(False, 2, self.heard_ago, "")
        )


@pytest.mark.parametrize("heard_ago", [1e9, 0.0], ids=["silent", "still heard"])
async def test_a_call_to_a_killed_leader_goes_to_the_next_one_once_it_is_elected(
    heard_ago, monkeypatch
):
    """The leader was SIGKILLed: its port refuses. Whether the election already counts it
    silent or not, the forwarded call goes to the next leader as soon as it is heard, not
    after waiting on the dead one's channel (30 s a wait here, so a wait would show)."""
    monkeypatch.setattr(forwarding_module, "LEADER_CONNECT_WAIT", 30.0)
    servers, (new, _), live = await two_leaders()
    channel, dead = unreachable_leader(2)
    peers = {1: live[1], 2: dead[2]}
    known = Elected(heard_ago)
    forward = forwarding(KnownLeader(False, 2, 0.0, ""), peers=peers, append_timeout=60)
    forward.known_leader = known
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, setattr, known, "elected", True)
    started = loop.time()
    try:
        positions = await forward.append(peers[2], b"x", b"")
    finally:
        await channel.close()
        for server in servers:
            await server.stop(None)
    assert positions == [41] and new.appends == 1
    assert forward.not_leader_redirects == 1
    assert loop.time() - started < 20  # not one of the 30 s waits on the dead channel


class _Leader(pbg.LogServicer):
    """A real gRPC Log service standing for a replica: it appends, or refuses every call as
    not the leader (with the trailers a replica sends), counting what it was asked."""

    def __init__(self, leads: bool) -> None:
        self.leads = leads
        self.appends = 0
        self.reads = 0

    async def _refuse(self, context: grpc.aio.ServicerContext) -> None:
        context.set_trailing_metadata(ErrorDetails(Reason.NOT_LEADER).trailers())
        await context.abort(grpc.StatusCode.UNAVAILABLE, "this replica is not the leader")

    async def Append(self, request, context):
        if not self.leads:
            await self._refuse(context)
        self.appends += 1
        return pb.AppendResponse(first=41, count=1)

    async def Read(self, request, context):
        if not self.leads:
            await self._refuse(context)
        self.reads += 1
        yield pb.ReadResponse()


async def two_leaders() -> tuple[list[grpc.aio.Server], list[_Leader], dict[int, Peer]]:
    """Replica 2, which led, and replica 1, which leads now, as real servers on loopback."""
    servers, services, peers = [], [], {}
    for peer_id, leads in ((1, True), (2, False)):
        server = grpc.aio.server()
        service = _Leader(leads)
        pbg.add_LogServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        peers[peer_id] = Peer(peer_id, f"127.0.0.1:{port}", None, pbg.LogStub(channel), channel)  # type: ignore[arg-type]
        servers.append(server)
        services.append(service)
    return servers, services, peers


class MovingLeader:
    """What the election knows: replica 2 until `moved`, then replica 1."""

    def __init__(self) -> None:
        self.moved = False

    def __call__(self) -> KnownLeader:
        return KnownLeader(False, 1 if self.moved else 2, 0.0, "")


async def test_a_call_refused_as_not_the_leader_goes_to_the_leader_heard_since():
    servers, (new, old), peers = await two_leaders()
    known = MovingLeader()
    forward = forwarding(KnownLeader(False, 2, 0.0, ""), peers=peers, append_timeout=10)
    forward.known_leader = known
    loop = asyncio.get_running_loop()
    loop.call_later(0.2, setattr, known, "moved", True)  # the election hears replica 1
    try:
        positions = await forward.append(peers[2], b"x", b"")
        reads = [r async for r in forward.read(peers[2], pb.ReadRequest())]
    finally:
        for server in servers:
            await server.stop(None)
    assert positions == [41]
    assert len(reads) == 1
    assert (old.appends, new.appends, new.reads) == (0, 1, 1)
    assert forward.not_leader_redirects == 2


async def test_a_refusal_with_no_other_leader_heard_is_passed_on_at_the_append_timeout():
    servers, (new, _), peers = await two_leaders()
    forward = forwarding(KnownLeader(False, 2, 0.0, ""), peers=peers, append_timeout=0.5)
    try:
        with pytest.raises(RpcError) as error:
            await forward.append(peers[2], b"x", b"")
    finally:
        for server in servers:
            await server.stop(None)
    assert error.value.reason == Reason.NOT_LEADER  # it did nothing: the client may retry
    assert new.appends == 0
    assert forward.not_leader_redirects == 0


class _SlowLeader(pbg.LogServicer):
    """A real gRPC Log service standing for a leader that is slow to read: `silent` never
    answers a Read (as a stopped leader, its connection open); else it answers at once, then
    pauses `idle` seconds before its second and last response."""

    def __init__(self, silent: bool, idle: float = 0.0) -> None:
        self.silent = silent
        self.idle = idle

    async def Read(self, request, context):
        if self.silent:
            await asyncio.Event().wait()
        yield pb.ReadResponse(entries=[pb.Entry(position=1)])
        await asyncio.sleep(self.idle)
        yield pb.ReadResponse(entries=[pb.Entry(position=2)])


async def test_only_the_start_of_a_forwarded_read_is_bounded():
    """A leader that never starts a forwarded read fails it LEADER_UNAVAILABLE (retryable)
    by `read_start_limit`; one that started may then be idle longer than that."""
    forward = forwarding(KnownLeader(False, 2, 0.0, ""), election_timeout=0.01, append_timeout=0.01)
    limit = forward.read_start_limit
    servers, peers = [], {}
    for peer_id, service in ((1, _SlowLeader(silent=True)), (2, _SlowLeader(False, limit + 1))):
        server = grpc.aio.server()
        pbg.add_LogServicer_to_server(service, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        peers[peer_id] = Peer(peer_id, f"127.0.0.1:{port}", None, pbg.LogStub(channel), channel)  # type: ignore[arg-type]
        servers.append(server)
    forward.peers = peers

    async def silent() -> RpcError:
        with pytest.raises(RpcError) as error:
            async for _ in forward.read(peers[1], pb.ReadRequest()):
                pass
        return error.value

    async def idle() -> list[int]:
        return [r.entries[0].position async for r in forward.read(peers[2], pb.ReadRequest())]

    try:
        refused, answered = await asyncio.wait_for(asyncio.gather(silent(), idle()), limit + 10)
    finally:
        for server in servers:
            await server.stop(None)
    assert refused.reason == Reason.LEADER_UNAVAILABLE
    assert refused.code == grpc.StatusCode.UNAVAILABLE
    assert f"did not start the forwarded read within {limit:g} s" in refused.message
    assert answered == [1, 2]
