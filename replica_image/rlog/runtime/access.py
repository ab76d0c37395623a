"""Who the replica lets in, wired from its configuration: the peer CA's check in force
(following the certificates' rotation), the lane's admission by the gRPC port's roles, and
the security mode said at start (plaintext and open access are never silent)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rlog.config import ReplicaConfig
from rlog.lane.server import Admission
from rlog.lane.tls import caller_names
from rlog.runtime.authz import PeerCheck, PolicyFile, caller_of_tls, decide
from rlog.runtime.tls import ReloadingCertificates

log = logging.getLogger("rlog.server")


def peer_check_of(certificates: ReloadingCertificates | None) -> Callable[[], PeerCheck | None]:
    """The peer CA's check in force (it follows the files' rotation); None: no peer CA."""

    def current() -> PeerCheck | None:
        authority = certificates.peer_authority() if certificates is not None else None
        return authority.issued if authority is not None else None

    return current


def lane_admission(policy: PolicyFile, peer_check: Callable[[], PeerCheck | None]) -> Admission:
    """Why a caller on the lane is refused ("" if its certificate's role may make the call
    the lane stands in for: WriteStream for a leader, Append for a client): the roles of
    the gRPC port."""

    def refusal(transport: asyncio.Transport, method: str) -> str:
        peer = transport.get_extra_info("peername")
        tls = transport.get_extra_info("ssl_object")
        caller = caller_of_tls(
            caller_names(transport.get_extra_info("peercert")),
            tls.getpeercert(binary_form=True) if tls is not None else None,
            f"{peer[0]}:{peer[1]}" if peer else "",
            peer_check(),
        )
        decision = decide(policy.current(), method, caller)
        return "" if decision.allowed else decision.reason

    return refusal


def log_security(config: ReplicaConfig) -> None:
    """Say how the replica is secured: plaintext and open access are never silent."""
    if config.transport == "plaintext":
        log.warning(
            "transport: PLAINTEXT: nothing is encrypted and callers are not authenticated "
            "(give --tls-cert/--tls-key, and --tls-client-ca for mutual TLS)"
        )
    elif config.transport == "tls":
        log.info(
            "transport: TLS with certificate %s; callers present no certificate", config.tls_cert
        )
    else:
        log.info(
            "transport: mutual TLS with certificate %s; callers' certificates verified against %s",
            config.tls_cert,
            config.tls_client_ca,
        )
    if config.insecure:
        log.warning(
            "--insecure: serving PLAINTEXT on %s, which may be beyond loopback: anyone who "
            "reaches it may read, append and speak the peer protocol",
            config.listen,
        )
    if config.auth_config is not None:
        log.info("authorization: roles from %s", config.auth_config)
    elif config.transport == "plaintext" and not config.admin_from_anywhere:
        log.warning(
            "authorization: OFF for the Log API; the Admin API (permits, step-down) answers "
            "callers on loopback only (--admin-from-anywhere opens it)"
        )
    else:
        log.warning("authorization: OFF: every caller that connects may call every RPC")
    if config.peer_trust == "names":
        log.warning(
            "peers are trusted BY NAME: whoever presents %s the roles file makes peer or "
            "admin is one (give --tls-peer-ca, docs/security.md)",
            f"a certificate of {config.tls_client_ca} with a name"
            if config.tls_client_ca is not None
            else "a token",
        )
    elif config.peer_trust == "ca":
        log.info("peers and admins: only certificates of the peer CA %s", config.tls_peer_ca)
