"""The operator's PKI for a ReplicatedLog (docs/security.md), as pure builders.

Mode `spec.tls.mode`:
- `operator` (the default): the operator runs two CAs per log. The peer CA
  (`<log>-tls-peer-ca`) issues the replicas' certificate (`<log>-tls`: one certificate for
  every replica, with every pod's DNS name, the client Service's names and the loopback
  names the probes use) and its own identity (`<log>-tls-operator`, common name
  `rlog-operator`, role admin): only its certificates may be peers or admins (`rlog replica
  --tls-peer-ca`), whatever names a client's certificate carries. The client CA
  (`<log>-tls-ca`; a log made before the peer CA keeps its one CA as the client CA, so its
  clients' certificates stay valid) issues the archiver's and every other client's. Neither
  CA key leaves its Secret; the operator renews a certificate `RENEW_MARGIN` before it
  expires (`needs_renewal`), or when its CA changed, and the replicas take the new files
  without a restart.
- `certManager`: cert-manager Certificates with `spec.tls.issuerRef` write `<log>-tls`,
  the operator's identity and the archiver's (`certificate_requests`). One issuer signs
  everybody: peers are known by name (the replicas warn; docs/security.md says how to keep
  peers apart with a separate Issuer).
- `disabled`: plaintext (the status and the replicas' logs say so).

Roles (`spec.auth`): `subjects` map certificate names to roles (read, append, owner,
admin: rlog.runtime.authz.ROLE_GRANTS), `tokens` name Secrets whose keys hold bearer
tokens, `clients` ask the operator for client identities (mode operator: identities.py,
issued from the client CA and listed in the roles file by fingerprint); the replicas' own
certificate is role peer and the operator's is admin, always (both may truncate:
rlog_operator never does, the replicas forward their clients' truncations). The roles file
lands in the Secret `<log>-auth`.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from rlog_operator import archive_specs, identities, specs
from rlog_operator.specs import (
    CA_KEY,
    CERT_KEY,
    CLIENT_CA_KEY,
    KEY_KEY,
    MODE_DISABLED,
    MODE_OPERATOR,
    PEER_CA_KEY,
    ROLES_KEY,
    Body,
    Manifest,
    OperatorConfig,
    auth_secret_name,
    mode_of,
    server_secret_name,
)

# Renew this long before expiry: several reconcile periods, and more than the replicas'
# 5 s look at their files.
RENEW_MARGIN = datetime.timedelta(days=30)
CERT_DAYS = 365
OPERATOR_COMMON_NAME = "rlog-operator"
CA_PRIVATE_KEY = "ca.key"


def ca_secret_name(body: Body) -> str:
    """The client CA (it was the log's one CA before the peer CA)."""
    return f"{specs.name_of(body)}-tls-ca"


def peer_ca_secret_name(body: Body) -> str:
    """The peer CA: the replicas' and the operator's certificates, nobody else's."""
    return f"{specs.name_of(body)}-tls-peer-ca"


def operator_secret_name(body: Body) -> str:
    return f"{specs.name_of(body)}-tls-operator"


def archiver_common_name(body: Body) -> str:
    return f"{specs.name_of(body)}-archiver"


def replica_common_name(body: Body) -> str:
    return f"{specs.name_of(body)}-replica"


def server_names(body: Body, config: OperatorConfig) -> list[str]:
    """The names the replicas' certificate carries: every pod's peer name (as the replicas
    dial it, and its shorter forms, which clients in the cluster may use as they may for any
    Service: `<pod>.<headless>.<ns>.svc`, `<pod>.<headless>.<ns>`, `<pod>.<headless>` from
    the log's own namespace), the client Service's names, and loopback (the probes and
    `kubectl exec ... rlog status`)."""
    ns = specs.namespace_of(body)
    service = specs.client_service_name(body)
    headless = specs.headless_service_name(body)
    replicas = range(specs.replicas_of(body))
    names = [specs.peer_host(body, i, config) for i in replicas]
    names += [specs.peer_host(body, i, replace(config, cluster_domain="")) for i in replicas]
    for i in replicas:
        pod = specs.pod_name(body, i)
        names += [f"{pod}.{headless}.{ns}", f"{pod}.{headless}"]
    names += [service, f"{service}.{ns}", f"{service}.{ns}.svc"]
    if config.cluster_domain:
        names.append(f"{service}.{ns}.svc.{config.cluster_domain}")
    names += ["localhost", "127.0.0.1"]
    return list(dict.fromkeys(names))


def needs_renewal(
    cert_pem: bytes | None,
    now: datetime.datetime,
    margin: datetime.timedelta = RENEW_MARGIN,
    names: Sequence[str] = (),
) -> bool:
    """Whether to issue a certificate anew: none, unreadable, not yet valid, expiring
    within `margin` of `now`, or lacking one of `names` (a replica added)."""
    if not cert_pem:
        return True
    from cryptography import x509

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return True
    if now < cert.not_valid_before_utc or cert.not_valid_after_utc - now < margin:
        return True
    if names:
        try:
            alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return True
        have = {str(v) for v in alt.get_values_for_type(x509.DNSName)}
        have |= {str(v) for v in alt.get_values_for_type(x509.IPAddress)}
        if not set(names) <= have:
            return True
    return False


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _secret(body: Body, name: str, data: Mapping[str, bytes], kind: str = "Opaque") -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": specs.namespace_of(body),
            "labels": specs.labels(body),
        },
        "type": kind,
        "data": {key: _b64(value) for key, value in data.items()},
    }


