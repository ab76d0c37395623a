"""The client's append lane with real replica processes (docs/data-path.md, "The client's
append lane"): a client made with the defaults appends on the replica's lane once it is open
(the replica's own counters say so) with the answers, conditions and errors of a gRPC
`Append`; a follower takes lane appends and forwards them; a replica without a lane keeps
the client on gRPC; a leader killed under lane writers loses and duplicates nothing
(sessions re-send the unknown outcomes on gRPC); and raw connections that pipeline frames
get every answer by its id, while bad hellos are refused."""

from __future__ import annotations

import asyncio
import signal
import socket
import struct
import time

import pytest
from live import check, scrape, wait_until
from raw_sockets import closed, recv_exactly

from rlog.client import AsyncClient, Client
from rlog.client.errors import (
    ConditionFailed,
    EntryTooLarge,
    InvalidArgument,
    OutcomeUnknown,
    Unavailable,
)
from rlog.client.security import Credentials
from rlog.lane.framed import KINDS_VERSION, frame, lane_address
from rlog.packed import pack
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

OFFSET = 1


def append_requests(cluster: DevCluster, i: int, rpc: str) -> float:
    """Client append requests replica i handled on `rpc` (unary, stream, lane)."""
    return scrape(cluster, i).get(("rlog_append_requests_total", (("rpc", rpc),)), 0.0)


def lane_client(cluster: DevCluster, i: int | None = None) -> Client:
    return cluster.client(i)  # the lane is the default


def wait_for_lane(client: Client) -> None:
    """Append until the client's lane to its current endpoint is open (the first appends
    go on gRPC while it opens in the background)."""
    deadline = time.monotonic() + 20
    while True:
        client.append([b"opening"])
        lane = client._async._lanes.get(client._async._endpoints.current)
        if lane is not None and lane.is_open:
            return
        assert time.monotonic() < deadline, f"the lane never opened: {lane and lane.last_error}"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DevCluster(
        3,
        tmp_path_factory.mktemp("append-lane"),
        metrics=True,
        election_timeout=0.5,
        write_lane_offset=OFFSET,
        log_id="lanes",
    ) as c:
        yield c


def test_appends_travel_on_the_lane_with_their_answers(cluster):
    leader = cluster.wait_for_leader()
    acknowledged: dict[int, bytes] = {}
    with lane_client(cluster, leader) as client:
        wait_for_lane(client)
        lane_before = append_requests(cluster, leader, "lane")
        unary_before = append_requests(cluster, leader, "unary")
        for k in range(200):
            values = [f"lane{k}-{j}".encode() for j in range(k % 3 + 1)]
            positions = client.append(values)
            assert len(positions) == len(values)
            assert positions == list(range(positions[0], positions[0] + len(values)))
            acknowledged.update(zip(positions, values, strict=True))
        # packed appends take the same path
        data, offsets = pack([b"p1", b"", b"p3"])
        packed = client.append_packed(data, offsets)
        acknowledged.update(zip(packed, [b"p1", b"", b"p3"], strict=True))
    assert cluster.leader() == leader, "the leader changed: the counts below mean nothing"
    assert append_requests(cluster, leader, "lane") - lane_before == 201
    assert append_requests(cluster, leader, "unary") == unary_before
    check(cluster, acknowledged)


def test_a_client_made_with_lane_false_appends_on_grpc_only(cluster):
    leader = cluster.wait_for_leader()
    with cluster.client(leader, lane=False) as client:
        lane_before = append_requests(cluster, leader, "lane")
        unary_before = append_requests(cluster, leader, "unary")
        for k in range(30):
            client.append([f"grpc-only{k}".encode()])
            time.sleep(0.01)  # time a lane would have had to open
        assert client._async._lanes == {}
    assert cluster.leader() == leader, "the leader changed: the counts below mean nothing"
    assert append_requests(cluster, leader, "lane") == lane_before
    assert append_requests(cluster, leader, "unary") - unary_before >= 30


