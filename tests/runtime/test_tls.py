"""TLS pieces without a running log: the replica's flags, the reloading of its certificate
files (a half-written rotation is not taken), client credentials, certificate making."""

from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

pytest.importorskip("cryptography")

from rlog import certs
from rlog.client.errors import PermissionDenied, Unauthenticated, error_for, short_details
from rlog.client.security import Credentials, CredentialsError
from rlog.config import ConfigError, ReplicaConfig
from rlog.runtime.tls import ReloadingCertificates


@pytest.fixture
def pki(tmp_path: Path) -> certs.DevPki:
    return certs.make_dev_pki(tmp_path / "tls", ["127.0.0.1"])


def config(tmp_path: Path, **kwargs) -> ReplicaConfig:
    return ReplicaConfig(id=0, peers=["127.0.0.1:7000"], data_dir=tmp_path, **kwargs)


def test_transport_of_the_flags(tmp_path, pki):
    assert config(tmp_path).transport == "plaintext"
    cert, key = pki.cert("replica-0"), pki.key("replica-0")
    assert config(tmp_path, tls_cert=cert, tls_key=key).transport == "tls"
    both = config(tmp_path, tls_cert=cert, tls_key=key, tls_client_ca=pki.ca)
    assert both.transport == "mutual-tls"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"tls_cert": "cert"}, "--tls-cert and --tls-key go together"),
        ({"tls_client_ca": "ca"}, "--tls-client-ca needs --tls-cert"),
        ({"auth_peer_token_file": "token"}, "needs TLS"),
        ({"tls_cert": "missing", "tls_key": "key"}, "--tls-cert .*missing: no such file"),
    ],
)
def test_bad_flags(tmp_path, pki, flags, message):
    names = {
        "cert": pki.cert("replica-0"),
        "key": pki.key("replica-0"),
        "ca": pki.ca,
        "token": pki.token,
        "missing": tmp_path / "missing",
    }
    with pytest.raises(ConfigError, match=message):
        config(tmp_path, **{flag: names[value] for flag, value in flags.items()})


def test_a_key_that_is_not_the_certificates_is_refused(pki):
    with pytest.raises(ConfigError, match="--tls-cert"):
        ReloadingCertificates(pki.cert("writer"), pki.key("reader"), pki.ca)


def test_reload_takes_consistent_files_only(pki):
    cert, key = pki.cert("replica-0"), pki.key("replica-0")
    loaded = ReloadingCertificates(cert, key, pki.ca)
    assert loaded._fetch() is None  # nothing changed since the start
    assert not loaded.refresh()
    first = loaded.current.cert
    # Half a rotation: a new certificate whose key is not written yet.
    rotated = certs.issue(pki.load_ca(), "replica-0", ["127.0.0.1"])
    cert.write_bytes(rotated.cert)
    assert not loaded.refresh()
    assert loaded.current.cert == first
    assert loaded._fetch() is None
    # The key arrives: the pair is taken, and handed to the server once.
    key.write_bytes(rotated.key)
    os.utime(key, ns=(1, 1))  # a distinct stamp even within the clock's resolution
    assert isinstance(loaded._fetch(), grpc.ServerCertificateConfiguration)
    assert loaded.current.cert == rotated.cert and loaded.reloads == 1
    assert loaded._fetch() is None
    # Taken by the peers' side first: the server still gets it at its next fetch.
    again = certs.issue(pki.load_ca(), "replica-0", ["127.0.0.1"])
    again.write(cert, key)
    loaded.peer_credentials()
    assert loaded.current.cert == again.cert
    assert isinstance(loaded._fetch(), grpc.ServerCertificateConfiguration)


def test_credentials(tmp_path, pki):
    with pytest.raises(CredentialsError, match="needs its key"):
        Credentials.from_files(pki.ca, pki.cert("admin"))
    with pytest.raises(CredentialsError, match="CA file"):
        Credentials.from_files(tmp_path / "nope.pem")
    with pytest.raises(CredentialsError, match="not both"):
        Credentials.from_files(token="a", token_file=pki.token)
    assert Credentials.from_env({}) is None
    env = {"RLOG_CA": str(pki.ca), "RLOG_TOKEN_FILE": str(pki.token)}
    found = Credentials.from_env(env)
    assert found is not None and found.ca == pki.ca.read_bytes()
    assert found.token == pki.token.read_text().strip()
    assert Credentials(server_name="rlog-0").channel_options() == [
        ("grpc.ssl_target_name_override", "rlog-0")
    ]


def test_errors_of_authorization_and_handshakes():
    denied = error_for(grpc.StatusCode.PERMISSION_DENIED, "Append needs ...", "h:1", True)
    assert isinstance(denied, PermissionDenied) and "permission denied" in str(denied)
    assert isinstance(error_for(grpc.StatusCode.UNAUTHENTICATED, "x"), Unauthenticated)
    text = (
        "failed to connect to all addresses; last error: UNAVAILABLE: ipv4:127.0.0.1:1: "
        "Ssl handshake failed (TSI_PROTOCOL_FAILURE): CERTIFICATE_VERIFY_FAILED"
    )
    assert short_details(text).startswith("TLS handshake failed")


