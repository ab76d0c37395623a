"""Peers apart from clients, on a real 3-replica TLS log (`DevCluster(tls=True)`: the dev PKI
has a peer CA for the replicas and the admin and a client CA for every other client).

The attack: whoever may get a certificate from the client CA (that is how clients are
onboarded) asks for a replica's names. Before the peer CA, the roles file made that
certificate a peer, and a peer may do anything: its `Learned` carrying an APPEND at a future
position was stored as chosen, and once the log reached that position the replica served
the forged entry instead of the one the quorum chose. Now every peer and admin call from a
certificate the peer CA did not issue is refused, whatever names it carries, on the gRPC
port and on the write lane, and nothing is stored; the real replicas still elect, append
and catch up."""

from __future__ import annotations

import socket
import ssl
import struct

import grpc
import pytest

pytest.importorskip("cryptography")

from live import client_as, wait_until
from raw_sockets import closed, recv_exactly

from rlog import certs
from rlog.client import Credentials
from rlog.lane.framed import VERSION, frame, lane_address
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.tools.dev import DevCluster

OFFSET = 1
TARGET = 1  # the replica whose names the forged certificate carries, and that it calls
AHEAD = 20  # how far past the log's end the forged entry is placed
FORGED = b"forged by a client certificate"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DevCluster(
        3,
        tmp_path_factory.mktemp("peer-ca"),
        election_timeout=0.5,
        tls=True,
        write_lane_offset=OFFSET,
    ) as c:
        c.wait_for_leader()
        c.wait_for(lambda found: all(s is not None for s in found), what="every Status")
        yield c


def forged_pem(cluster: DevCluster) -> certs.Pem:
    """A certificate of the CA that issued writer.pem (the client CA), carrying replica
    TARGET's common name and host names, as a client may ask for."""
    pki = certs.DevPki(cluster.tls_dir)
    host = cluster.host_of(TARGET)
    return certs.issue(pki.load_ca(), pki.replica(TARGET), sorted({host, "localhost"}))


def forged_channel(cluster: DevCluster) -> grpc.Channel:
    pem = forged_pem(cluster)
    ca = (cluster.tls_dir / "ca.pem").read_bytes()  # verifies the replicas, as any client
    credentials = Credentials(ca=ca, cert=pem.cert, key=pem.key)
    return grpc.secure_channel(cluster.endpoints[TARGET], credentials.channel_credentials())


def stale_read(cluster: DevCluster, i: int, position: int) -> bytes:
    """The value replica i serves at `position` itself (a stale read, once it learned it)."""
    with client_as(cluster, "reader", timeout=30.0) as reader:
        entries = reader.read(
            position, position, stale=True, endpoint=cluster.endpoints[i], min_position=position
        )
        (entry,) = list(entries)
    return entry.value


def denied(call, request, what: str) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call(request, timeout=10)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, caught.value
    assert f"{what} needs a role allowing" in caught.value.details()
    assert "not issued by the peer CA" in caught.value.details()


def test_replicas_say_peers_are_known_by_their_ca(cluster):
    for status in cluster.statuses(timeout=5.0):
        assert status is not None and status.peer_trust == "ca"
    said = "peers and admins: only certificates of the peer CA"
    wait_until(  # logged once the replica serves
        lambda: all(said in cluster.log_file(i).read_text() for i in range(cluster.replicas)),
        30,
        "every replica saying how it knows its peers",
    )


def test_a_client_certificate_with_a_replicas_names_is_no_peer(cluster):
    with client_as(cluster, "writer", timeout=10.0) as writer:
        writer.append([b"before the attack"])
        status = writer.status()
    target = cluster.status(TARGET, timeout=5.0)
    position = status.end + AHEAD
    forged = pb.Action(
        position=position,
        promised=target.promised,
        performed=target.promised,
        learned=True,
        type=pb.APPEND,
        value=FORGED,
    )
    with forged_channel(cluster) as channel:
        replica = pbg.ReplicaStub(channel)
        denied(
            replica.Learned,
            pb.LearnedRequest(
                proposal=target.promised, actions=[forged], leader=0, log_id=cluster.log_id
            ),
            "Learned",
        )
        denied(
            replica.Promise,
            pb.PromiseRequest(proposal=10**12, candidate=0, log_id=cluster.log_id),
            "Promise",
        )
        denied(
            replica.Write,
            pb.WriteRequest(proposal=10**12, actions=[forged], leader=0, log_id=cluster.log_id),
            "Write",
        )
        denied(pbg.AdminStub(channel).StepDown, pb.StepDownRequest(), "StepDown")
    # Nothing was promised: the replicas' promises stay below the proposal sent.
    assert all(s is not None and s.promised < 10**12 for s in cluster.statuses(timeout=5.0))
    # The log reaches the forged position by real appends; TARGET holds what was chosen.
    chosen: dict[int, bytes] = {}
    with client_as(cluster, "writer", timeout=10.0) as writer:
        while not chosen or max(chosen) < position:
            value = f"chosen {len(chosen)}".encode()
            (at,) = writer.append([value])
            chosen[at] = value
    assert stale_read(cluster, TARGET, position) == chosen[position] != FORGED


