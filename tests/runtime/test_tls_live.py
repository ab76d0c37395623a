"""Mutual TLS and roles on a real 3-replica log (`DevCluster(tls=True)`: `rlog replica`
processes with certificates made here, rlog.certs): who can connect, who can call
what, that a refused call changes nothing, and that a rotated certificate is taken without
a restart while a client keeps appending."""

from __future__ import annotations

import datetime
import os
import socket
import ssl
import threading
import time

import grpc
import pytest

pytest.importorskip("cryptography")

from cli_runs import rlog
from live import client_as

from rlog import certs
from rlog.client import Client, Credentials
from rlog.client.errors import PermissionDenied, RlogError, Unauthenticated, Unavailable
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.tools.dev import DevCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DevCluster(3, tmp_path_factory.mktemp("tls"), election_timeout=0.5, tls=True) as c:
        yield c


def test_status_says_mutual_tls_and_roles(cluster):
    cluster.wait_for(lambda found: all(s is not None for s in found), what="every Status")
    for status in cluster.statuses(timeout=5.0):
        assert status is not None
        assert status.transport == "mutual-tls"
        assert status.authorization == "roles"
        assert status.peer_trust == "ca"  # rlog dev --tls makes a peer CA
    for i in range(cluster.replicas):
        assert "transport: mutual TLS" in cluster.log_file(i).read_text()


def test_roles(cluster):
    with client_as(cluster, "writer") as writer, client_as(cluster, "reader") as reader:
        positions = writer.append([b"w1", b"w2"])
        assert [e.value for e in reader.read(positions[0], positions[-1])] == [b"w1", b"w2"]
        end = reader.status().end
        # (an exactly-once client opens its session first: that call is refused already)
        with pytest.raises(PermissionDenied, match="needs a role allowing append calls"):
            reader.append([b"not allowed"])
        with pytest.raises(PermissionDenied, match="Truncate"):
            reader.truncate(positions[0])
        with pytest.raises(PermissionDenied, match="StepDown"):
            writer.step_down()
        with pytest.raises(PermissionDenied, match="RevokePermit"):
            writer.revoke_permit("dev")
        # The refused calls changed nothing: no entry, no truncation, same leader.
        status = reader.status()
        assert status.end == end and status.begin == 0
        assert [e.value for e in reader.read(positions[0], positions[-1])] == [b"w1", b"w2"]
    with client_as(cluster, "admin") as admin:
        leader = cluster.wait_for_leader()
        admin.step_down(cluster.endpoints[leader])
        admin.append([b"admin may append"])


def test_append_role_cannot_truncate_or_fence(cluster):
    """Attack: a certificate with role append (a Spark job, a state client) calls Truncate
    to the log's end and TakeEpoch, for real, on every replica (the leader, and followers
    that would forward it): each is refused with PERMISSION_DENIED naming the destroy kind
    and the owner role, and the log is unchanged (begin, end, epoch); appends still work.
    A certificate with role owner may truncate."""
    with client_as(cluster, "owner") as owner, client_as(cluster, "writer") as writer:
        epoch = owner.take_epoch()
        first = writer.append([b"d1", b"d2", b"d3"], epoch=epoch)[0]
        before = cluster.statuses(timeout=5.0)
        assert all(s is not None for s in before)
        begin = max(s.begin for s in before if s is not None)
        end = max(s.end for s in before if s is not None)  # the leader's: the last written
        assert begin < first < end
        for endpoint in cluster.endpoints:
            channel = grpc.secure_channel(
                endpoint, cluster.credentials("writer").channel_credentials()
            )
            with channel:
                log = pbg.LogStub(channel)
                for name, method, request in (
                    ("Truncate", log.Truncate, pb.TruncateRequest(to=end)),
                    ("TakeEpoch", log.TakeEpoch, pb.TakeEpochRequest()),
                ):
                    with pytest.raises(grpc.RpcError) as caught:
                        method(request, timeout=5)
                    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED, endpoint
                    details = caught.value.details()
                    assert f"{name} needs a role allowing destroy calls" in details
                    assert "give this caller role owner" in details and "\n" not in details
        # Through the client: PermissionDenied in one line, never an unknown outcome.
        with pytest.raises(PermissionDenied, match=r"destroy calls.*role owner"):
            writer.truncate(end)
        with pytest.raises(PermissionDenied, match=r"destroy calls.*role owner"):
            writer.take_epoch()
        # Nothing moved: every replica's begin is where it was, no TRUNCATE or EPOCH entry
        # was written (the next append lands right after the old end, the last position
        # written), the owner's epoch still holds.
        assert all(s is not None and s.begin == begin for s in cluster.statuses(timeout=5.0))
        assert writer.append([b"after the attack"], epoch=epoch) == [end + 1]
        assert [e.value for e in writer.read(first, first + 2)] == [b"d1", b"d2", b"d3"]
        # The owner may: it truncates below the entries just written.
        owner.truncate(first)
        cluster.wait_for(
            lambda found: all(s is not None and s.begin == first for s in found),
            what="the owner's truncation on every replica",
        )
        assert owner.take_epoch() == epoch + 1


