"""The write lane of a log with mutual TLS and roles (`DevCluster(tls=True)`, real replica
processes): the leader's writes travel on lanes over mutual TLS, a certificate whose role
may not call the peer protocol is refused on the lane as on the gRPC port, a caller
without a certificate or without TLS never gets a welcome, and a renewed certificate is
served on the lane without a restart while the writes go on."""

from __future__ import annotations

import socket
import ssl
import struct
import time

import pytest

pytest.importorskip("cryptography")

from live import (
    CAPPED,
    client_as,
    lanes_opened,
    scrape,
    wait_all_voting,
    wait_until,
    write_requests,
)
from raw_sockets import closed, recv_exactly

from rlog import certs
from rlog.client.errors import PermissionDenied
from rlog.lane.framed import KINDS_VERSION, VERSION, frame, lane_address
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

OFFSET = 1


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DevCluster(
        3,
        tmp_path_factory.mktemp("lane-tls"),
        election_timeout=0.5,
        tls=True,
        metrics=True,
        write_lane_offset=OFFSET,
        # The wiped follower's ~42 MB copy lasts over 2 s whatever the host: long enough for
        # its fetch lanes to open over TLS and carry spans.
        replica_args=CAPPED,
    ) as c:
        yield c


def tls_context(cluster: DevCluster, name: str | None) -> ssl.SSLContext:
    """A client context that trusts the dev CA and presents `name`'s certificate (none if
    None)."""
    context = ssl.create_default_context(cafile=str(cluster.tls_dir / "ca.pem"))
    if name is not None:
        context.load_cert_chain(
            cluster.tls_dir / f"{name}.pem", cluster.tls_dir / f"{name}-key.pem"
        )
    return context


def lane_hello(
    cluster: DevCluster, i: int, name: str | None
) -> tuple[ssl.SSLSocket, pb.LaneWelcome, bytes]:
    """Connect to replica i's lane over TLS as `name` and say hello as its leader would;
    the welcome and the certificate the replica presented."""
    host, port = lane_address(cluster.endpoints[i], OFFSET)
    raw = socket.create_connection((host, port), timeout=10)
    sock = tls_context(cluster, name).wrap_socket(raw, server_hostname=host)
    served = sock.getpeercert(binary_form=True)
    assert served is not None
    hello = pb.LaneHello(version=VERSION, log_id=cluster.log_id, replica_id=i)
    sock.sendall(frame(hello.SerializeToString()))
    (length,) = struct.unpack("<I", recv_exactly(sock, 4))
    return sock, pb.LaneWelcome.FromString(recv_exactly(sock, length)), served


def append_some(cluster: DevCluster, count: int) -> dict[int, bytes]:
    acknowledged: dict[int, bytes] = {}
    with client_as(cluster, "writer") as client:
        for k in range(count):
            value = f"tls{time.monotonic_ns()}-{k}".encode()
            (position,) = client.append([value])
            acknowledged[position] = value
    return acknowledged


def read_back(cluster: DevCluster, acknowledged: dict[int, bytes]) -> None:
    first, last = min(acknowledged), max(acknowledged)
    with client_as(cluster, "reader", timeout=10.0) as reader:
        values = {e.position: e.value for e in reader.read(first, last)}
    assert {p: values.get(p) for p in acknowledged} == acknowledged


def test_writes_travel_on_lanes_over_mutual_tls(cluster):
    leader = cluster.wait_for_leader()
    followers = [i for i in range(3) if i != leader]
    acknowledged: dict[int, bytes] = {}

    def opened() -> bool:
        acknowledged.update(append_some(cluster, 1))
        return all(lanes_opened(cluster, leader, i) >= 1 for i in followers)

    wait_until(opened, 30, "the leader's lanes to both followers, over TLS")
    before = {i: write_requests(cluster, i, "lane") for i in followers}
    acknowledged.update(append_some(cluster, 100))
    assert cluster.leader() == leader
    for i in followers:  # the slower follower may count its last write after the answer
        wait_until(
            lambda i=i: write_requests(cluster, i, "lane") - before[i] >= 100,
            30,
            f"follower {i} counting the 100 writes",
        )
    read_back(cluster, acknowledged)
    for i in followers:
        assert "transport: mutual TLS" in cluster.log_file(i).read_text()


def test_a_certificate_without_the_peer_role_is_refused_on_the_lane(cluster):
    leader = cluster.wait_for_leader()
    follower = next(i for i in range(3) if i != leader)
    sock, welcome, _ = lane_hello(cluster, follower, "admin")
    assert "WriteStream needs a role allowing peer calls" in welcome.error
    assert "'admin'" in welcome.error
    assert closed(sock)
    # A replica's own certificate (role peer) is welcomed.
    sock, welcome, _ = lane_hello(cluster, follower, "replica-0")
    assert welcome.error == ""
    sock.close()