def test_conditions_and_errors_on_the_lane_are_those_of_grpc(cluster):
    leader = cluster.wait_for_leader()
    with lane_client(cluster, leader) as lane, cluster.client(leader, lane=False) as plain:
        wait_for_lane(lane)
        lane_before = append_requests(cluster, leader, "lane")
        (at,) = lane.append([b"conditional"])
        # A failed condition: the same error, the same fields, on both paths.
        failures = []
        for client in (lane, plain):
            with pytest.raises(ConditionFailed) as failed:
                client.append([b"never"], if_next=at)
            failures.append(failed.value)
        assert failures[0].next_position == failures[1].next_position == at + 1
        assert lane.append([b"next"], if_next=at + 1) == [at + 1]
        # A stale writer epoch.
        stale = plain.take_epoch()
        epoch = plain.take_epoch()
        with pytest.raises(ConditionFailed):
            lane.append([b"stale"], epoch=stale)
        (fenced,) = lane.append([b"fenced"], epoch=epoch)
        # An entry over the limit and packed offsets that do not add up: nothing appended.
        with pytest.raises(EntryTooLarge):
            lane.append([b"x" * (8 << 20)])
        with pytest.raises(InvalidArgument):
            lane.append_packed(b"abc", struct.pack("<3I", 0, 5, 2))
        (after,) = lane.append([b"after"])
        assert after == fenced + 1
    assert cluster.leader() == leader
    # Every one of them went on the lane (the oversized one too: refused by the leader).
    assert append_requests(cluster, leader, "lane") - lane_before >= 7


def test_a_follower_takes_lane_appends_and_forwards_them(cluster):
    leader = cluster.wait_for_leader()
    follower = next(i for i in range(3) if i != leader)
    acknowledged: dict[int, bytes] = {}
    with lane_client(cluster, follower) as client:
        wait_for_lane(client)
        before = append_requests(cluster, follower, "lane")
        for k in range(50):
            (position,) = client.append([f"via-follower{k}".encode()])
            acknowledged[position] = f"via-follower{k}".encode()
    assert append_requests(cluster, follower, "lane") - before == 50
    check(cluster, acknowledged)


def test_raw_frames_pipelined_are_answered_by_id(cluster):
    """A client may send many appends before reading an answer: each is answered, with its
    request's id, whatever order they finish in."""
    leader = cluster.wait_for_leader()
    host, port = lane_address(cluster.endpoints[leader], OFFSET)
    sock = socket.create_connection((host, port), timeout=10)
    hello = pb.LaneHello(version=KINDS_VERSION, kind=pb.LANE_APPENDS, log_id="lanes")
    sock.sendall(frame(hello.SerializeToString()))
    (length,) = struct.unpack("<I", recv_exactly(sock, 4))
    assert pb.LaneWelcome.FromString(recv_exactly(sock, length)).error == ""
    ids = list(range(100, 400))
    sock.sendall(
        b"".join(
            frame(pb.AppendRequest(id=i, values=[f"raw{i}".encode()]).SerializeToString())
            for i in ids
        )
    )
    answers: dict[int, pb.AppendResponse] = {}
    while len(answers) < len(ids):
        (length,) = struct.unpack("<I", recv_exactly(sock, 4))
        answer = pb.AppendResponse.FromString(recv_exactly(sock, length))
        answers[answer.id] = answer
    sock.close()
    assert sorted(answers) == ids
    assert all(a.code == 0 and a.count == 1 for a in answers.values())
    assert len({a.first for a in answers.values()}) == len(ids)  # one position each
    with cluster.client(leader) as reader:
        first = min(a.first for a in answers.values())
        last = max(a.first for a in answers.values())
        read = {e.position: e.value for e in reader.read(first, last)}
    assert {read[a.first] for a in answers.values()} == {f"raw{i}".encode() for i in ids}


def test_bad_hellos_and_frames_are_refused(cluster):
    leader = cluster.wait_for_leader()
    host, port = lane_address(cluster.endpoints[leader], OFFSET)

    def hello(message: pb.LaneHello) -> tuple[socket.socket, str]:
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(frame(message.SerializeToString()))
        (length,) = struct.unpack("<I", recv_exactly(sock, 4))
        return sock, pb.LaneWelcome.FromString(recv_exactly(sock, length)).error

    sock, error = hello(pb.LaneHello(version=KINDS_VERSION, kind=pb.LANE_APPENDS, log_id="x"))
    assert error == "this replica belongs to log 'lanes', not 'x'"
    assert closed(sock)
    sock, error = hello(pb.LaneHello(version=KINDS_VERSION, kind=7))  # type: ignore[arg-type]
    assert error == "lane kind 7 is not served here"
    assert closed(sock)
    # Welcomed, then a frame that is no AppendRequest: closed, and the log goes on.
    sock, error = hello(pb.LaneHello(version=KINDS_VERSION, kind=pb.LANE_APPENDS))
    assert error == ""
    sock.sendall(frame(b"\xff\xff\xff"))
    assert closed(sock)
    with cluster.client(leader) as client:
        client.append([b"still fine"])