def test_unknown_subject_is_denied_and_token_grants(cluster):
    with client_as(cluster, "guest") as guest:
        with pytest.raises(PermissionDenied, match="'guest' has role none"):
            guest.status()
    with cluster.client(credentials=cluster.credentials("guest", token=True)) as with_token:
        assert with_token.append([b"by token"])
        with pytest.raises(PermissionDenied, match="StepDown"):
            with_token.step_down()
    wrong = Credentials.from_files(
        cluster.tls_dir / "ca.pem",
        cluster.tls_dir / "guest.pem",
        cluster.tls_dir / "guest-key.pem",
        token="not-the-token",
    )
    with cluster.client(credentials=wrong) as client:
        with pytest.raises(Unauthenticated, match="unknown bearer token"):
            client.status()


def test_a_client_certificate_cannot_call_the_peer_protocol(cluster):
    admin = cluster.credentials("admin")
    channel = grpc.secure_channel(cluster.endpoints[0], admin.channel_credentials())
    with channel:
        with pytest.raises(grpc.RpcError) as caught:
            pbg.ReplicaStub(channel).Promise(pb.PromiseRequest(proposal=10**9), timeout=5)
    assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "Promise needs a role allowing peer" in caught.value.details()
    # Nothing was promised: the replicas' promises stay below the proposal sent.
    assert all(s is not None and s.promised < 10**9 for s in cluster.statuses())


def refused(cluster: DevCluster, credentials: Credentials | None) -> RlogError:
    client = Client(cluster.endpoints[0], timeout=3.0, credentials=credentials)
    try:
        with pytest.raises(Unavailable) as caught:
            client.status()
    finally:
        client.close()
    return caught.value


def test_connections_refused(cluster, tmp_path):
    # Plaintext to a TLS replica.
    refused(cluster, None)
    # No client certificate.
    refused(cluster, Credentials(ca=(cluster.tls_dir / "ca.pem").read_bytes()))
    # A client certificate of another CA (and that CA for the server: the server refuses).
    other = certs.new_ca("another CA")
    stranger = certs.issue(other, "admin")
    refused(cluster, Credentials(ca=other.cert, cert=stranger.cert, key=stranger.key))
    # The right client certificate, but the wrong CA to verify the server with.
    admin = cluster.credentials("admin")
    error = refused(cluster, Credentials(ca=other.cert, cert=admin.cert, key=admin.key))
    assert "TLS handshake failed" in str(error)
    # An expired client certificate of the right CA.
    expired = certs.issue(
        certs.DevPki(cluster.tls_dir).load_ca(),
        "writer",
        days=1,
        not_before=datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=3),
    )
    server_ca = (cluster.tls_dir / "ca.pem").read_bytes()
    refused(cluster, Credentials(ca=server_ca, cert=expired.cert, key=expired.key))
    # The replicas are still up and serve the right credentials.
    with cluster.client() as client:
        assert client.append([b"still serving"])


