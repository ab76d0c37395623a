"""Sessions belong to their owner (docs/security.md, "Sessions"), on a real 3-replica log
with the append lane: an intruder who sends appends with another client's session id and
the sequence numbers that client will use next is refused (PERMISSION_DENIED,
SESSION_NOT_YOURS) on every way in (a unary `Append` to the leader or to a follower, the
`AppendStream`, the append lane), and the owner's own appends with those numbers are then
in the log, read back, instead of being answered as duplicates of the intruder's. The
secret survives a leader change (the new leader learned it with the SESSION entry) and a
restart of every replica (each rebuilds it from its disk).

The attack is made for real: the intruder's requests go out exactly as a client without
the secret (or with a guessed one) would send them."""

from __future__ import annotations

import socket
import struct
import time

import grpc
import pytest
from live import raw_append
from raw_sockets import recv_exactly

from rlog.client import Client
from rlog.client.errors import OutcomeUnknown, SessionNotYours, Unavailable
from rlog.client.sessions import SessionGrant
from rlog.lane.framed import KINDS_VERSION, frame, lane_address
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.tools.dev import DevCluster
from rlog.wire import CLIENT_CHANNEL_OPTIONS, Reason

pytestmark = pytest.mark.slow

OFFSET = 1  # the write lane's port offset
LOG_ID = "owners"
GUESSED = b"\x00" * 16  # an intruder's guess at a secret


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DevCluster(
        3,
        tmp_path_factory.mktemp("session-owner"),
        election_timeout=0.5,
        write_lane_offset=OFFSET,
        log_id=LOG_ID,
    ) as c:
        c.wait_for(all, what="every replica answering")
        yield c