def issued_by(cert_pem: bytes | None, ca_pem: bytes) -> bool:
    """Whether the certificate was signed by the CA (issuer name and signature)."""
    if not cert_pem:
        return False
    from cryptography import x509
    from cryptography.exceptions import InvalidSignature

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def secret_bytes(secret: Mapping[str, Any] | None, key: str) -> bytes | None:
    """A key of a Secret as the API returns it (base64 data), None if absent."""
    if not secret:
        return None
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value) if value else None


def _issuer_ref(body: Body, key: str = "issuerRef") -> dict[str, str]:
    issuer = (body.get("spec", {}).get("tls") or {}).get(key) or {}
    if not issuer.get("name"):
        raise ValueError(f"spec.tls.mode certManager needs spec.tls.{key}.name")
    return {
        "name": str(issuer["name"]),
        "kind": str(issuer.get("kind", "Issuer")),
        "group": str(issuer.get("group", "cert-manager.io")),
    }


def _peer_issuer_ref(body: Body) -> dict[str, str]:
    """The issuer of the log's own identities: `spec.tls.peerIssuerRef`, which must not be
    the clients' issuer (then any client could be a peer); `spec.tls.issuerRef` without it
    (one issuer: peers known by name)."""
    if not specs.peer_issuer_given(body):
        return _issuer_ref(body)
    peer = _issuer_ref(body, "peerIssuerRef")
    if peer == _issuer_ref(body):
        raise ValueError(
            "spec.tls.peerIssuerRef names the same issuer as spec.tls.issuerRef: the peers' "
            "issuer must sign only the log's replicas and operator (docs/security.md, PKI)"
        )
    return peer


def _certificate(
    body: Body, secret_name: str, common_name: str, spec: Body, issuer: dict[str, str]
) -> Manifest:
    """A cert-manager Certificate (cert-manager.io/v1) writing `secret_name` with the keys
    the pods read (ca.crt, tls.crt, tls.key), a new ECDSA P-256 key at every issue."""
    return {
        "apiVersion": "cert-manager.io/v1",
        "kind": "Certificate",
        "metadata": {
            "name": secret_name,
            "namespace": specs.namespace_of(body),
            "labels": specs.labels(body),
        },
        "spec": {
            "secretName": secret_name,
            "commonName": common_name,
            **spec,
            "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            "issuerRef": issuer,
        },
    }


def certificate_request(body: Body, config: OperatorConfig) -> Manifest:
    """The cert-manager Certificate of mode certManager for the replicas: `<log>-tls`
    from the peers' issuer (`_peer_issuer_ref`), with every name `server_names` gives."""
    names = server_names(body, config)
    return _certificate(
        body,
        server_secret_name(body),
        replica_common_name(body),
        {
            "dnsNames": [n for n in names if not n[0].isdigit()],
            "ipAddresses": [n for n in names if n[0].isdigit()],
            "usages": ["server auth", "client auth"],
        },
        _peer_issuer_ref(body),
    )


