"""What a replica without TLS allows (docs/security.md, "Plaintext"): in plaintext nothing
authenticates a caller, so what it may do is bounded by where it can come from.

- Listening: a plaintext replica binds a loopback address only (`listen_refusal`); beyond
  loopback it starts only with `--insecure`, and then says so (its log, Status `insecure`).
- The Admin API (GrantPermit, RevokePermit, StepDown) of a plaintext replica answers only
  callers on loopback (`admin_refusal`), unless `--admin-from-anywhere` (the operator's
  `tls.mode: disabled`, whose calls come from the operator's pod). The Log API stays open:
  a plaintext log's clients are trusted by construction of its network, and the Admin API
  is the part that can stall a log (a step-down storm) or start one on another's data (a
  permit), for which the log id printed by Status is no secret.

With TLS neither rule applies: the transport says who the caller is and the roles file
(runtime/authz.py) says what it may call. The alternative rejected: the loopback rule also
for TLS without a roles file; such a replica authenticates its callers (mutual TLS) or was
deliberately opened to anyone holding its CA, and its Status says "authorization off".
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse

from rlog.config import ReplicaConfig

ADMIN_METHODS = ("GrantPermit", "RevokePermit", "StepDown")


def is_loopback_ip(text: str) -> bool:
    """Whether `text` is a loopback IP address (127.0.0.0/8, ::1, ::ffff:127.x)."""
    try:
        address = ipaddress.ip_address(text.strip("[]").split("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def peer_is_loopback(peer: str) -> bool:
    """Whether a gRPC peer string (`ipv4:127.0.0.1:5000`, `ipv6:[::1]:5000`, `unix:...`)
    names a caller on this host's loopback (a Unix socket is local too)."""
    kind, _, rest = urllib.parse.unquote(peer).partition(":")  # ipv6:%5B::1%5D:5000
    if kind == "unix" or kind == "unix-abstract":
        return True
    if kind not in ("ipv4", "ipv6"):
        return False
    host = rest.rpartition(":")[0] if kind == "ipv4" or rest.startswith("[") else rest
    return is_loopback_ip(host)


def admin_refusal(config: ReplicaConfig, peer: str) -> str:
    """Why an Admin call from `peer` is refused ("": it is answered)."""
    if config.transport != "plaintext" or config.admin_from_anywhere:
        return ""
    if peer_is_loopback(peer):
        return ""
    return (
        f"the Admin API of a plaintext replica answers callers on loopback only, not {peer} "
        "(start the replica with --admin-from-anywhere, or give it TLS and a roles file)"
    )


def admin_callers(config: ReplicaConfig) -> str:
    """Who may call the Admin API, as Status says: loopback | anywhere | roles."""
    if config.auth_config is not None:
        return "roles"
    if config.transport == "plaintext" and not config.admin_from_anywhere:
        return "loopback"
    return "anywhere"


def listen_addresses(listen: str) -> list[str]:
    """The IP addresses `listen` (H:P) binds (a name resolved; [] if it does not resolve).
    Blocking (DNS): called once, before the server starts."""
    host = listen.rpartition(":")[0].strip("[]")
    if host in ("", "*"):
        return ["0.0.0.0"]
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return []
    return sorted({str(info[4][0]) for info in infos})


def listen_refusal(config: ReplicaConfig, addresses: list[str]) -> str:
    """Why the replica may not listen on `config.listen`, resolved to `addresses` ("": it
    may): plaintext beyond loopback needs --insecure. A name that does not resolve counts
    as beyond loopback (nothing proves it is not)."""
    if config.transport != "plaintext" or config.insecure:
        return ""
    if addresses and all(is_loopback_ip(a) for a in addresses):
        return ""
    where = ", ".join(addresses) or "an address that does not resolve"
    return (
        f"refusing to serve PLAINTEXT on {config.listen} ({where}), beyond loopback: anyone "
        "who reaches it may read and append, and the peer protocol trusts its callers. "
        "Give --tls-cert/--tls-key (docs/security.md), listen on 127.0.0.1, or accept the "
        "risk with --insecure"
    )
