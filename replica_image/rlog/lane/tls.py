"""Mutual TLS on the write lane (docs/security.md, "The write lane"): the same certificate,
key and client CA as the replica's gRPC port, in the standard library's `ssl` contexts.

- The server's context verifies every caller's certificate against the client CA and the
  peer CA if there is one (mutual TLS, as the gRPC port does; the lane's admission tells
  peers by their CA, rlog.runtime.authz) and presents the replica's certificate; a
  certificate renewed on disk is taken at the next handshake (`ReloadingCertificates`, one
  `stat` of the files per handshake, as gRPC's certificate fetcher does), through the
  context's SNI callback, which hands the handshake a context built from the new files.
  Connections already open keep the certificate they were made with.
- A leader's context, built again for every connection it opens (a lane opens rarely),
  presents the replica's certificate and verifies the follower's against the peer CA (the
  client CA without one) and its host name, as the gRPC peer channel does.
- `caller_names` gives the authorization rules the same names gRPC's auth context does:
  the certificate's common name and its subject alternative names.
"""

from __future__ import annotations

import logging
import ssl
from typing import Any

from rlog.runtime.tls import ReloadingCertificates

log = logging.getLogger("rlog.lane")


def _base(purpose: int) -> ssl.SSLContext:
    context = ssl.SSLContext(purpose)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class LaneTls:
    """The write lane's TLS contexts, from the replica's (reloading) certificates."""

    def __init__(self, certificates: ReloadingCertificates) -> None:
        if certificates.client_ca is None:
            raise ValueError("the write lane needs mutual TLS (a client CA)")
        self._certificates = certificates
        self._built = certificates.reloads
        self._current = self._server_context()
        self.server = self._server_context()  # what the server listens with
        self.server.sni_callback = self._pick

    def _server_context(self) -> ssl.SSLContext:
        trusted = self._certificates.current.trusted
        assert trusted is not None
        context = _base(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self._certificates.cert), str(self._certificates.key))
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=trusted.decode("ascii"))
        return context

    def _pick(self, connection: ssl.SSLObject, name: str | None, given: ssl.SSLContext) -> None:
        """Before each handshake: the context of the certificate on disk now."""
        try:
            self._certificates.refresh()
            if self._built != self._certificates.reloads:
                self._current = self._server_context()
                self._built = self._certificates.reloads
            connection.context = self._current
        except Exception:  # never fail a handshake over a rotation caught half-way
            log.exception("write lane: keeping the current certificate")

    def client(self) -> ssl.SSLContext:
        """A leader's context for one new lane connection."""
        self._certificates.refresh()
        peers_ca = self._certificates.current.peers_ca
        assert peers_ca is not None
        context = _base(ssl.PROTOCOL_TLS_CLIENT)  # verifies the host name and the chain
        context.load_verify_locations(cadata=peers_ca.decode("ascii"))
        context.load_cert_chain(str(self._certificates.cert), str(self._certificates.key))
        return context


def caller_names(peercert: dict[str, Any] | None) -> tuple[str, ...]:
    """A verified peer certificate's common name and subject alternative names (DNS names
    and IP addresses), in that order, each once."""
    names: list[str] = []
    for rdn in (peercert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName" and value not in names:
                names.append(value)
    for kind, value in (peercert or {}).get("subjectAltName", ()):
        if kind in ("DNS", "IP Address") and value not in names:
            names.append(value)
    return tuple(names)
