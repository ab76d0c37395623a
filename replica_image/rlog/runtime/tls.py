"""Transport security of a replica (docs/security.md): its server credentials, reloaded
from the files without a restart when they change, and the credentials it presents to its
peers.

gRPC calls the server's certificate fetcher before every new connection's handshake;
the fetcher looks at the files' modification times and sizes (one `stat` each) and hands
gRPC the new certificate only when they changed and the new key matches the new
certificate: a rotation caught half-written (the certificate replaced, not yet the key) is
not taken, and the next connection looks again. Connections already open keep the
certificate they were made with (TLS does not renegotiate); clients reconnect on their own.

Peers apart from clients (`--tls-peer-ca`): the server trusts the client CA and the peer CA
(a bundle of both as gRPC's root certificates), and `PeerAuthority.issued` tells which one
a caller's certificate comes from: the peer and admin roles go only to certificates the peer
CA issued (rlog.runtime.authz). The replica's own certificate must then be one of the peer
CA's: it is what it serves with and what it presents to its peers, and it verifies its peers'
certificates against the peer CA alone. Without a peer CA, one CA verifies everybody and a
peer is whoever has a certificate carrying a peer's name (the replica warns, and its Status
says `peer_trust: names`).
"""

from __future__ import annotations

import logging
import ssl
import threading
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from rlog.config import ConfigError, ReplicaConfig

log = logging.getLogger("rlog.tls")

# Stamp of the files: (path, mtime_ns, size) of each.
Stamp = tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class KeyPair:
    """A certificate chain, its private key, the CA that verifies clients and the one that
    verifies peers (PEM)."""

    cert: bytes
    key: bytes
    client_ca: bytes | None
    peer_ca: bytes | None = None

    @property
    def trusted(self) -> bytes | None:
        """Every CA a caller's certificate may chain to (gRPC's root certificates)."""
        if self.peer_ca is None:
            return self.client_ca
        return (self.client_ca or b"").rstrip(b"\n") + b"\n" + self.peer_ca

    @property
    def peers_ca(self) -> bytes | None:
        """The CA a peer's certificate must chain to."""
        return self.peer_ca if self.peer_ca is not None else self.client_ca


class PeerAuthority:
    """Which callers' certificates the peer CA issued. The transport verified the chain to
    one of the trusted CAs already; this checks the leaf's issuer name and signature
    against each certificate of the peer CA file (several during a rotation of the CA).
    Peer certificates are issued directly by the peer CA (no intermediate). Answers are
    kept for the certificates seen last (a check per call would cost a signature check)."""

    KEEP = 1024

    def __init__(self, pem: bytes) -> None:
        self.pem = pem
        self.cas = x509.load_pem_x509_certificates(pem)
        self._seen: dict[bytes, bool] = {}

    def issued(self, certificate: bytes) -> bool:
        """Whether `certificate` (PEM or DER; the leaf) was signed by the peer CA."""
        known = self._seen.get(certificate)
        if known is None:
            if len(self._seen) >= self.KEEP:
                self._seen.clear()
            known = self._seen[certificate] = self._verify(certificate)
        return known

    def _verify(self, certificate: bytes) -> bool:
        try:
            if certificate.lstrip().startswith(b"-----BEGIN"):
                leaf = x509.load_pem_x509_certificate(certificate)
            else:
                leaf = x509.load_der_x509_certificate(certificate)
        except ValueError:
            return False
        for ca in self.cas:
            try:
                leaf.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return True
        return False


def _stamp(paths: list[Path]) -> Stamp:
    stamps = []
    for path in paths:
        info = path.stat()
        stamps.append((str(path), info.st_mtime_ns, info.st_size))
    return tuple(stamps)