def test_the_lane_refuses_a_client_certificate_with_a_replicas_names(cluster):
    pem = forged_pem(cluster)
    keys = cluster.tls_dir / "forged"
    keys.mkdir(exist_ok=True)
    pem.write(keys / "cert.pem", keys / "key.pem")
    context = ssl.create_default_context(cafile=str(cluster.tls_dir / "ca.pem"))
    context.load_cert_chain(keys / "cert.pem", keys / "key.pem")
    host, port = lane_address(cluster.endpoints[TARGET], OFFSET)
    sock = context.wrap_socket(
        socket.create_connection((host, port), timeout=10), server_hostname=host
    )
    hello = pb.LaneHello(version=VERSION, log_id=cluster.log_id, replica_id=TARGET)
    sock.sendall(frame(hello.SerializeToString()))
    (length,) = struct.unpack("<I", recv_exactly(sock, 4))
    welcome = pb.LaneWelcome.FromString(recv_exactly(sock, length))
    assert "WriteStream needs a role allowing peer calls" in welcome.error
    assert "not issued by the peer CA" in welcome.error
    assert closed(sock)


def test_real_peers_elect_append_and_catch_up(cluster):
    """The replicas' own certificates (peer CA) still make a log: a new leader after the
    old one stops, appends, and a wiped replica catching up from its peers."""
    leader = cluster.wait_for_leader()
    cluster.stop_replica(leader)
    new_leader = cluster.wait_for_leader(exclude=[leader])
    cluster.start_replica(leader)
    # Back before another is wiped: with one replica wiped and this one still starting (a
    # busy host), the new leader has no quorum and the append below fails.
    cluster.wait_for(
        lambda found: found[leader] is not None and found[leader].status == pb.VOTING,
        60,
        "the old leader VOTING again",
    )
    wiped = next(i for i in range(cluster.replicas) if i != new_leader)
    cluster.wipe(wiped)
    with client_as(cluster, "writer", timeout=10.0) as writer:
        positions = writer.append([b"after the wipe"] * 50)
    cluster.start_replica(wiped)
    last = positions[-1]
    cluster.wait_for(
        lambda found: all(
            s is not None and s.status == pb.VOTING and s.learned >= last for s in found
        ),
        timeout=60,
        what=f"replica {wiped} (wiped) catching up from its peers",
    )
    assert stale_read(cluster, wiped, positions[-1]) == b"after the wipe"


def test_without_a_peer_ca_peers_are_known_by_name_and_the_replica_says_so(tmp_path):
    """The compatible default: a dev PKI made before the peer CA (one CA for everybody)
    starts its replicas without --tls-peer-ca; they work as before, warn, and report
    `peer_trust: names`."""
    import json

    one = certs.DevPki(tmp_path / "tls")
    one.dir.mkdir()
    certs.new_ca("rlog dev CA").write(one.ca, one.ca_key)
    one.issue(one.replica(0), ["127.0.0.1", "localhost"])
    one.issue("admin")
    roles = {"subjects": {"replica-*": "peer", "admin": "admin"}, "default": "none"}
    one.auth_config.write_text(json.dumps(roles))
    with DevCluster(1, tmp_path, election_timeout=0.5, tls=True) as cluster:
        assert not certs.DevPki(cluster.tls_dir).split
        cluster.wait_for_leader()
        status = cluster.status(0, timeout=5.0)
        assert status.peer_trust == "names" and status.transport == "mutual-tls"
        wait_until(
            lambda: "peers are trusted BY NAME" in cluster.log_file(0).read_text(),
            30,
            "the replica warning that peers are trusted by name",
        )
        assert "--tls-peer-ca" not in cluster.command(0)
