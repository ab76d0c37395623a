"""The write lane with real replica processes (docs/data-path.md, "The write lane"): the
leader's writes travel on it once it is open (the followers' own counters say so), a
follower killed and restarted mid-load gets a new lane, a follower that serves no lane gets
its writes on the gRPC stream, and a connection that names the wrong replica or log, or
breaks the framing, is refused without disturbing the log. Every acknowledged append is
checked on every replica with the consistency checker."""

from __future__ import annotations

import signal
import socket
import struct

import pytest
from live import (
    append_acked,
    check,
    kill_and_restart_mid_load,
    lanes_opened,
    settled_failures,
    wait_until,
    write_failures,
    write_requests,
)
from raw_sockets import closed, recv_exactly

from rlog.client import Client
from rlog.lane.framed import VERSION, frame, lane_address
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

OFFSET = 1


class MixedCluster(DevCluster):
    """A lane on every replica but those in `without` (started with the offset 0)."""

    without: set[int] = set()

    def command(self, i: int) -> list[str]:
        cmd = super().command(i)
        if i in self.without:
            at = cmd.index("--write-lane-offset")
            del cmd[at : at + 2]
        return cmd


def open_lanes(
    cluster: DevCluster,
    client: Client,
    leader: int,
    followers: list[int],
    acknowledged: dict[int, bytes],
) -> dict[int, float]:
    """Append until the leader's lanes to `followers` are open (the first writes go on the
    gRPC stream while they open in the background); the leader's failed writes to each
    follower so far.

    Writes that failed before the lanes opened are not the lane's, and may fail: the
    leader's counter starts with its process, and the replicas start at once. On a loaded
    machine the first replica up was elected while another was not listening yet: its
    pre-vote's Status call to that follower was refused, and gRPC then fails every call on
    that channel at once until it dials again (a back-off of up to 1 s, rlog/wire.py), as
    for any peer that is down. The leader's log had the election's fill write (position 0)
    and the first appends' stream writes to it fail UNAVAILABLE "Connection refused", the
    last one 220 ms after the follower said it was listening; its lane opened 550 ms after
    that. The quorum carried every write, and the follower learned them (`check`). So the
    tests count failures from the moment the lanes are open (once the count of those before
    settled: a stream write failing at once is counted a loop turn later): none after."""

    def opened() -> bool:
        (position,) = append_acked(client, [b"first"])
        acknowledged[position] = b"first"
        return all(lanes_opened(cluster, leader, i) >= 1 for i in followers)

    wait_until(opened, 30, f"the leader's lanes to replicas {followers}")
    return {i: settled_failures(cluster, leader, i) for i in followers}


def test_appends_travel_on_the_lane_once_it_is_open(tmp_path):
    with DevCluster(
        3, tmp_path, metrics=True, election_timeout=0.5, write_lane_offset=OFFSET
    ) as cluster:
        leader = cluster.wait_for_leader()
        followers = [i for i in range(3) if i != leader]
        acknowledged: dict[int, bytes] = {}
        with cluster.client() as client:
            failed = open_lanes(cluster, client, leader, followers, acknowledged)
            before = {i: write_requests(cluster, i, "lane") for i in followers}
            stream = {i: write_requests(cluster, i, "stream") for i in followers}
            for k in range(200):
                value = f"v{k}".encode()
                (position,) = append_acked(client, [value])
                acknowledged[position] = value
            (position, *rest) = append_acked(client, [b"a", b"b", b"c"])
            acknowledged.update(zip([position, *rest], [b"a", b"b", b"c"], strict=True))
        assert cluster.leader() == leader, "the leader changed: the counts below mean nothing"
        for i in followers:
            # Every append is one write to every follower, all on the lane once it is open (the
            # slower follower may count its last write just after the append was answered).
            wait_until(
                lambda i=i: write_requests(cluster, i, "lane") - before[i] >= 201,
                30,
                f"follower {i} counting the 201 writes",
            )
            assert write_requests(cluster, i, "stream") == stream[i]
            assert write_requests(cluster, i, "unary") == 0
            assert lanes_opened(cluster, leader, i) == 1  # it never broke
            assert write_failures(cluster, leader, i) == failed[i]
        check(cluster, acknowledged)


def test_follower_killed_and_restarted_mid_load_gets_a_new_lane(tmp_path):
    with DevCluster(
        3, tmp_path, metrics=True, election_timeout=0.5, write_lane_offset=OFFSET
    ) as cluster:
        leader = cluster.wait_for_leader()
        follower = next(i for i in range(3) if i != leader)
        writers = kill_and_restart_mid_load(cluster, follower, "lane")
        assert cluster.leader() == leader
        assert lanes_opened(cluster, leader, follower) >= 2, "the lane was not reopened"
        # The leader's log says when its writes to the follower began to fail (the killed
        # one's lane broke, then its channel was refused) and when one was answered again.
        failing, answered = (
            f"writes to replica {follower} fail (",
            f"writes to replica {follower} answered again",
        )
        said = cluster.log_file(leader).read_text
        wait_until(lambda: answered in said(), 30, "the leader saying so")
        assert failing in said()
        assert said().index(failing) < said().rindex(answered)
        assert write_requests(cluster, follower, "unary") == 0
        check(cluster, writers.acknowledged)


