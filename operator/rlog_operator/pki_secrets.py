"""The I/O of a log's PKI (pki.py plans it): its Secrets read and written, cert-manager
Certificates applied (mode certManager), and the operator's own client credentials for each
log, kept for the replica calls (rlog_operator.replica_calls)."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from rlog_operator import identities, kube, pki, specs


class SecretRaced(Exception):
    """A Secret planned as new was created meanwhile (another handler or operator pod):
    what was planned with it (certificates of a CA) is not written; plan again."""


def write_secret(obj: Mapping[str, Any], new: bool) -> None:
    """Create the Secret (`new`: it was absent when planned), or replace its data."""
    api = kube.core()
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    if not new:
        api.patch_namespaced_secret(name, namespace, {"data": obj["data"]})
        return
    try:
        api.create_namespaced_secret(namespace, dict(obj))  # type: ignore[arg-type]
    except ApiException as e:
        if e.status == 409:
            raise SecretRaced(name) from None
        raise


# The operator's client credentials per log (namespace, name), from its `-tls-operator`
# Secret; None: the log is plaintext.
_CREDENTIALS: dict[tuple[str, str], Any] = {}
_PKI_LOCKS: dict[tuple[str, str], asyncio.Lock] = {}
# The spec.auth.clients problems reported last per log (warned again only when they change).
_REPORTED: dict[tuple[str, str], list[str]] = {}


def secrets_of(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The log's PKI Secrets by name (None: absent) and its tokens (`name/key` -> token)."""
    namespace = specs.namespace_of(body)
    names = [
        pki.ca_secret_name(body),
        pki.peer_ca_secret_name(body),
        specs.server_secret_name(body),
        pki.operator_secret_name(body),
        specs.auth_secret_name(body),
    ]
    if (body.get("spec") or {}).get("backup"):
        names.append(specs.archiver_secret_name(body))
    clients, _ = identities.clients_of(body, pki.own_secret_names(body))
    names += [client.secret for client in clients]
    existing = {name: kube.read_secret(name, namespace) for name in names}
    tokens: dict[str, bytes] = {}
    for rule in ((body.get("spec") or {}).get("auth") or {}).get("tokens") or []:
        ref = rule["secretRef"]
        key = ref.get("key", "token")
        value = pki.secret_bytes(kube.read_secret(ref["name"], namespace), key)
        if value is not None:
            tokens[f"{ref['name']}/{key}"] = value
    return existing, tokens


def delete_identity_secret(name: str, namespace: str) -> None:
    """Delete a revoked identity's Secret: only if it is one (IDENTITY_LABEL), and that very
    object (UID precondition)."""
    from kubernetes import client as k8s

    found = kube.read_secret(name, namespace)
    metadata = (found or {}).get("metadata") or {}
    if identities.IDENTITY_LABEL not in (metadata.get("labels") or {}):
        return
    options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=metadata.get("uid")))
    try:
        kube.core().delete_namespaced_secret(name, namespace, body=options)
    except ApiException as e:
        if e.status not in (404, 409):  # gone already / another Secret by that name now
            raise


def identity_problems(body: Mapping[str, Any], existing: Mapping[str, Any]) -> list[str]:
    """Why entries of spec.auth.clients get no certificate, one line each."""
    clients, problems = identities.clients_of(body, pki.own_secret_names(body))
    if clients and specs.mode_of(body) != specs.MODE_OPERATOR:
        return [*problems, "spec.auth.clients needs spec.tls.mode operator: none issued"]
    problems += [
        f"spec.auth.clients {c.name}: Secret {c.secret} exists and is not this identity's "
        f"(no label {identities.IDENTITY_LABEL}={c.name}): left alone, nothing issued"
        for c in clients
        if identities.foreign(existing.get(c.secret), c)
    ]
    return problems


def apply_certificate(obj: Mapping[str, Any]) -> None:
    """Create or patch a cert-manager Certificate (mode certManager)."""
    api = kube.custom_objects()
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    try:
        api.create_namespaced_custom_object(
            "cert-manager.io", "v1", namespace, "certificates", dict(obj)
        )
    except ApiException as e:
        if e.status != 409:
            raise
        api.patch_namespaced_custom_object(
            "cert-manager.io", "v1", namespace, "certificates", name, dict(obj)
        )


async def ensure_pki(body: kopf.Body, config: specs.OperatorConfig, logger: kopf.Logger) -> None:
    """Create or renew the log's certificates and roles (pki.plan_secrets), and keep the
    operator's client credentials for it. Raises SecretRaced if a Secret planned as new
    appeared meanwhile (nothing planned after it is written)."""
    from rlog.client import Credentials

    key = (specs.namespace_of(body), specs.name_of(body))
    mode = specs.mode_of(body)
    if mode == specs.MODE_DISABLED:
        _CREDENTIALS[key] = None
        return
    if mode == specs.MODE_CERT_MANAGER:
        for request in pki.certificate_requests(body, config):
            kopf.adopt(request, owner=body, strict=True)
            await asyncio.to_thread(apply_certificate, request)
    # One plan at a time per log: two at once (the create handler and the observe timer
    # on a new log) would each make a CA, and one log's Secrets would mix them.
    async with _PKI_LOCKS.setdefault(key, asyncio.Lock()):
        existing, tokens = await asyncio.to_thread(secrets_of, body)
        roles_in_force = _roles_of(existing.get(specs.auth_secret_name(body)))
        now = dt.datetime.now(dt.UTC)
        for secret in pki.plan_secrets(body, config, existing, now, tokens):
            name = secret["metadata"]["name"]
            kopf.adopt(secret, owner=body, strict=True)
            await asyncio.to_thread(write_secret, secret, existing.get(name) is None)
            existing[name] = secret
            logger.info("wrote Secret %s", name)
        problems = identity_problems(body, existing)
        if _REPORTED.get(key) != problems:  # once per change, not at every tick
            for problem in problems:
                logger.warning("%s", problem)
            _REPORTED[key] = problems
        # Revoked identities: out of the roles file (written above), then their Secrets go.
        clients, _ = identities.clients_of(body, pki.own_secret_names(body))
        for name in identities.revoked_secrets(roles_in_force, clients):
            await asyncio.to_thread(delete_identity_secret, name, specs.namespace_of(body))
            logger.info("revoked client identity: deleted Secret %s", name)
    mine = existing.get(pki.operator_secret_name(body))
    cert = pki.secret_bytes(mine, specs.CERT_KEY)
    if cert is None:  # certManager: cert-manager has not written the operator's Secret yet
        _CREDENTIALS[key] = None
        return
    _CREDENTIALS[key] = Credentials(
        pki.secret_bytes(mine, specs.CA_KEY), cert, pki.secret_bytes(mine, specs.KEY_KEY)
    )


def _roles_of(secret: Mapping[str, Any] | None) -> dict[str, Any] | None:
    text = pki.secret_bytes(secret, specs.ROLES_KEY)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def credentials(body: Mapping[str, Any]) -> Any:
    """The operator's client credentials for the log (kept by ensure_pki); None: plaintext,
    or not known yet."""
    return _CREDENTIALS.get((specs.namespace_of(body), specs.name_of(body)))
