"""Client identities the operator issues (spec.auth.clients), on a real TLS replica: their
certificates carry `urn:rlog:client-identity:...` and the roles file gives their role to
their fingerprints only (authz `certificates`). Revoking one (its entry leaves the roles
file) refuses its certificate as soon as the replica has taken the new file, while another
identity keeps working; a certificate with the same name but another fingerprint is
refused, although a name rule in the same file names it."""

from __future__ import annotations

import json

import grpc
import pytest

pytest.importorskip("cryptography")

from live import wait_until

from rlog import certs
from rlog.client import Credentials
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.runtime.authz import IDENTITY_URI_PREFIX, certificate_identity
from rlog.tools.dev import DevCluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with DevCluster(1, tmp_path_factory.mktemp("identities"), tls=True) as c:
        c.wait_for_leader()
        yield c


def identity(pki: certs.DevPki, name: str) -> certs.Pem:
    """As the operator issues it: from the client CA, marked as an issued identity."""
    return certs.issue(pki.load_ca(), name, days=1, uris=[f"{IDENTITY_URI_PREFIX}test/{name}"])


def status(cluster: DevCluster, pem: certs.Pem) -> grpc.StatusCode:
    credentials = Credentials(
        ca=(cluster.tls_dir / "ca.pem").read_bytes(), cert=pem.cert, key=pem.key
    )
    with grpc.secure_channel(cluster.endpoints[0], credentials.channel_credentials()) as channel:
        try:
            pbg.LogStub(channel).Status(pb.StatusRequest(), timeout=10)
        except grpc.RpcError as e:
            return e.code()
    return grpc.StatusCode.OK


def write_roles(cluster: DevCluster, base: dict, entries: list) -> None:
    """Replace the roles file (atomically) and wait until the replica says it took it (it
    looks at the file when a call comes, at most once a second: the dev `reader` calls)."""
    pki = certs.DevPki(cluster.tls_dir)
    taken = cluster.log_file(0).read_text().count("reloaded the roles")
    text = json.dumps({**base, "certificates": entries}, indent=2)
    staged = pki.auth_config.with_suffix(".new")
    staged.write_text(text)
    staged.replace(pki.auth_config)
    reader = cluster.credentials("reader")

    def taken_now() -> bool:
        with cluster.client(credentials=reader, timeout=10.0) as client:
            client.status()
        return cluster.log_file(0).read_text().count("reloaded the roles") > taken

    wait_until(
        taken_now,
        30,
        "the replica taking the new roles file",
    )


def test_revoked_and_replaced_identities_are_refused_at_once(cluster):
    pki = certs.DevPki(cluster.tls_dir)
    base = json.loads(pki.auth_config.read_text())
    # a name rule that would give the revoked identity a role if names still counted
    base["subjects"] = {**base["subjects"], "alpha": "read"}
    alpha, beta = identity(pki, "alpha"), identity(pki, "beta")
    other_alpha = identity(pki, "alpha")  # the same name, another key and fingerprint

    def entry(name: str, pem: certs.Pem) -> dict:
        return {"name": name, "role": "read", "sha256": [certificate_identity(pem.cert)[0]]}

    write_roles(cluster, base, [entry("alpha", alpha), entry("beta", beta)])
    assert status(cluster, alpha) == grpc.StatusCode.OK
    assert status(cluster, beta) == grpc.StatusCode.OK
    assert status(cluster, other_alpha) == grpc.StatusCode.PERMISSION_DENIED
    write_roles(cluster, base, [entry("beta", beta)])  # alpha revoked
    assert status(cluster, alpha) == grpc.StatusCode.PERMISSION_DENIED
    assert status(cluster, beta) == grpc.StatusCode.OK