def test_a_follower_without_a_lane_gets_its_writes_on_the_stream(tmp_path):
    with MixedCluster(
        3, tmp_path, metrics=True, election_timeout=0.5, write_lane_offset=OFFSET
    ) as cluster:
        leader = cluster.wait_for_leader()
        old, new = [i for i in range(3) if i != leader]
        acknowledged: dict[int, bytes] = {}
        with cluster.client() as client:
            # The follower comes back as a replica that serves no lane.
            cluster.kill(old, signal.SIGTERM)
            cluster.without = {old}
            cluster.start_replica(old)

            def reached() -> bool:
                (position,) = append_acked(client, [b"c"])
                acknowledged[position] = b"c"
                return write_requests(cluster, old, "stream") > 0

            wait_until(reached, 30, "a first stream write to the follower without a lane")
            stream_before = write_requests(cluster, old, "stream")
            lane_before = write_requests(cluster, new, "lane")
            for k in range(100):
                (position,) = append_acked(client, [f"b{k}".encode()])
                acknowledged[position] = f"b{k}".encode()
            wait_until(
                lambda: write_requests(cluster, old, "stream") - stream_before >= 100,
                30,
                "stream writes to the follower without a lane",
            )
        assert cluster.leader() == leader
        assert write_requests(cluster, old, "lane") == 0
        assert write_requests(cluster, old, "unary") == 0
        # The other follower still gets its writes on its lane.
        assert write_requests(cluster, new, "lane") - lane_before >= 100
        check(cluster, acknowledged)


def hello(host: str, port: int, **fields: object) -> tuple[socket.socket, pb.LaneWelcome]:
    sock = socket.create_connection((host, port), timeout=10)
    sock.sendall(frame(pb.LaneHello(**fields).SerializeToString()))  # type: ignore[arg-type]
    (length,) = struct.unpack("<I", recv_exactly(sock, 4))
    return sock, pb.LaneWelcome.FromString(recv_exactly(sock, length))


def test_a_stranger_on_the_lane_is_refused_and_the_log_goes_on(tmp_path):
    with DevCluster(
        3, tmp_path, metrics=True, election_timeout=0.5, write_lane_offset=OFFSET, log_id="lanes"
    ) as cluster:
        leader = cluster.wait_for_leader()
        follower = next(i for i in range(3) if i != leader)
        host, port = lane_address(cluster.endpoints[follower], OFFSET)
        other = 3 - leader - follower
        acknowledged: dict[int, bytes] = {}
        with cluster.client() as client:
            (failed,) = open_lanes(cluster, client, leader, [follower], acknowledged).values()

        sock, welcome = hello(host, port, version=VERSION, log_id="lanes", replica_id=other)
        assert welcome.error == f"this is replica {follower}, not {other}"
        assert closed(sock)
        sock, welcome = hello(host, port, version=VERSION, log_id="other", replica_id=follower)
        assert "of log 'other'; this replica belongs to log 'lanes'" in welcome.error
        assert closed(sock)
        sock, welcome = hello(host, port, version=VERSION, replica_id=follower)  # no log id
        assert "carries no log id; this replica belongs to log 'lanes'" in welcome.error
        assert closed(sock)
        sock, welcome = hello(host, port, version=VERSION + 2, replica_id=follower)
        assert welcome.error == f"lane version {VERSION + 2} is not {VERSION} or {VERSION + 1}"
        assert closed(sock)
        # Not a hello at all: closed without a welcome.
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(frame(b"\xff\xff\xff"))
        assert closed(sock)
        # Welcomed, then a frame that does not parse as a WriteRequest, and one over the limit.
        sock, welcome = hello(host, port, version=VERSION, log_id="lanes", replica_id=follower)
        assert welcome.error == ""
        sock.sendall(frame(b"\xff\xff\xff"))
        assert closed(sock)
        sock, welcome = hello(host, port, version=VERSION, log_id="lanes", replica_id=follower)
        sock.sendall(struct.pack("<I", 2**31))
        assert closed(sock)

        # Nothing of it reached the log: the leader's own lane still carries every write.
        lane_before = write_requests(cluster, follower, "lane")
        with cluster.client() as client:
            for k in range(50):
                (position,) = append_acked(client, [f"after{k}".encode()])
                acknowledged[position] = f"after{k}".encode()
        assert cluster.leader() == leader
        wait_until(
            lambda: write_requests(cluster, follower, "lane") - lane_before >= 50,
            30,
            "lane writes to the follower after the strangers",
        )
        assert lanes_opened(cluster, leader, follower) == 1  # the strangers left it alone
        assert write_failures(cluster, leader, follower) == failed
        check(cluster, acknowledged)
