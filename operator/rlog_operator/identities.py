"""Client identities the operator issues (`spec.auth.clients`, `kubectl rlog certificate`), as
pure builders (docs/security.md, "Client identities").

Each entry of `spec.auth.clients` ({name, role, days, secretName}) asks for a certificate of
the log's client CA for `name`, kept in a Secret (default `<log>-client-<name>`: tls.crt,
tls.key, and ca.crt, the peer CA that verifies the replicas). Whoever may edit the
ReplicatedLog may ask for one (as for `spec.auth.subjects`); nobody but the operator reads the
CA's key. The certificate carries the URI `urn:rlog:client-identity:<ns>/<log>/<name>`, and
the roles file gives its role to its SHA-256 fingerprint only (authz `certificates`): a
certificate the roles file no longer lists, revoked or replaced, has no role whatever its
name matches.

Renewal: a certificate is issued again `margin_of` before it expires (or when the client CA
changed); the one it replaces stays listed beside it (`PREVIOUS_KEY`) until the next renewal,
so clients that have not yet read the new files keep working. Revocation: an entry removed
from `spec.auth.clients` leaves the roles file at once, and its Secret is deleted
(`revoked_secrets`, from the roles file in force, which names each identity's Secret).
"""

from __future__ import annotations

import datetime
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlog.runtime.authz import CERTIFICATE_ROLES, IDENTITY_URI_PREFIX
from rlog_operator import specs
from rlog_operator.specs import Body

# The label marking a Secret as holding the identity (its value: the identity's name): the
# operator writes or deletes no Secret of that name without it.
IDENTITY_LABEL = "rlog.io/client-identity"
# The fingerprint of the certificate the current one replaced (still valid for a while).
PREVIOUS_KEY = "previous.sha256"
DEFAULT_DAYS = 90
MAX_DAYS = 365
RENEW_MARGIN = datetime.timedelta(days=30)
# A name is a DNS label (it is part of a Secret's name and a certificate's common name).
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True)
class Client:
    name: str
    role: str
    days: float
    secret: str


def default_secret_name(body: Body, name: str) -> str:
    return f"{specs.name_of(body)}-client-{name}"


def clients_of(
    body: Body, reserved: frozenset[str] = frozenset()
) -> tuple[list[Client], list[str]]:
    """The valid entries of `spec.auth.clients`, and one line per entry refused (a role of
    a peer or the operator, a bad name, a Secret of the log's own PKI in `reserved`, a name
    or Secret twice)."""
    out: list[Client] = []
    problems: list[str] = []
    auth = (body.get("spec") or {}).get("auth") or {}
    seen: set[str] = set()
    for i, entry in enumerate(auth.get("clients") or []):
        name, role = str(entry.get("name", "")), str(entry.get("role", ""))
        secret = str(entry.get("secretName") or default_secret_name(body, name))
        days = float(entry.get("days") or DEFAULT_DAYS)
        where = f"spec.auth.clients[{i}] ({name})"
        if not _NAME.match(name):
            problems.append(f"{where}: the name must be a DNS label (a-z, 0-9, -)")
        elif role not in CERTIFICATE_ROLES:
            problems.append(f"{where}: role {role!r} is not one of {sorted(CERTIFICATE_ROLES)}")
        elif not 1 <= days <= MAX_DAYS:
            problems.append(f"{where}: days must be from 1 to {MAX_DAYS}")
        elif secret in reserved:
            problems.append(f"{where}: Secret {secret} is one of the log's own")
        elif name in seen or f"secret:{secret}" in seen:
            problems.append(f"{where}: that name or Secret is given twice")
        else:
            seen |= {name, f"secret:{secret}"}
            out.append(Client(name, role, days, secret))
    return out, problems


def identity_uri(body: Body, name: str) -> str:
    return f"{IDENTITY_URI_PREFIX}{specs.namespace_of(body)}/{specs.name_of(body)}/{name}"


def fingerprint(cert_pem: bytes) -> str:
    """The SHA-256 of a certificate's DER, lowercase hex (what authz compares)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    der = x509.load_pem_x509_certificate(cert_pem).public_bytes(serialization.Encoding.DER)
    return hashlib.sha256(der).hexdigest()


def margin_of(cert_pem: bytes) -> datetime.timedelta:
    """How long before expiry to renew: RENEW_MARGIN, or a third of a shorter lifetime."""
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return RENEW_MARGIN  # unreadable: issued again anyway (pki.needs_renewal)
    return min(RENEW_MARGIN, (cert.not_valid_after_utc - cert.not_valid_before_utc) / 3)


def foreign(secret: Mapping[str, Any] | None, client: Client) -> bool:
    """Whether a Secret of that name exists and is not this identity's (never overwritten)."""
    if secret is None:
        return False
    labels = (secret.get("metadata") or {}).get("labels") or {}
    return labels.get(IDENTITY_LABEL) != client.name


def certificate_rule(client: Client, cert: bytes | None, previous: bytes | None) -> dict[str, Any]:
    """The roles file's `certificates` entry of an identity, from its Secret as it will be:
    its certificate, and the fingerprint of the one it replaced (if any)."""
    digests = [fingerprint(cert)] if cert else []
    if previous:
        digests.append(previous.decode().strip())
    return {"name": client.name, "role": client.role, "sha256": digests, "secret": client.secret}


def revoked_secrets(roles_in_force: Mapping[str, Any] | None, clients: list[Client]) -> list[str]:
    """The Secrets of identities the roles file in force lists and `clients` no longer has
    (or keeps elsewhere): to delete once the new roles file is written."""
    kept = {c.secret for c in clients}
    named = [str(e.get("secret", "")) for e in (roles_in_force or {}).get("certificates") or []]
    return [s for s in dict.fromkeys(named) if s and s not in kept]