def certificate_requests(body: Body, config: OperatorConfig) -> list[Manifest]:
    """Every Certificate of mode certManager: the replicas' (`certificate_request`), the
    operator's client identity (`<log>-tls-operator`, `CN=rlog-operator`, role admin) and,
    with `spec.backup`, the archiver's (`<log>-tls-archiver`, role read): the same
    identities mode operator issues itself, all from the peers' issuer
    (`spec.tls.peerIssuerRef`, else `spec.tls.issuerRef`). With a peers' issuer, one more
    from the clients' issuer (`spec.tls.issuerRef`): `<log>-tls-client-ca`, whose ca.crt
    tells the replicas the client CA (its certificate, `CN=<log>-client-ca`, has no role)."""
    client = {"usages": ["client auth"]}
    peers = _peer_issuer_ref(body)
    out = [
        certificate_request(body, config),
        _certificate(body, operator_secret_name(body), OPERATOR_COMMON_NAME, client, peers),
    ]
    if body.get("spec", {}).get("backup"):
        # Its control port serves the operator over HTTPS (archive_http.py verifies it with
        # the operator's ca.crt: the peers' issuer), and it verifies the replicas with its
        # Secret's ca.crt: of the peers' issuer too.
        archiver = {
            "dnsNames": archive_specs.archiver_server_names(body),
            "usages": ["server auth", "client auth"],
        }
        out.append(
            _certificate(
                body, specs.archiver_secret_name(body), archiver_common_name(body), archiver, peers
            )
        )
    if specs.peer_issuer_given(body):
        out.append(
            _certificate(
                body,
                specs.client_ca_secret_name(body),
                f"{specs.name_of(body)}-client-ca",
                client,
                _issuer_ref(body),
            )
        )
    return out


def roles(
    body: Body, tokens: Mapping[str, bytes] = {}, certificates: Sequence[Mapping[str, Any]] = ()
) -> dict[str, Any]:
    """The replicas' roles file: the replicas are peers, the operator admin, then
    `spec.auth.subjects`; `tokens` are the bearer tokens of `spec.auth.tokens`, read from
    their Secrets by the caller (secret name/key -> token), kept only as SHA-256;
    `certificates` the identities the operator issued, by fingerprint (identities.py)."""
    auth = body.get("spec", {}).get("auth") or {}
    subjects: dict[str, str] = {
        replica_common_name(body): "peer",
        OPERATOR_COMMON_NAME: "admin",
    }
    if body.get("spec", {}).get("backup"):
        subjects[archiver_common_name(body)] = "read"  # the archiver reads, nothing more
    for rule in auth.get("subjects") or []:
        subjects.setdefault(str(rule["name"]), str(rule["role"]))
    token_rules = []
    for rule in auth.get("tokens") or []:
        ref = rule["secretRef"]
        token = tokens.get(f"{ref['name']}/{ref.get('key', 'token')}")
        if token is None:
            continue  # the Secret is not there (yet): that token grants nothing
        token_rules.append(
            {
                "name": f"{ref['name']}/{ref.get('key', 'token')}",
                "sha256": hashlib.sha256(token.strip()).hexdigest(),
                "role": str(rule["role"]),
            }
        )
    out = {"subjects": subjects, "tokens": token_rules, "default": "none"}
    if certificates:
        out["certificates"] = [dict(c) for c in certificates]
    return out


def auth_secret(
    body: Body, tokens: Mapping[str, bytes] = {}, certificates: Sequence[Mapping[str, Any]] = ()
) -> Manifest:
    text = json.dumps(roles(body, tokens, certificates), indent=2, sort_keys=True).encode()
    return _secret(body, auth_secret_name(body), {ROLES_KEY: text})