def test_a_writer_appends_on_the_lane_over_mutual_tls_and_a_reader_may_not(cluster):
    """The client's append lane with TLS and roles: the writer's certificate may append,
    so its appends travel on the lane; the reader's may not, so the lane refuses it at the
    hello and the append, on gRPC, is refused as before."""
    leader = cluster.wait_for_leader()
    acknowledged: dict[int, bytes] = {}
    with cluster.client(leader, credentials=cluster.credentials("writer"), lane=True) as client:
        deadline = time.monotonic() + 20
        while not (lane := client._async._lanes.get(0)) or not lane.is_open:
            assert time.monotonic() < deadline, f"no lane: {lane and lane.last_error}"
            acknowledged.update(zip(client.append([b"opening"]), [b"opening"], strict=True))
            time.sleep(0.05)
        before = scrape(cluster, leader).get(("rlog_append_requests_total", (("rpc", "lane"),)))
        for k in range(50):
            value = f"tls-lane{k}".encode()
            acknowledged.update(zip(client.append([value]), [value], strict=True))
        after = scrape(cluster, leader).get(("rlog_append_requests_total", (("rpc", "lane"),)))
    assert before is not None and after is not None and after - before == 50
    read_back(cluster, acknowledged)
    # (without a session: opening one is refused before an append is sent at all)
    reader_credentials = cluster.credentials("reader")
    with cluster.client(
        leader, credentials=reader_credentials, lane=True, exactly_once=False
    ) as reader:
        # The lane is tried in the background: appends (refused on gRPC) until its hello
        # has been refused too, whatever the host's speed.
        deadline = time.monotonic() + 20
        while True:
            with pytest.raises(PermissionDenied):
                reader.append([b"not allowed"])
            lane = reader._async._lanes.get(0)
            if lane is not None and "Append needs" in (lane.last_error or ""):
                break
            assert time.monotonic() < deadline, lane and lane.last_error
            time.sleep(0.1)
        assert not lane.is_open
        assert "Append needs a role allowing append calls" in lane.last_error, lane.last_error


def test_a_wiped_follower_catches_up_on_fetch_lanes_over_mutual_tls(cluster):
    """A catch-up's spans travel on the peers' fetch lanes over mutual TLS (once open: the
    first spans go on Fetch calls); a certificate whose role may not call Fetch gets no
    fetch lane."""
    leader = cluster.wait_for_leader()
    victim = next(i for i in range(3) if i != leader)
    acknowledged: dict[int, bytes] = {}
    with client_as(cluster, "writer") as client:
        for call in range(40):  # ~42 MB: more spans than the first ones on Fetch calls
            values = [f"fl{call}-{k}:".encode().ljust(4096, b".") for k in range(256)]
            acknowledged.update(zip(client.append(values), values, strict=True))
    cluster.wipe(victim)
    cluster.start_replica(victim)
    wait_all_voting(cluster, timeout=120)
    fetched = scrape(cluster, victim)
    assert fetched.get(("rlog_catchup_fetches_total", (("via", "lane"),)), 0.0) > 0
    assert fetched.get(("rlog_catchup_fetches_total", (("via", "grpc"),)), 0.0) > 0
    sample = dict(list(acknowledged.items())[:: len(acknowledged) // 50])
    with client_as(cluster, "reader", victim, timeout=10.0) as reader:
        for position, value in sample.items():
            (entry,) = reader.read(position, position, stale=True)
            assert entry.value == value
    # The admin role may not call Fetch: its fetch lane is refused at the hello.
    host, port = lane_address(cluster.endpoints[victim], OFFSET)
    raw = socket.create_connection((host, port), timeout=10)
    sock = tls_context(cluster, "admin").wrap_socket(raw, server_hostname=host)
    hello = pb.LaneHello(
        version=KINDS_VERSION, log_id=cluster.log_id, replica_id=victim, kind=pb.LANE_FETCH
    )
    sock.sendall(frame(hello.SerializeToString()))
    (length,) = struct.unpack("<I", recv_exactly(sock, 4))
    welcome = pb.LaneWelcome.FromString(recv_exactly(sock, length))
    assert "Fetch needs a role allowing peer calls" in welcome.error, welcome.error
    assert closed(sock)


def test_no_certificate_or_no_tls_gets_no_welcome(cluster):
    leader = cluster.wait_for_leader()
    follower = next(i for i in range(3) if i != leader)
    host, port = lane_address(cluster.endpoints[follower], OFFSET)
    hello = frame(pb.LaneHello(version=VERSION, replica_id=follower).SerializeToString())
    # TLS without a client certificate: the server asks for one and ends the handshake.
    raw = socket.create_connection((host, port), timeout=10)
    try:
        sock = tls_context(cluster, None).wrap_socket(raw, server_hostname=host)
        sock.sendall(hello)
        assert closed(sock)
    except (ssl.SSLError, ConnectionResetError):
        pass  # refused during the handshake (TLS 1.2)
    # Plaintext on the TLS lane: no welcome, the connection ends.
    raw = socket.create_connection((host, port), timeout=10)
    raw.sendall(hello)
    assert closed(raw)
    # The log goes on.
    read_back(cluster, append_some(cluster, 10))


def test_a_renewed_certificate_is_served_on_the_lane(cluster):
    leader = cluster.wait_for_leader()
    follower = next(i for i in range(3) if i != leader)
    pki = certs.DevPki(cluster.tls_dir)
    _, _, before = lane_hello(cluster, follower, "replica-0")
    assert before == ssl.PEM_cert_to_DER_cert(pki.cert(pki.replica(follower)).read_text())
    host = cluster.host_of(follower)
    pki.issue_peer(pki.replica(follower), sorted({host, "localhost"}))
    renewed = ssl.PEM_cert_to_DER_cert(pki.cert(pki.replica(follower)).read_text())
    assert renewed != before
    deadline = time.monotonic() + 20
    while lane_hello(cluster, follower, "replica-0")[2] != renewed:
        assert time.monotonic() < deadline, "the lane kept serving the old certificate"
        time.sleep(0.2)
    # The leader's lane to it (made with the old certificate, or again with the new one)
    # still carries the writes.
    lane_before = write_requests(cluster, follower, "lane")
    acknowledged = append_some(cluster, 50)
    wait_until(
        lambda: write_requests(cluster, follower, "lane") - lane_before >= 50,
        30,
        "lane writes after the renewal",
    )
    read_back(cluster, acknowledged)
    assert "reloaded the TLS certificate" in cluster.log_file(follower).read_text()