def test_cli_with_flags_and_environment(cluster):
    tls = cluster.tls_dir
    flags = ["--ca", str(tls / "ca.pem"), "--cert", str(tls / "writer.pem")]
    flags += ["--key", str(tls / "writer-key.pem"), "-e", cluster.endpoint]
    result = rlog("append", *flags, "from-cli")
    assert result.returncode == 0, result.stderr
    position = int(result.stdout.split()[0])
    result = rlog("status", *flags, "--json")
    assert result.returncode == 0, result.stderr
    assert b'"transport": "mutual-tls"' in result.stdout
    env = {
        **os.environ,
        "RLOG_ENDPOINT": cluster.endpoint,
        "RLOG_CA": str(tls / "ca.pem"),
        "RLOG_CERT": str(tls / "reader.pem"),
        "RLOG_KEY": str(tls / "reader-key.pem"),
    }
    import subprocess

    from cli_runs import RLOG

    read = subprocess.run(
        [RLOG, "read", "--from", str(position), "--to", str(position)],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert read.returncode == 0, read.stderr
    assert read.stdout.decode().strip() == f"{position}\tfrom-cli"
    denied = subprocess.run([RLOG, "append", "nope"], env=env, capture_output=True, timeout=60)
    assert denied.returncode == 1
    lines = denied.stderr.decode().strip().splitlines()
    assert len(lines) == 1 and "permission denied" in lines[0], lines
    # A token travels only over TLS: with no CA/cert given, the token alone means TLS with
    # the system's roots, which do not know the dev CA.
    token_only = subprocess.run(
        [RLOG, "status", "-e", cluster.endpoint, "--token-file", str(tls / "token")],
        env={k: v for k, v in os.environ.items() if not k.startswith("RLOG_")},
        capture_output=True,
        timeout=60,
    )
    assert token_only.returncode == 1


def served_certificate(cluster: DevCluster, i: int) -> bytes:
    """The DER certificate replica i presents to a new connection."""
    context = ssl.create_default_context(cafile=str(cluster.tls_dir / "ca.pem"))
    context.load_cert_chain(cluster.tls_dir / "admin.pem", cluster.tls_dir / "admin-key.pem")
    context.set_alpn_protocols(["h2"])
    host, _, port = cluster.endpoints[i].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname=host) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der_of(path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(path.read_text())


def test_rotated_certificates_are_taken_while_appending(cluster):
    pki = certs.DevPki(cluster.tls_dir)
    before = [served_certificate(cluster, i) for i in range(cluster.replicas)]
    assert before == [der_of(pki.cert(pki.replica(i))) for i in range(cluster.replicas)]
    appended: list[int] = []
    errors: list[BaseException] = []
    stop = threading.Event()

    def append_until_stopped() -> None:
        with client_as(cluster, "writer") as client:
            n = 0
            while not stop.is_set():
                try:
                    appended.extend(client.append([f"r{n}".encode()]))
                except RlogError as exc:
                    errors.append(exc)
                n += 1

    writer = threading.Thread(target=append_until_stopped)
    writer.start()
    try:
        time.sleep(0.5)
        for i in range(cluster.replicas):
            host = cluster.host_of(i)
            pki.issue_peer(pki.replica(i), sorted({host, "localhost"}))
        rotated = [der_of(pki.cert(pki.replica(i))) for i in range(cluster.replicas)]
        deadline = time.monotonic() + 20
        while [served_certificate(cluster, i) for i in range(cluster.replicas)] != rotated:
            assert time.monotonic() < deadline, "the replicas kept the old certificate"
            time.sleep(0.2)
        # At the peers' certificate check (every 5 s) the replicas reconnect to each other
        # with the new certificate, and appends keep being chosen after that.
        deadline = time.monotonic() + 30
        while not all(
            "reconnecting to the peers" in cluster.log_file(i).read_text()
            for i in range(cluster.replicas)
        ):
            assert time.monotonic() < deadline, "the replicas did not reconnect to their peers"
            time.sleep(0.2)
        count = len(appended)
        deadline = time.monotonic() + 30
        while len(appended) <= count:
            assert time.monotonic() < deadline, "no append chosen after the reconnection"
            time.sleep(0.1)
    finally:
        stop.set()
        writer.join(timeout=60)
    assert not errors, errors[:3]
    assert len(appended) == len(set(appended))
    with client_as(cluster, "reader") as reader:
        values = {e.position: e.value for e in reader.read(appended[0], appended[-1])}
    assert all(p in values for p in appended)
    for i in range(cluster.replicas):
        log = cluster.log_file(i).read_text()
        assert "reloaded the TLS certificate" in log
        assert "reconnecting to the peers" in log
        assert all(pid is not None for pid in [cluster.pid(i)])  # never restarted


def test_the_worker_registry_example_over_mutual_tls(tmp_path):
    """examples/worker_registry.py with the client's security arguments (as it runs against
    a ReplicatedLog on Kubernetes, which is mutual TLS by default), as the writer identity.
    A log of its own: the state layer refuses a log holding other entries (the module's
    other tests append plain values)."""
    from pathlib import Path

    with DevCluster(3, tmp_path, election_timeout=0.5, tls=True) as cluster:
        _run_registry_example(
            cluster, Path(__file__).parents[2] / "examples" / "worker_registry.py"
        )


def _run_registry_example(cluster: DevCluster, example) -> None:
    import subprocess
    import sys

    tls = cluster.tls_dir
    flags = ["--ca", str(tls / "ca.pem"), "--cert", str(tls / "writer.pem")]
    flags += ["--key", str(tls / "writer-key.pem")]
    endpoints = ",".join(cluster.endpoints)
    ran = subprocess.run(
        [sys.executable, str(example), "--endpoints", endpoints, "--processes", "2", *flags],
        env={k: v for k, v in os.environ.items() if not k.startswith("RLOG_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "registry holds exactly the workers admitted and not removed" in ran.stdout
    # Without credentials the same example is refused: the log is not reachable in plaintext;
    # it says so in one line (no traceback) and changes nothing.
    plain = subprocess.run(
        [sys.executable, str(example), "--endpoints", endpoints, "--patience", "1"],
        env={k: v for k, v in os.environ.items() if not k.startswith("RLOG_")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert plain.returncode == 1
    lines = plain.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("worker_registry: "), plain.stderr
    assert "cannot reach" in lines[0], lines