def own_secret_names(body: Body) -> frozenset[str]:
    """The Secrets of the log's PKI: never a client identity's."""
    return frozenset(
        {
            ca_secret_name(body),
            peer_ca_secret_name(body),
            server_secret_name(body),
            operator_secret_name(body),
            auth_secret_name(body),
            specs.archiver_secret_name(body),
            specs.client_ca_secret_name(body),
        }
    )


def tls_status(body: Body) -> dict[str, Any]:
    """`status.tls`: the mode, and in words what it means for the log's traffic."""
    mode = mode_of(body)
    if mode == MODE_DISABLED:
        return {"mode": mode, "transport": "plaintext", "authorization": "off"}
    return {"mode": mode, "transport": "mutual-tls", "authorization": "roles"}


def plan_secrets(
    body: Body,
    config: OperatorConfig,
    existing: Mapping[str, Mapping[str, Any] | None],
    now: datetime.datetime,
    tokens: Mapping[str, bytes] = {},
) -> list[Manifest]:
    """The Secrets to write (create or replace) so the log's PKI is whole and current,
        given the Secrets there now by name (None: absent). Keeps each CA while it is valid
        (the replicas' trust rests on it); issues the replicas' and the operator's certificates
        from the peer CA and the archiver's from the client CA when absent, expiring, not of
        that CA, carrying other CAs than the current ones, or (replicas) lacking a name; always
        rewrites the roles file when it differs; issues the identities of `spec.auth.clients`
    (`_plan_clients`), whose Secrets come after the roles file listing them. The CAs' Secrets
    come first in the list (a CA
        raced by another writer stops what it would have issued: pki_secrets.SecretRaced).
        Mode certManager leaves the certificates to cert-manager; mode disabled writes
        nothing."""
    mode = mode_of(body)
    if mode == MODE_DISABLED:
        return []
    out: list[Manifest] = []
    if mode != MODE_OPERATOR:
        _add_roles(body, tokens, [], existing, out)
        return out
    from rlog import certs

    where = f"{specs.namespace_of(body)}/{specs.name_of(body)}"
    peer_ca = _current_ca(
        body, peer_ca_secret_name(body), f"rlog {where} peer CA", existing, now, out
    )
    # The client CA's Secret also carries the peer CA's certificate (public): what a client
    # verifies the replicas with, for whoever issues clients from it (no other Secret to read).
    client_ca = _current_ca(
        body,
        ca_secret_name(body),
        f"rlog {where} client CA",
        existing,
        now,
        out,
        {PEER_CA_KEY: peer_ca.cert},
    )
    # What each identity's Secret says to trust besides its own certificate: ca.crt always
    # verifies the replicas (the peer CA). The replicas' also carries both CAs apart, and in
    # ca.crt both together: what a replica started before the peer CA (--tls-client-ca
    # ca.crt) trusts while the pods roll to the new flags.
    server_trust = {
        CA_KEY: peer_ca.cert.rstrip(b"\n") + b"\n" + client_ca.cert,
        PEER_CA_KEY: peer_ca.cert,
        CLIENT_CA_KEY: client_ca.cert,
    }
    own_identities = [
        (
            server_secret_name(body),
            replica_common_name(body),
            server_names(body, config),
            peer_ca,
            server_trust,
        ),
        (operator_secret_name(body), OPERATOR_COMMON_NAME, [], peer_ca, {CA_KEY: peer_ca.cert}),
    ]
    if body.get("spec", {}).get("backup"):
        own_identities.append(
            (
                specs.archiver_secret_name(body),
                archiver_common_name(body),
                # its control port's names (HTTPS): the operator verifies them against
                # its own ca.crt, the peer CA, which the operator alone issues from
                archive_specs.archiver_server_names(body),
                peer_ca,
                {CA_KEY: peer_ca.cert},
            )
        )
    clients = _plan_clients(body, existing, now, peer_ca, client_ca)
    _add_roles(body, tokens, clients.rules, existing, out)  # before the clients' Secrets
    for name, common_name, wanted, issuer, trust in own_identities:
        found = existing.get(name)
        cert = secret_bytes(found, CERT_KEY)
        if (
            any(secret_bytes(found, key) != value for key, value in trust.items())
            or not issued_by(cert, issuer.cert)
            or needs_renewal(cert, now, names=wanted)
        ):
            pem = certs.issue(issuer, common_name, wanted, days=CERT_DAYS)
            data = {**trust, CERT_KEY: pem.cert, KEY_KEY: pem.key}
            out.append(_secret(body, name, data, "kubernetes.io/tls"))
    return out + clients.secrets