def resent(endpoint: str, request: pb.AppendRequest) -> list[int]:
    """`raw_append`, sent again while the replica cannot take appends yet (after an election or
    a restart it answers so before it has done anything: Unavailable, not attempted), and
    after an outcome it could not know (leadership moved during the append, as after a
    restart of every replica): the session's sequence makes the same request safe to send
    again, which is what sessions are for, and the tests check the position it answers."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return raw_append(endpoint, request)
        except (Unavailable, OutcomeUnknown):
            assert time.monotonic() < deadline, "no leader took the append"
            time.sleep(0.05)


def streamed(endpoint: str, requests: list[pb.AppendRequest]) -> list[pb.AppendResponse]:
    """The requests on one `AppendStream` (ids 1..n), their answers in id order."""
    for i, request in enumerate(requests, 1):
        request.id = i
    with grpc.insecure_channel(endpoint, options=CLIENT_CHANNEL_OPTIONS) as channel:
        answers = list(pbg.LogStub(channel).AppendStream(iter(requests), timeout=30))
    return sorted(answers, key=lambda a: a.id)


class RawLane:
    """A client's append lane to one replica, spoken by hand: each request one frame, each
    answer read before the next is sent."""

    def __init__(self, endpoint: str) -> None:
        host, port = lane_address(endpoint, OFFSET)
        self.sock = socket.create_connection((host, port), timeout=30)
        hello = pb.LaneHello(version=KINDS_VERSION, kind=pb.LANE_APPENDS, log_id=LOG_ID)
        self.sock.sendall(frame(hello.SerializeToString()))
        assert pb.LaneWelcome.FromString(self._frame()).error == ""
        self.next_id = 1

    def _frame(self) -> bytes:
        (length,) = struct.unpack("<I", recv_exactly(self.sock, 4))
        return recv_exactly(self.sock, length)

    def append(self, request: pb.AppendRequest) -> pb.AppendResponse:
        request.id = self.next_id
        self.next_id += 1
        self.sock.sendall(frame(request.SerializeToString()))
        answer = pb.AppendResponse.FromString(self._frame())
        assert answer.id == request.id
        return answer

    def close(self) -> None:
        self.sock.close()


def in_session(
    grant: SessionGrant, sequence: int, value: bytes, secret: bytes | None = None
) -> pb.AppendRequest:
    """An append of `value` as (grant's session, sequence), with `secret` (default: the
    grant's own; b"": none)."""
    return pb.AppendRequest(
        values=[value],
        session=grant.session,
        sequence=sequence,
        session_secret=grant.secret if secret is None else secret,
    )


def read_back(cluster: DevCluster, positions: list[int]) -> list[bytes]:
    with cluster.client() as reader:
        entries = {e.position: e.value for e in reader.read(min(positions), max(positions))}
    return [entries[p] for p in positions]


def assert_not_yours(answer: pb.AppendResponse) -> None:
    assert answer.code == grpc.StatusCode.PERMISSION_DENIED.value[0], answer
    assert answer.reason == Reason.SESSION_NOT_YOURS.value, answer
    assert "is not yours" in answer.error and not answer.count and not answer.positions


def test_an_intruder_on_grpc_is_refused_and_the_owners_appends_are_in_the_log(cluster):
    leader = cluster.wait_for_leader()
    follower = (leader + 1) % 3
    at_leader, at_follower = cluster.endpoints[leader], cluster.endpoints[follower]
    with cluster.client(leader) as owner_client:
        grant = owner_client.open_session()
    assert len(grant.secret) == 16
    owned = [raw_append(at_leader, in_session(grant, n, b"owner-%d" % n))[0] for n in (1, 2, 3)]
    # The intruder knows the session id (a position, anyone who reads the log sees it) and
    # the owner's next sequence numbers: without the secret, with a guess, to the leader,
    # through a follower (forwarded), on the AppendStream.
    for n in (4, 5, 6):
        for endpoint, secret in ((at_leader, b""), (at_leader, GUESSED), (at_follower, b"")):
            with pytest.raises(SessionNotYours) as refused:
                raw_append(endpoint, in_session(grant, n, b"intruder-%d" % n, secret))
            assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        # A retry of an answered sequence is not answered either: no positions leak.
        with pytest.raises(SessionNotYours):
            raw_append(at_leader, in_session(grant, 1, b"intruder-replay", b""))
    answers = streamed(
        at_leader, [in_session(grant, n, b"intruder-%d" % n, GUESSED) for n in (4, 5, 6)]
    )
    for answer in answers:
        assert_not_yours(answer)
    # The owner's 4..6 are appended (new positions), not answered as the intruder's.
    owned += [raw_append(at_leader, in_session(grant, n, b"owner-%d" % n))[0] for n in (4, 5, 6)]
    assert len(set(owned)) == 6 and owned == sorted(owned)
    assert read_back(cluster, owned) == [b"owner-%d" % n for n in range(1, 7)]
    # And its retries still get the original positions (dedup works for the owner).
    assert raw_append(at_follower, in_session(grant, 5, b"owner-5")) == [owned[4]]
    with cluster.client() as reader:
        assert not [e for e in reader.read() if e.value.startswith(b"intruder")]


def test_an_intruder_on_the_lane_is_refused_and_the_owners_appends_are_in_the_log(cluster):
    leader = cluster.wait_for_leader()
    follower = (leader + 1) % 3
    with cluster.client(leader) as owner_client:
        grant = owner_client.open_session()
    owner, intruder = RawLane(cluster.endpoints[leader]), RawLane(cluster.endpoints[follower])
    try:
        owned = []
        for n in (1, 2, 3):
            answer = owner.append(in_session(grant, n, b"lane-owner-%d" % n))
            assert answer.code == 0 and answer.count == 1, answer
            owned.append(answer.first)
        for n in (4, 5, 6):
            for secret in (b"", GUESSED):
                assert_not_yours(intruder.append(in_session(grant, n, b"lane-intruder", secret)))
            assert_not_yours(owner.append(in_session(grant, n, b"lane-intruder", b"")))
        for n in (4, 5, 6):
            answer = owner.append(in_session(grant, n, b"lane-owner-%d" % n))
            assert answer.code == 0 and answer.count == 1, answer
            owned.append(answer.first)
    finally:
        owner.close()
        intruder.close()
    assert len(set(owned)) == 6
    assert read_back(cluster, owned) == [b"lane-owner-%d" % n for n in range(1, 7)]


def test_the_client_appends_in_its_own_session_with_its_secret(cluster):
    """The client sends its session's secret by itself on each carrier (unary calls, the
    AppendStream, the lane once open): its exactly-once appends (the default) go through."""
    leader = cluster.wait_for_leader()
    for carrier in ({}, {"stream": True}, {"lane": True}):
        with cluster.client(leader, **carrier) as client:
            if carrier.get("lane"):
                deadline = time.monotonic() + 20
                while True:  # the first appends go on gRPC while the lane opens
                    client.append([b"opening the lane"])
                    lane = client._async._lanes.get(client._async._endpoints.current)
                    if lane is not None and lane.is_open:
                        break
                    assert time.monotonic() < deadline, "the lane never opened"
            positions = [client.append([b"mine-%d" % k])[0] for k in range(20)]
            assert read_back(cluster, positions) == [b"mine-%d" % k for k in range(20)]


def test_the_secret_survives_a_leader_change(cluster):
    """The new leader learned the session's check with its SESSION entry: the owner goes
    on in its session there, the intruder is still refused."""
    leader = cluster.wait_for_leader()
    with cluster.client(leader) as owner_client:
        grant = owner_client.open_session()
    at_leader = cluster.endpoints[leader]
    owned = [raw_append(at_leader, in_session(grant, n, b"before-%d" % n))[0] for n in (1, 2, 3)]
    cluster.kill(leader)
    try:
        new_leader = cluster.wait_for_leader(exclude=[leader])
        at_new = cluster.endpoints[new_leader]

        def sent(request: pb.AppendRequest) -> list[int]:
            return resent(at_new, request)

        for n in (4, 5, 6):
            with pytest.raises(SessionNotYours):
                sent(in_session(grant, n, b"intruder-%d" % n, b""))
            with pytest.raises(SessionNotYours):
                sent(in_session(grant, n, b"intruder-%d" % n, GUESSED))
        # The owner's retry of 3 is a duplicate (the new leader rebuilt the answers) ...
        assert sent(in_session(grant, 3, b"before-3")) == [owned[2]]
        # ... and its 4..6 are new entries.
        owned += [sent(in_session(grant, n, b"after-%d" % n))[0] for n in (4, 5, 6)]
        assert len(set(owned)) == 6
        assert read_back(cluster, owned) == [
            *(b"before-%d" % n for n in (1, 2, 3)),
            *(b"after-%d" % n for n in (4, 5, 6)),
        ]
    finally:
        cluster.start_replica(leader)
        cluster.wait_for(all, what="every replica answering")


def test_an_old_client_without_the_secret_gets_a_clear_refusal(cluster):
    """The compatibility contract (rlog/wire.py): a client that predates session secrets
    opens a session (the secret it is sent is an unknown field to it) and sends its
    appends without one: each is refused with SESSION_NOT_YOURS, nothing is appended; it
    can still append without a session."""
    endpoint = cluster.endpoints[cluster.wait_for_leader()]
    with grpc.insecure_channel(endpoint, options=CLIENT_CHANNEL_OPTIONS) as channel:
        opened = pbg.LogStub(channel).OpenSession(pb.OpenSessionRequest(), timeout=30)
    old = pb.AppendRequest(values=[b"old"], session=opened.session, sequence=1)
    with pytest.raises(SessionNotYours) as refused:
        raw_append(endpoint, old)
    assert "carries no session secret" in str(refused.value)
    (position,) = raw_append(endpoint, pb.AppendRequest(values=[b"old, no session"]))
    assert read_back(cluster, [position]) == [b"old, no session"]
    with Client([endpoint]) as reader:
        assert b"old" not in [e.value for e in reader.read()]


def test_the_secret_survives_a_restart_of_every_replica(cluster):
    """Each replica rebuilds its admission state from its own disk at start (the check is
    in the SESSION entry it stored): the intruder is still refused, the owner goes on."""
    leader = cluster.wait_for_leader()
    with cluster.client(leader) as owner_client:
        grant = owner_client.open_session()
    at_leader = cluster.endpoints[leader]
    owned = [raw_append(at_leader, in_session(grant, n, b"restart-%d" % n))[0] for n in (1, 2)]
    for i in range(3):
        cluster.restart(i)
    cluster.wait_for(all, what="every replica answering")
    endpoint = cluster.endpoints[cluster.wait_for_leader()]

    def sent(request: pb.AppendRequest) -> list[int]:
        return resent(endpoint, request)

    with pytest.raises(SessionNotYours):
        sent(in_session(grant, 3, b"intruder-3", GUESSED))
    assert sent(in_session(grant, 2, b"restart-2")) == [owned[1]]
    owned += sent(in_session(grant, 3, b"restart-3"))
    assert read_back(cluster, owned) == [b"restart-%d" % n for n in (1, 2, 3)]
