"""Certificates for rlog's TLS (docs/security.md): a CA, and certificates it issues to
replicas and clients. Used by `rlog dev --tls` (a throwaway CA in the cluster dir), the
tests, and the operator's PKI (rlog_operator.pki).

Keys are ECDSA P-256 (small and fast to make); every certificate may serve and connect
(serverAuth and clientAuth): a replica presents the same certificate to its clients and to
its peers. A log has two CAs: the peer CA issues the replicas' and the operator's (admin)
certificates, the client CA every client's (docs/security.md, "PKI").
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rlog.durable import write_durably

DEFAULT_CA_DAYS = 3650
DEFAULT_CERT_DAYS = 90


@dataclass(frozen=True)
class Pem:
    """A certificate and its private key, PEM-encoded."""

    cert: bytes
    key: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        """Write both; the key readable by its owner only. Each file is replaced whole
        (written aside, then renamed), so a reader never sees half a file."""
        _write_atomic(cert_path, self.cert, 0o644)
        _write_atomic(key_path, self.key, 0o600)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    write_durably(path, data, aside=path.with_name(f".{path.name}.tmp"), mode=mode)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def new_ca(common_name: str, days: int = DEFAULT_CA_DAYS) -> Pem:
    """A self-signed CA."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def _alt_names(names: Iterable[str]) -> list[x509.GeneralName]:
    alt: list[x509.GeneralName] = []
    for name in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            alt.append(x509.DNSName(name))
    return alt


def issue(
    ca: Pem,
    common_name: str,
    names: Sequence[str] = (),
    *,
    days: float = DEFAULT_CERT_DAYS,
    not_before: datetime.datetime | None = None,
    uris: Sequence[str] = (),
) -> Pem:
    """A certificate signed by `ca` for `common_name`, with `names` (DNS names or IP
    addresses) and `uris` as subject alternative names, valid from `not_before` (default: a
    few minutes ago, for clocks a little behind) for `days`."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an ECDSA key")
    key = _key()
    start = not_before or (_now() - datetime.timedelta(minutes=5))
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), False
        )
    )
    alt = _alt_names(names) + [x509.UniformResourceIdentifier(u) for u in uris]
    if alt:
        builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    return Pem(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def not_after(cert_pem: bytes) -> datetime.datetime:
    """When a certificate expires (UTC)."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


# ---- the throwaway PKI of `rlog dev --tls` ----------------------------------------------

# Identities of a dev log and their roles (rlog.runtime.authz): replicas are peers; the
# four client certificates have one role each; "guest" has none (it needs the token).
DEV_CLIENTS = {
    "admin": "admin",
    "owner": "owner",
    "writer": "append",
    "reader": "read",
    "guest": "none",
}
# The identities the peer CA issues (with the replicas): the operator's stand-in.
DEV_PEER_CA_CLIENTS = frozenset({"admin"})