def _add_roles(
    body: Body,
    tokens: Mapping[str, bytes],
    certificates: Sequence[Mapping[str, Any]],
    existing: Mapping[str, Mapping[str, Any] | None],
    out: list[Manifest],
) -> None:
    auth = auth_secret(body, tokens, certificates)
    if secret_bytes(existing.get(auth_secret_name(body)), ROLES_KEY) != secret_bytes(
        auth, ROLES_KEY
    ):
        out.append(auth)


@dataclass
class _Clients:
    secrets: list[Manifest]  # to write
    rules: list[dict[str, Any]]  # the roles file's certificates entries


def _plan_clients(
    body: Body,
    existing: Mapping[str, Mapping[str, Any] | None],
    now: datetime.datetime,
    peer_ca: Any,
    client_ca: Any,
) -> _Clients:
    """The identities of `spec.auth.clients` (identities.py): issued from the client CA when
    absent, expiring (identities.margin_of), of another CA or trusting another peer CA;
    the certificate replaced by a renewal stays listed (identities.PREVIOUS_KEY). A Secret
    of that name that is not the identity's is left alone (ensure_pki reports it)."""
    from rlog import certs

    planned = _Clients([], [])
    clients, _ = identities.clients_of(body, own_secret_names(body))
    for client in clients:
        found = existing.get(client.secret)
        if identities.foreign(found, client):
            continue
        cert = secret_bytes(found, CERT_KEY)
        margin = identities.margin_of(cert) if cert else RENEW_MARGIN
        ours = issued_by(cert, client_ca.cert)
        if (
            secret_bytes(found, CA_KEY) != peer_ca.cert
            or not ours
            or needs_renewal(cert, now, margin)
        ):
            pem = certs.issue(
                client_ca,
                client.name,
                days=client.days,
                uris=[identities.identity_uri(body, client.name)],
            )
            # the certificate replaced, while still valid, stays listed until the next renewal
            previous = (
                identities.fingerprint(cert).encode()
                if cert and ours and not needs_renewal(cert, now, datetime.timedelta(0))
                else b""
            )
            data = {
                CA_KEY: peer_ca.cert,
                CERT_KEY: pem.cert,
                KEY_KEY: pem.key,
                identities.PREVIOUS_KEY: previous,
            }
            found = _secret(body, client.secret, data, "kubernetes.io/tls")
            found["metadata"]["labels"][identities.IDENTITY_LABEL] = client.name
            planned.secrets.append(found)
        planned.rules.append(
            identities.certificate_rule(
                client, secret_bytes(found, CERT_KEY), secret_bytes(found, identities.PREVIOUS_KEY)
            )
        )
    return planned


def _current_ca(
    body: Body,
    name: str,
    common_name: str,
    existing: Mapping[str, Mapping[str, Any] | None],
    now: datetime.datetime,
    out: list[Manifest],
    extra: Mapping[str, bytes] = {},
) -> Any:
    """The CA kept in the Secret `name`, or a new one (its Secret appended to `out`) if it
    is absent or past use; the certificates it issued are then issued again (they are no
    longer the new CA's). `extra`: keys the Secret holds besides (rewritten if not)."""
    from rlog import certs

    found = existing.get(name)
    cert, key = secret_bytes(found, CA_KEY), secret_bytes(found, CA_PRIVATE_KEY)
    if cert is None or key is None or needs_renewal(cert, now, datetime.timedelta(days=1)):
        ca = certs.new_ca(common_name)
        out.append(_secret(body, name, {CA_KEY: ca.cert, CA_PRIVATE_KEY: ca.key, **extra}))
        return ca
    if any(secret_bytes(found, k) != v for k, v in extra.items()):
        out.append(_secret(body, name, {CA_KEY: cert, CA_PRIVATE_KEY: key, **extra}))
    return certs.Pem(cert, key)
