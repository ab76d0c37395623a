"""Client identities the operator issues (spec.auth.clients, identities.py): planned by
pki.plan_secrets from the client CA, bound by fingerprint in the roles file, renewed with
the replaced certificate still listed, revoked by removing the entry."""

from __future__ import annotations

import datetime
import json

import pytest

pytest.importorskip("cryptography")

from cryptography import x509

from rlog.runtime.authz import caller_of_tls, decide, parse_policy
from rlog_operator import identities, pki, specs
from rlog_operator.specs import OperatorConfig

CONFIG = OperatorConfig()
READ, APPEND = "/rlog.v1.Log/Read", "/rlog.v1.Log/Append"


@pytest.fixture
def now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def log(*clients, subjects=()):
    return {
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"},
        "spec": {
            "replicas": 3,
            "storage": {"size": "1Gi"},
            "auth": {"clients": list(clients), "subjects": list(subjects)},
        },
    }


def apply(existing, written):
    """The Secrets as they are once `written` is (a patch keeps the other keys)."""
    out = dict(existing)
    for secret in written:
        name = secret["metadata"]["name"]
        old = out.get(name)
        out[name] = {**secret, "data": {**((old or {}).get("data") or {}), **secret["data"]}}
    return out


def policy_of(secrets):
    text = pki.secret_bytes(secrets["orders-auth"], specs.ROLES_KEY)
    return parse_policy(json.loads(text), "roles")


def may(secrets, cert, method=READ):
    caller = caller_of_tls(("spark-reader",), cert, "", None)
    return decide(policy_of(secrets), method, caller).allowed


def test_issued_then_kept_then_renewed_then_revoked(now):
    reader = {"name": "spark-reader", "role": "read", "days": 3}
    body = log(reader, subjects=[{"name": "spark-*", "role": "append"}])
    first = pki.plan_secrets(body, CONFIG, {}, now)
    names = [s["metadata"]["name"] for s in first]
    # the roles file naming the certificate is written before the certificate
    assert names.index("orders-auth") < names.index("orders-client-spark-reader")
    secrets = apply({}, first)
    mine = secrets["orders-client-spark-reader"]
    assert mine["metadata"]["labels"][identities.IDENTITY_LABEL] == "spark-reader"
    cert = pki.secret_bytes(mine, specs.CERT_KEY)
    peer_ca = pki.secret_bytes(secrets["orders-tls-peer-ca"], specs.CA_KEY)
    assert pki.secret_bytes(mine, specs.CA_KEY) == peer_ca  # verifies the replicas
    assert pki.issued_by(cert, pki.secret_bytes(secrets["orders-tls-ca"], specs.CA_KEY))
    parsed = x509.load_pem_x509_certificate(cert)
    assert parsed.subject.rfc4514_string() == "CN=spark-reader"
    assert (parsed.not_valid_after_utc - parsed.not_valid_before_utc).days == 3
    # its role is read (its entry), not the pattern's append
    assert may(secrets, cert) and not may(secrets, cert, APPEND)
    assert pki.plan_secrets(body, CONFIG, secrets, now) == []
    # a third of its lifetime before it expires: issued again; the old one stays listed
    later = now + datetime.timedelta(days=2.1)
    renewed = pki.plan_secrets(body, CONFIG, secrets, later)
    assert {s["metadata"]["name"] for s in renewed} == {"orders-auth", "orders-client-spark-reader"}
    secrets = apply(secrets, renewed)
    new = pki.secret_bytes(secrets["orders-client-spark-reader"], specs.CERT_KEY)
    assert new != cert and may(secrets, new) and may(secrets, cert)
    # revoked: out of the roles file (neither certificate has a role, whatever patterns say)
    # and its Secret is to be deleted once that file is written
    roles_in_force = json.loads(pki.secret_bytes(secrets["orders-auth"], specs.ROLES_KEY))
    gone = log(subjects=[{"name": "spark-*", "role": "append"}])
    secrets = apply(secrets, pki.plan_secrets(gone, CONFIG, secrets, later))
    assert not may(secrets, new) and not may(secrets, cert)
    clients, _ = identities.clients_of(gone)
    assert identities.revoked_secrets(roles_in_force, clients) == ["orders-client-spark-reader"]


def test_refused_requests(now):
    body = log(
        {"name": "root", "role": "admin"},
        {"name": "sneaky", "role": "peer"},
        {"name": "Bad_Name", "role": "read"},
        {"name": "steal", "role": "read", "secretName": "orders-tls-ca"},
        {"name": "twice", "role": "read"},
        {"name": "twice", "role": "append"},
        {"name": "squat", "role": "read", "secretName": "someone-elses"},
    )
    clients, problems = identities.clients_of(body, pki.own_secret_names(body))
    assert [c.name for c in clients] == ["twice", "squat"]
    assert len(problems) == 5 and "orders-tls-ca" in problems[3]
    foreign = {"metadata": {"name": "someone-elses", "labels": {}}, "data": {}}
    planned = pki.plan_secrets(body, CONFIG, {"someone-elses": foreign}, now)
    written = {s["metadata"]["name"]: s for s in planned}
    assert "someone-elses" not in written and "orders-client-twice" in written
    # the client CA's Secret is written as the log's CA only, never as an identity's
    assert pki.secret_bytes(written["orders-tls-ca"], specs.KEY_KEY) is None
    from rlog_operator.pki_secrets import identity_problems

    assert any(
        "someone-elses exists" in p for p in identity_problems(body, {"someone-elses": foreign})
    )