def check_pair(cert: Path, key: Path) -> None:
    """Raise ConfigError unless `key` is the private key of the certificate in `cert`."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_cert_chain(str(cert), str(key))
    except (ssl.SSLError, OSError) as exc:
        reason = getattr(exc, "reason", None) or str(exc)
        raise ConfigError(f"--tls-cert {cert} / --tls-key {key}: {reason}") from None


class ReloadingCertificates:
    """The replica's certificate, key, client CA and peer CA, read again when the files
    change."""

    def __init__(
        self, cert: Path, key: Path, client_ca: Path | None, peer_ca: Path | None = None
    ) -> None:
        self.cert = cert
        self.key = key
        self.client_ca = client_ca
        self.peer_ca = peer_ca
        self._paths = [p for p in (cert, key, client_ca, peer_ca) if p is not None]
        self._lock = threading.Lock()
        self.reloads = 0  # how many times a changed set of files was taken
        self.current, self._stamp = self._load()
        self._authority = self._authority_of(self.current)
        self._served = 0  # the reload count of the certificate the server was last given

    def _load(self) -> tuple[KeyPair, Stamp]:
        before = _stamp(self._paths)
        check_pair(self.cert, self.key)
        pair = KeyPair(
            self.cert.read_bytes(),
            self.key.read_bytes(),
            self.client_ca.read_bytes() if self.client_ca is not None else None,
            self.peer_ca.read_bytes() if self.peer_ca is not None else None,
        )
        if pair.client_ca is not None and b"-----BEGIN CERTIFICATE-----" not in pair.client_ca:
            raise ConfigError(f"--tls-client-ca {self.client_ca}: no PEM certificate in it")
        if pair.peer_ca is not None:
            _check_peer_ca(pair, self)
        if _stamp(self._paths) != before:
            raise ConfigError("the certificate files changed while they were read")
        return pair, before

    @staticmethod
    def _authority_of(pair: KeyPair) -> PeerAuthority | None:
        return PeerAuthority(pair.peer_ca) if pair.peer_ca is not None else None

    def peer_authority(self) -> PeerAuthority | None:
        """The peer CA in force (None: none is configured; peers are known by name)."""
        return self._authority

    @property
    def stamp(self) -> Stamp:
        return self._stamp

    def refresh(self) -> bool:
        """Take the files again if they changed and are consistent; whether they were."""
        with self._lock:
            try:
                if _stamp(self._paths) == self._stamp:
                    return False
                self.current, self._stamp = self._load()
                self._authority = self._authority_of(self.current)
            except (OSError, ConfigError) as exc:
                log.warning("certificate files changed but cannot be used yet: %s", exc)
                return False
            self.reloads += 1
            log.info("reloaded the TLS certificate from %s (reload %d)", self.cert, self.reloads)
            return True

    def _configuration(self) -> grpc.ServerCertificateConfiguration:
        pair = self.current
        return grpc.ssl_server_certificate_configuration(
            [(pair.key, pair.cert)], root_certificates=pair.trusted
        )

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        # Runs in a gRPC thread before each handshake; must not raise. (The files may have
        # been taken already by `peer_credentials`: what counts is what the server has.)
        try:
            self.refresh()
            with self._lock:
                if self._served == self.reloads:
                    return None
                self._served = self.reloads
            return self._configuration()
        except Exception:
            log.exception("certificate fetch failed; keeping the current certificate")
            return None

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            self._configuration(),
            self._fetch,  # type: ignore[arg-type]  # None means "no change" (gRPC's docs)
            require_client_authentication=self.client_ca is not None,
        )

    def peer_credentials(self, token: str | None = None) -> grpc.ChannelCredentials:
        """What this replica presents to its peers: its own certificate (peers verify it
        against their peer CA, else their client CA) and, if given, a bearer token; it
        verifies theirs against its peer CA (else its client CA)."""
        self.refresh()
        pair = self.current
        credentials = grpc.ssl_channel_credentials(
            root_certificates=pair.peers_ca, private_key=pair.key, certificate_chain=pair.cert
        )
        if token:
            return grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(token)
            )
        return credentials


def certificates_of(config: ReplicaConfig) -> ReloadingCertificates | None:
    """The replica's certificates, None for plaintext; ConfigError if they are unusable."""
    if config.tls_cert is None or config.tls_key is None:
        return None
    return ReloadingCertificates(
        config.tls_cert, config.tls_key, config.tls_client_ca, config.tls_peer_ca
    )


def _check_peer_ca(pair: KeyPair, files: ReloadingCertificates) -> None:
    """The peer CA must hold certificates, be a CA of its own (not the client CA: then any
    client could be a peer) and have issued the replica's own certificate (its peers
    verify it against their peer CA)."""
    assert pair.peer_ca is not None
    try:
        authority = PeerAuthority(pair.peer_ca)
    except ValueError:
        raise ConfigError(f"--tls-peer-ca {files.peer_ca}: no PEM certificate in it") from None
    client_cas = x509.load_pem_x509_certificates(pair.client_ca) if pair.client_ca else []
    if set(authority.cas) & set(client_cas):
        raise ConfigError(
            f"--tls-peer-ca {files.peer_ca} shares a CA with --tls-client-ca "
            f"{files.client_ca}: the peer CA must sign only replicas and the operator"
        )
    if not authority.issued(pair.cert):
        raise ConfigError(
            f"--tls-cert {files.cert} was not issued by --tls-peer-ca {files.peer_ca}: "
            "the replica's certificate must be a peer certificate (its peers verify it)"
        )


def read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    token = path.read_text().strip()
    if not token:
        raise ConfigError(f"{path}: the token file is empty")
    return token
