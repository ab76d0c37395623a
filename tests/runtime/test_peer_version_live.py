"""Replicas of two builds in one log: the peer protocol version (protocol/peer_version.py,
runtime/foreign.py; docs/upgrades.md, "Mixed versions").

A real 3-replica log whose replicas serve peers of version 1 and up (`--min-peer-protocol
1`, which this build's own messages pass: the log elects and takes appends). Then:
- an older build's peer requests (the right log id, no protocol version: what a build
  from before versions sends), through the peer protocol's own stubs and the write lane,
  are refused with PROTOCOL_TOO_OLD, counted in rlog_old_peer_messages_total and change
  nothing; a newer, unknown version is served;
- a wiped replica of this build recovers in that log (its every message states the version);
  one refused by newer builds (a higher minimum) says so in its Status;
- the read index: the followers stop, and an older build takes one follower's address
  and answers the leader's heartbeats as such a build does (`Empty`, which decodes as
  promised = 0). Its answer is no acknowledgement: a linearizable read is not served
  (LEADERSHIP_UNCONFIRMED). The same peer stating this build's version does confirm it.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
from live import append_acked, scrape, wait_all_voting
from raw_sockets import closed, recv_exactly

from rlog.lane.framed import VERSION, frame, lane_address
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.protocol.peer_version import PROTOCOL
from rlog.tools.dev import DevCluster
from rlog.wire import ErrorDetails, Reason

OFFSET = 1
LOG_ID = "log-v"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    c = DevCluster(
        3,
        tmp_path_factory.mktemp("versions"),
        log_id=LOG_ID,
        metrics=True,
        write_lane_offset=OFFSET,
        replica_args=["--min-peer-protocol", "1"],
    )
    try:
        c.start()
        yield c
    finally:
        c.stop()


def reason_of(call: grpc.RpcError) -> Reason | None:
    details = ErrorDetails.from_metadata(call.trailing_metadata())
    return None if details is None else details.reason


def test_an_older_builds_peer_requests_are_refused_and_change_nothing(cluster):
    with cluster.client() as client:
        for k in range(5):
            (last,) = append_acked(client, [f"v{k}".encode()])  # this build's pass min 1
    leader = cluster.wait_for_leader()
    target = next(i for i in range(3) if i != leader)
    before = cluster.status(target, timeout=5)
    proposal = before.promised + 10**6
    action = pb.Action(position=before.end + 1, type=pb.APPEND, value=b"old", learned=True)
    # What a build from before versions sends: the right log id, no protocol field.
    old = {
        "Promise": pb.PromiseRequest(proposal=proposal, candidate=leader, log_id=LOG_ID),
        "Write": pb.WriteRequest(proposal=proposal, leader=leader, actions=[action], log_id=LOG_ID),
        "Learned": pb.LearnedRequest(
            proposal=proposal, leader=leader, actions=[action], log_id=LOG_ID
        ),
        "Recover": pb.RecoverRequest(log_id=LOG_ID),
    }
    channel = grpc.insecure_channel(cluster.endpoints[target])
    stub = pbg.ReplicaStub(channel)
    try:
        for name, message in old.items():
            with pytest.raises(grpc.RpcError) as caught:
                getattr(stub, name)(message, timeout=5)
            assert caught.value.code() == grpc.StatusCode.FAILED_PRECONDITION, caught.value
            assert reason_of(caught.value) == Reason.PROTOCOL_TOO_OLD, caught.value
            assert "no protocol version" in (caught.value.details() or ""), caught.value
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.WriteStream(iter([old["Write"]]), timeout=5))
        assert reason_of(caught.value) == Reason.PROTOCOL_TOO_OLD, caught.value
        fetch = pb.FetchRequest(to=before.learned, max_actions=10, log_id=LOG_ID)
        setattr(fetch, "from", 1)
        with pytest.raises(grpc.RpcError) as caught:
            list(stub.Fetch(fetch, timeout=5))
        assert reason_of(caught.value) == Reason.PROTOCOL_TOO_OLD, caught.value
        # A newer build's request, of a version this one does not know, is served.
        newer = stub.Recover(pb.RecoverRequest(log_id=LOG_ID, protocol=PROTOCOL + 7), timeout=5)
        assert newer.status == pb.VOTING
    finally:
        channel.close()

    # The write lane: an older build's write frame closes the lane.
    host, port = lane_address(cluster.endpoints[target], OFFSET)
    sock = socket.create_connection((host, port), timeout=10)
    try:
        hello = pb.LaneHello(version=VERSION, log_id=LOG_ID, replica_id=target)
        sock.sendall(frame(hello.SerializeToString()))
        (length,) = struct.unpack("<I", recv_exactly(sock, 4))
        assert pb.LaneWelcome.FromString(recv_exactly(sock, length)).error == ""
        sock.sendall(frame(old["Write"].SerializeToString()))
        assert closed(sock)
    finally:
        sock.close()

    # Nothing taken: no promise at the older build's proposal (an election of this log's
    # own may raise the promise meanwhile, never to that), and none of its entries.
    after = cluster.status(target, timeout=5)
    assert after.promised < proposal and after.proposal < proposal
    cluster.wait_for(
        lambda found: found[target] is not None and found[target].learned >= last,
        30,
        "the follower to learn what was acknowledged",
    )
    with cluster.client(target) as reader:
        assert b"old" not in [e.value for e in reader.read(stale=True)]
    counted = {
        dict(labels)["rpc"]: value
        for (name, labels), value in scrape(cluster, target).items()
        if name == "rlog_old_peer_messages_total"
    }
    for rpc in ("Promise", "Write", "WriteStream", "Learned", "Recover", "Fetch", "lane write"):
        assert counted.get(rpc, 0) >= 1, (rpc, counted)
    assert "refused (PROTOCOL_TOO_OLD)" in cluster.log_file(target).read_text()


def test_this_builds_recovery_passes_a_log_that_refuses_older_builds(cluster):
    """Every peer message of this build states its version: a wiped replica recovers
    (Recover, then a catch-up's Promise, Fetch and Learned) in a log at --min-peer-protocol 1,
    and no replica refuses anything of it."""
    with cluster.client() as client:
        (last,) = append_acked(client, [b"before the wipe"])
    leader = cluster.wait_for_leader()
    wiped, *others = (i for i in range(3) if i != leader)
    others.append(leader)
    cluster.wipe(wiped)
    cluster.start_replica(wiped)
    wait_all_voting(cluster)
    cluster.wait_for(
        lambda found: found[wiped] is not None and found[wiped].learned >= last,
        60,
        "the wiped replica to learn every entry",
    )
    for i in others:
        refused = {
            labels: value
            for (name, labels), value in scrape(cluster, i).items()
            if name == "rlog_old_peer_messages_total"
        }
        assert not any(refused.values()), (i, refused)


class OldPeer:
    """A peer at a stopped replica's address that answers a leader's heartbeats as a
    build from before versions does (`Empty`), or, with `protocol` set, stating it."""

    def __init__(self, address: str) -> None:
        self.protocol = 0
        self.heard = threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))

        def learned(request: bytes, context: grpc.ServicerContext) -> bytes:
            self.heard.set()
            if not self.protocol:
                return pb.Empty().SerializeToString()
            return pb.LearnedResponse(protocol=self.protocol).SerializeToString()

        identity: Callable[[bytes], bytes] = lambda raw: raw  # noqa: E731
        handler = grpc.unary_unary_rpc_method_handler(
            learned, request_deserializer=identity, response_serializer=identity
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("rlog.v1.Replica", {"Learned": handler}),)
        )
        self.server.add_insecure_port(address)
        self.server.start()

    def stop(self) -> None:
        self.server.stop(grace=None)


def linearizable_read(cluster: DevCluster, leader: int) -> grpc.RpcError | None:
    """A linearizable read at the leader: None if served, else its error."""
    channel = grpc.insecure_channel(cluster.endpoints[leader])
    try:
        list(pbg.LogStub(channel).Read(pb.ReadRequest(), timeout=10))
        return None
    except grpc.RpcError as error:
        return error
    finally:
        channel.close()


def test_an_older_builds_answer_to_the_read_index_is_no_acknowledgement(cluster):
    leader = cluster.wait_for_leader()
    old_one, other = (i for i in range(3) if i != leader)
    cluster.stop_replica(old_one)
    peer = OldPeer(cluster.endpoints[old_one])
    try:
        # The leader hears the older build (its check-quorum counts it) before the other
        # follower stops: it keeps leading, with the older build as its only follower.
        assert peer.heard.wait(30), "the leader's heartbeats never reached the older build"
        cluster.stop_replica(other)
        error = linearizable_read(cluster, leader)
        assert error is not None, "an older build's empty answer confirmed a read"
        assert reason_of(error) == Reason.LEADERSHIP_UNCONFIRMED, error
        # The same peer stating this build's version (still promised 0) confirms it: the
        # leader was not deposed, its read was only unconfirmed.
        peer.protocol = PROTOCOL
        assert linearizable_read(cluster, leader) is None
    finally:
        peer.stop()


def test_a_replica_refused_by_newer_builds_says_to_upgrade_it(tmp_path):
    """A log whose replicas serve only versions above this build's (a future build that
    raised the minimum) and one of its replicas rejoining empty on this build: they refuse
    its Recover, and its Status says why (not merely "unreachable")."""
    newer = DevCluster(3, tmp_path, replica_args=["--min-peer-protocol", str(PROTOCOL + 1)])
    try:
        newer.start(wait=False)
        newer.wipe(2)
        newer.start_replica(2)
        newer.wait_for(
            lambda found: (
                found[2] is not None
                and "replicas 0, 1 refuse this build's peer protocol" in found[2].reason
            ),
            30,
            "the rejoining replica to say it is refused",
        )
        assert newer.status(2, timeout=5).status == pb.EMPTY
    finally:
        newer.stop()
