"""The operator's PKI for a ReplicatedLog (docs/security.md), as pure builders.

Mode `spec.tls.mode`:
- `operator` (the default): the operator runs a CA per log, kept in the Secret
  `<log>-tls-ca`; it issues the replicas' certificate (`<log>-tls`: one certificate for
  every replica, with every pod's DNS name, the client Service's names and the loopback
  names the probes use) and its own client identity (`<log>-tls-operator`, common name
  `rlog-operator`, role admin); it renews a certificate `RENEW_MARGIN` before it expires
  (`needs_renewal`), and the replicas take the new files without a restart.
- `certManager`: cert-manager Certificates with `spec.tls.issuerRef` write `<log>-tls`,
  the operator's identity and the archiver's (`certificate_requests`).
- `disabled`: plaintext (the status and the replicas' logs say so).

Roles (`spec.auth`): `subjects` map certificate names to roles (read, append, owner,
admin: rlog.runtime.authz.ROLE_GRANTS), `tokens` name Secrets whose keys hold bearer
tokens; the replicas' own certificate is role peer and the operator's is admin, always
(both may truncate: rlog_operator never does, the replicas forward their clients'
truncations). The roles file lands in the Secret `<log>-auth`.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from rlog_operator import archive_specs, specs
from rlog_operator.specs import (
    CA_KEY,
    CERT_KEY,
    KEY_KEY,
    MODE_DISABLED,
    MODE_OPERATOR,
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
    return f"{specs.name_of(body)}-tls-ca"


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


def ca_secret(body: Body, ca_cert: bytes, ca_key: bytes) -> Manifest:
    return _secret(body, ca_secret_name(body), {CA_KEY: ca_cert, CA_PRIVATE_KEY: ca_key})


def tls_secret(body: Body, name: str, ca_cert: bytes, cert: bytes, key: bytes) -> Manifest:
    return _secret(body, name, {CA_KEY: ca_cert, CERT_KEY: cert, KEY_KEY: key}, "kubernetes.io/tls")


def secret_bytes(secret: Mapping[str, Any] | None, key: str) -> bytes | None:
    """A key of a Secret as the API returns it (base64 data), None if absent."""
    if not secret:
        return None
    value = (secret.get("data") or {}).get(key)
    return base64.b64decode(value) if value else None


def _issuer_ref(body: Body) -> dict[str, str]:
    issuer = (body.get("spec", {}).get("tls") or {}).get("issuerRef") or {}
    if not issuer.get("name"):
        raise ValueError("spec.tls.mode certManager needs spec.tls.issuerRef.name")
    return {
        "name": str(issuer["name"]),
        "kind": str(issuer.get("kind", "Issuer")),
        "group": str(issuer.get("group", "cert-manager.io")),
    }


def _certificate(body: Body, secret_name: str, common_name: str, spec: Body) -> Manifest:
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
            "issuerRef": _issuer_ref(body),
        },
    }


def certificate_request(body: Body, config: OperatorConfig) -> Manifest:
    """The cert-manager Certificate of mode certManager for the replicas: `<log>-tls`
    from `spec.tls.issuerRef`, with every name `server_names` gives."""
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
    )


def certificate_requests(body: Body, config: OperatorConfig) -> list[Manifest]:
    """Every Certificate of mode certManager, all from `spec.tls.issuerRef`: the replicas'
    (`certificate_request`), the operator's client identity (`<log>-tls-operator`,
    `CN=rlog-operator`, role admin) and, with `spec.backup`, the archiver's
    (`<log>-tls-archiver`, role read): the same identities mode operator issues itself."""
    client = {"usages": ["client auth"]}
    out = [
        certificate_request(body, config),
        _certificate(body, operator_secret_name(body), OPERATOR_COMMON_NAME, client),
    ]
    if body.get("spec", {}).get("backup"):
        archiver = {
            "dnsNames": archive_specs.archiver_server_names(body),
            "usages": ["server auth", "client auth"],
        }
        out.append(
            _certificate(
                body, specs.archiver_secret_name(body), archiver_common_name(body), archiver
            )
        )
    return out


def roles(body: Body, tokens: Mapping[str, bytes] = {}) -> dict[str, Any]:
    """The replicas' roles file: the replicas are peers, the operator admin, then
    `spec.auth.subjects`; `tokens` are the bearer tokens of `spec.auth.tokens`, read from
    their Secrets by the caller (secret name/key -> token), kept only as SHA-256."""
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
    return {"subjects": subjects, "tokens": token_rules, "default": "none"}


def auth_secret(body: Body, tokens: Mapping[str, bytes] = {}) -> Manifest:
    text = json.dumps(roles(body, tokens), indent=2, sort_keys=True).encode()
    return _secret(body, auth_secret_name(body), {ROLES_KEY: text})


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
    given the Secrets there now by name (None: absent). Keeps the CA while it is valid
    (the replicas' trust rests on it); issues the replicas' and the operator's certificates
    when absent, expiring, or (replicas) lacking a name; always rewrites the roles file
    when it differs. Mode certManager leaves the replicas' certificate to cert-manager;
    mode disabled writes nothing."""
    from rlog import certs

    mode = mode_of(body)
    if mode == MODE_DISABLED:
        return []
    out: list[Manifest] = []
    auth = auth_secret(body, tokens)
    if secret_bytes(existing.get(auth_secret_name(body)), ROLES_KEY) != secret_bytes(
        auth, ROLES_KEY
    ):
        out.append(auth)
    if mode != MODE_OPERATOR:
        return out
    ca_found = existing.get(ca_secret_name(body))
    ca_cert = secret_bytes(ca_found, CA_KEY)
    ca_key = secret_bytes(ca_found, CA_PRIVATE_KEY)
    # A CA is replaced only once it is past use: then every certificate goes with it.
    renew_all = ca_key is None or needs_renewal(ca_cert, now, datetime.timedelta(days=1))
    if renew_all:
        ca = certs.new_ca(f"rlog {specs.namespace_of(body)}/{specs.name_of(body)} CA")
        out.append(ca_secret(body, ca.cert, ca.key))
    else:
        assert ca_cert is not None and ca_key is not None
        ca = certs.Pem(ca_cert, ca_key)
    names = server_names(body, config)
    identities = [
        (server_secret_name(body), replica_common_name(body), names),
        (operator_secret_name(body), OPERATOR_COMMON_NAME, []),
    ]
    if body.get("spec", {}).get("backup"):
        identities.append(
            (
                specs.archiver_secret_name(body),
                archiver_common_name(body),
                archive_specs.archiver_server_names(body),  # its control port's (HTTPS)
            )
        )
    for name, common_name, wanted in identities:
        found = existing.get(name)
        if (
            renew_all
            or secret_bytes(found, CA_KEY) != ca.cert
            or needs_renewal(secret_bytes(found, CERT_KEY), now, names=wanted)
        ):
            pem = certs.issue(ca, common_name, wanted, days=CERT_DAYS)
            out.append(tls_secret(body, name, ca.cert, pem.cert, pem.key))
    return out