def test_a_replica_without_a_lane_keeps_the_client_on_grpc(tmp_path):
    with DevCluster(3, tmp_path, metrics=True, election_timeout=0.5) as cluster:
        leader = cluster.wait_for_leader()
        with lane_client(cluster, leader) as client:
            for k in range(30):
                client.append([f"grpc{k}".encode()])
            lane = client._async._lanes[client._async._endpoints.current]
            assert not lane.is_open
            assert "serves no lane" in lane.last_error
        assert append_requests(cluster, leader, "unary") >= 30
        assert append_requests(cluster, leader, "lane") == 0


def test_a_client_with_a_bearer_token_is_told_to_use_grpc():
    with pytest.raises(ValueError, match="authenticates by client certificate"):
        AsyncClient("127.0.0.1:1", lane=True, credentials=Credentials(token="t"))
    with pytest.raises(ValueError, match="lane or stream"):
        AsyncClient("127.0.0.1:1", lane=True, stream=True)


def test_leader_killed_under_lane_writers_loses_and_duplicates_nothing(tmp_path):
    """Writers on the lane, the leader SIGKILLed mid-load: appends pending on its lane have
    an unknown outcome, the client re-sends them in its session (on gRPC, to the next
    leader), and the log holds every acknowledged value exactly once."""
    with DevCluster(
        3, tmp_path, metrics=True, election_timeout=0.5, write_lane_offset=OFFSET
    ) as cluster:
        leader = cluster.wait_for_leader()
        acknowledged: dict[int, bytes] = {}
        sent: set[bytes] = set()
        stop = [time.monotonic() + 120.0]  # moved to 2 s after the next leader is elected

        async def writer(client: AsyncClient, w: int) -> None:
            k = 0
            while time.monotonic() < stop[0]:
                value = f"w{w}-{k}".encode()
                k += 1
                sent.add(value)
                try:
                    (position,) = await client.append([value])
                except (OutcomeUnknown, Unavailable):
                    continue  # may or may not be in the log: not counted as acknowledged
                acknowledged[position] = value

        async def scenario() -> float:
            endpoints = [cluster.endpoints[leader]] + [
                cluster.endpoints[i] for i in range(3) if i != leader
            ]
            async with AsyncClient(endpoints, lane=True, append_timeout=30.0) as client:
                tasks = [asyncio.create_task(writer(client, w)) for w in range(8)]
                # Killed once the writers are on the lane (not after a fixed time, which a
                # slow host may spend opening it), and writing on for 2 s after the next
                # leader is elected (so the re-sent appends meet it, whatever the host).
                await asyncio.to_thread(
                    wait_until,
                    lambda: append_requests(cluster, leader, "lane") > 50,
                    30,
                    "50 appends on the leader's lane",
                )
                lanes = append_requests(cluster, leader, "lane")
                cluster.kill(leader, signal.SIGKILL)
                await asyncio.to_thread(cluster.wait_for_leader, 30, [leader])
                stop[0] = time.monotonic() + 2.0
                await asyncio.gather(*tasks)
                return lanes

        on_lane = asyncio.run(scenario())
        assert on_lane > 50, "the writers were not on the lane when the leader died"
        assert cluster.wait_for_leader(exclude=[leader]) != leader
        cluster.start_replica(leader)
        wait_until(lambda: cluster.leader() is not None, 30, "a leader")
        report = check(cluster, acknowledged)
        # Exactly once: no value twice in the log (a retried append's second try is
        # answered with the first's positions, never appended again).
        values = [v for v in report.replicas[0].entries.values() if v in sent]
        assert len(values) == len(set(values)), "a value was appended twice"
        assert set(acknowledged.values()) <= set(values)