def test_certificates(pki):
    ca = pki.load_ca()
    pem = certs.issue(ca, "x", ["rlog-0.rlog.ns.svc", "10.1.2.3"], days=2)
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(pem.cert)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["rlog-0.rlog.ns.svc"]
    assert [str(a) for a in names.get_values_for_type(x509.IPAddress)] == ["10.1.2.3"]
    lifetime = certs.not_after(pem.cert) - cert.not_valid_before_utc
    assert lifetime.days == 2
    assert oct(pki.key("admin").stat().st_mode & 0o777) == "0o600"


def test_spark_options_carry_the_credentials(pki):
    from rlog.client.errors import InvalidArgument
    from rlog.spark.options import WriteOptions, credentials

    assert credentials({"endpoints": "h:1"}) is None
    given = credentials(
        {
            "ca": str(pki.ca),  # a path every executor can read
            "cert": pki.cert("writer").read_text(),  # or the PEM itself
            "key": str(pki.key("writer")),
            "tokenFile": str(pki.token),
            "serverName": "rlog-0",
        }
    )
    assert given == Credentials(
        pki.ca.read_bytes(),
        pki.cert("writer").read_bytes(),
        pki.key("writer").read_bytes(),
        pki.token.read_text().strip(),
        "rlog-0",
    )
    with pytest.raises(InvalidArgument, match="not both"):
        credentials({"token": "a", "tokenFile": str(pki.token)})
    with pytest.raises(InvalidArgument, match="option 'ca'"):
        credentials({"ca": "/nonexistent/ca.pem"})
    parsed = WriteOptions.parse({"endpoints": "h:1", "token": "t", "ca": str(pki.ca)})
    assert parsed.credentials is not None and parsed.credentials.token == "t"


def test_a_dev_pki_made_before_the_owner_role_gets_an_owner(tmp_path):
    """`rlog dev --tls` keeps an existing PKI; one made before DEV_CLIENTS had "owner" gets
    its certificate and roles rule added, and everything else (CA, token, rules) stays."""
    import json

    from rlog.runtime.authz import load_policy

    pki = certs.make_dev_pki(tmp_path / "tls", ["127.0.0.1"])
    pki.cert("owner").unlink()
    pki.key("owner").unlink()
    roles = json.loads(pki.auth_config.read_text())
    del roles["subjects"]["owner"]
    pki.auth_config.write_text(json.dumps(roles))
    ca, writer, token = pki.ca.read_bytes(), pki.cert("writer").read_bytes(), pki.token
    token_text = token.read_text()

    again = certs.make_dev_pki(tmp_path / "tls", ["127.0.0.1"])
    assert again.cert("owner").exists() and again.key("owner").exists()
    assert again.ca.read_bytes() == ca and again.cert("writer").read_bytes() == writer
    assert again.token.read_text() == token_text
    policy = load_policy(again.auth_config)
    assert policy.role_of_subject(["owner"]) == ("owner", "owner")
    assert policy.role_of_subject(["writer"]) == ("append", "writer")
    assert [t.role for t in policy.tokens] == ["append"]


def test_the_peer_ca_is_a_ca_of_its_own_and_issued_the_replicas_certificate(tmp_path, pki):
    """--tls-peer-ca: the dev PKI's replicas are the peer CA's; the client CA given as the
    peer CA, or a replica certificate of the client CA, stop the start with one line."""
    cert, key = pki.cert("replica-0"), pki.key("replica-0")
    loaded = ReloadingCertificates(cert, key, pki.client_ca, pki.peer_ca)
    authority = loaded.peer_authority()
    assert authority is not None
    assert authority.issued(pki.cert("replica-0").read_bytes())
    assert authority.issued(pki.cert("admin").read_bytes())  # the operator's stand-in
    assert not authority.issued(pki.cert("writer").read_bytes())
    forged = certs.issue(pki.load_ca(), "replica-0", ["127.0.0.1"])  # the client CA's
    assert not authority.issued(forged.cert)
    assert not authority.issued(b"not a certificate")
    # The server trusts both CAs; a peer is verified against the peer CA only.
    assert (
        loaded.current.trusted is not None and loaded.current.peers_ca == pki.peer_ca.read_bytes()
    )
    with pytest.raises(ConfigError, match="shares a CA with --tls-client-ca"):
        ReloadingCertificates(cert, key, pki.client_ca, pki.client_ca)
    with pytest.raises(ConfigError, match="was not issued by --tls-peer-ca"):
        ReloadingCertificates(pki.cert("writer"), pki.key("writer"), pki.client_ca, pki.peer_ca)
    with pytest.raises(ConfigError, match="--tls-peer-ca needs --tls-client-ca"):
        config(tmp_path, tls_cert=cert, tls_key=key, tls_peer_ca=pki.peer_ca)
    both = config(
        tmp_path, tls_cert=cert, tls_key=key, tls_client_ca=pki.client_ca, tls_peer_ca=pki.peer_ca
    )
    assert both.peer_trust == "" and both.transport == "mutual-tls"  # no roles file: off