@dataclass(frozen=True)
class DevPki:
    """The files of a dev log's PKI, under `dir`: two CAs (docs/security.md, "PKI"):

    - the peer CA (`peer-ca.pem`, `peer-ca-key.pem`) issues the replicas' certificates and
      the admin's: only its certificates may be peers or admins;
    - the client CA (`client-ca.pem`, `client-ca-key.pem`) issues every other client's;
    - `ca.pem` is what clients verify the replicas with (the peer CA's certificate).

    A dir made before there were two CAs has `ca.pem` and `ca-key.pem` only (one CA for
    everybody): it is kept, and its replicas trust peers by name (`split` is False)."""

    dir: Path

    @property
    def ca(self) -> Path:
        """What clients verify the replicas with (`--ca`, RLOG_CA)."""
        return self.dir / "ca.pem"

    @property
    def ca_key(self) -> Path:
        """The one CA's key, in a dir made before there were two CAs."""
        return self.dir / "ca-key.pem"

    @property
    def peer_ca(self) -> Path:
        return self.dir / "peer-ca.pem"

    @property
    def peer_ca_key(self) -> Path:
        return self.dir / "peer-ca-key.pem"

    @property
    def client_ca(self) -> Path:
        """The CA callers are verified with (`rlog replica --tls-client-ca`)."""
        return self.client_ca_cert if self.split else self.ca

    @property
    def client_ca_cert(self) -> Path:
        return self.dir / "client-ca.pem"

    @property
    def client_ca_key(self) -> Path:
        return self.dir / "client-ca-key.pem"

    @property
    def split(self) -> bool:
        """Whether the peer CA is apart from the client CA (a dir made by this version)."""
        return self.peer_ca.exists()

    def cert(self, name: str) -> Path:
        return self.dir / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.dir / f"{name}-key.pem"

    @property
    def auth_config(self) -> Path:
        return self.dir / "auth.json"

    @property
    def token(self) -> Path:
        """A bearer token with the append role."""
        return self.dir / "token"

    def replica(self, i: int) -> str:
        return f"replica-{i}"

    def load_ca(self) -> Pem:
        """The CA that onboards clients (the client CA; the one CA of an older dir)."""
        if self.split:
            return Pem(self.client_ca_cert.read_bytes(), self.client_ca_key.read_bytes())
        return Pem(self.ca.read_bytes(), self.ca_key.read_bytes())

    def load_peer_ca(self) -> Pem:
        """The CA of the replicas and the admin (the one CA of an older dir)."""
        if self.split:
            return Pem(self.peer_ca.read_bytes(), self.peer_ca_key.read_bytes())
        return Pem(self.ca.read_bytes(), self.ca_key.read_bytes())

    def issue(self, name: str, names: Sequence[str] = (), **kwargs: object) -> Pem:
        """Issue (and write) a client certificate `name` from this PKI's client CA."""
        pem = issue(self.load_ca(), name, names, **kwargs)  # type: ignore[arg-type]
        pem.write(self.cert(name), self.key(name))
        return pem

    def issue_peer(self, name: str, names: Sequence[str] = (), **kwargs: object) -> Pem:
        """Issue (and write) a certificate `name` from the peer CA (replicas, admin)."""
        pem = issue(self.load_peer_ca(), name, names, **kwargs)  # type: ignore[arg-type]
        pem.write(self.cert(name), self.key(name))
        return pem

    def issue_as(self, name: str, names: Sequence[str] = (), **kwargs: object) -> Pem:
        """Issue `name` from the CA its identity comes from (DEV_PEER_CA_CLIENTS: peer)."""
        if name in DEV_PEER_CA_CLIENTS:
            return self.issue_peer(name, names, **kwargs)
        return self.issue(name, names, **kwargs)


def make_dev_pki(dir: Path, hosts: Sequence[str]) -> DevPki:
    """Two CAs (`DevPki`), a certificate per replica (for its host) from the peer CA, the
    client certificates of DEV_CLIENTS (the admin's from the peer CA), a token, and the
    roles file naming them. Kept if already there; a PKI made before an identity was added
    to DEV_CLIENTS gets it (`_add_missing_clients`)."""
    pki = DevPki(dir)
    if pki.auth_config.exists():
        _add_missing_clients(pki)
        return pki
    dir.mkdir(parents=True, exist_ok=True)
    peer_ca = new_ca("rlog dev peer CA")
    peer_ca.write(pki.peer_ca, pki.peer_ca_key)
    _write_atomic(pki.ca, peer_ca.cert, 0o644)
    new_ca("rlog dev client CA").write(pki.client_ca_cert, pki.client_ca_key)
    for i, host in enumerate(hosts):
        pki.issue_peer(pki.replica(i), sorted({host, "localhost"}))
    for name in DEV_CLIENTS:
        pki.issue_as(name)
    token = secrets.token_urlsafe(24)
    _write_atomic(pki.token, token.encode() + b"\n", 0o600)
    roles = {
        "subjects": {"replica-*": "peer", **DEV_CLIENTS},
        "tokens": [{"name": "dev-token", "token": token, "role": "append"}],
        "default": "none",
    }
    _write_atomic(pki.auth_config, (json.dumps(roles, indent=2) + "\n").encode(), 0o600)
    return pki


def _add_missing_clients(pki: DevPki) -> None:
    """Issue the DEV_CLIENTS certificates an existing dev PKI lacks and name them in its
    roles file (the "owner" of a dir made before that role): the rest stays as it is."""
    missing = [name for name in DEV_CLIENTS if not pki.cert(name).exists()]
    if not missing:
        return
    for name in missing:
        pki.issue_as(name)
    roles = json.loads(pki.auth_config.read_text())
    subjects = roles.setdefault("subjects", {})
    for name in missing:
        subjects.setdefault(name, DEV_CLIENTS[name])
    _write_atomic(pki.auth_config, (json.dumps(roles, indent=2) + "\n").encode(), 0o600)
