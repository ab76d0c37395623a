"""The operator's PKI builders (rlog_operator.pki): pure decisions on real certificates."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest

pytest.importorskip("cryptography")

from cryptography import x509

from rlog import certs
from rlog.runtime.authz import CERTIFICATE_ROLES, ROLE_GRANTS, Caller, decide, parse_policy
from rlog_operator import pki, specs
from rlog_operator.specs import OperatorConfig

CONFIG = OperatorConfig()


@pytest.fixture
def now() -> datetime.datetime:
    """When the test runs: certificates are issued valid from 5 minutes before the real
    time, so a time taken at import is older than that in a long (loaded) run."""
    return datetime.datetime.now(datetime.UTC)


def body(replicas=3, **spec):
    return {
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"},
        "spec": {"replicas": replicas, "storage": {"size": "1Gi"}, **spec},
    }


def by_name(secrets):
    return {s["metadata"]["name"]: s for s in secrets}


def sans(cert_pem):
    cert = x509.load_pem_x509_certificate(cert_pem)
    alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {str(v) for v in alt.get_values_for_type(x509.DNSName)} | {
        str(v) for v in alt.get_values_for_type(x509.IPAddress)
    }


def test_mode_default_and_invalid():
    assert specs.mode_of(body()) == "operator"
    assert specs.mode_of(body(tls={"mode": "disabled"})) == "disabled"
    with pytest.raises(ValueError, match="not one of"):
        specs.mode_of(body(tls={"mode": "sometimes"}))


def test_mode_of_a_log_built_before_tls_stays_plaintext():
    old = {**body(), "status": {"initialized": True}}
    assert specs.mode_of(old) == "disabled"
    built = {**body(), "status": {"initialized": True, "tls": {"mode": "operator"}}}
    assert specs.mode_of(built) == "operator"
    asked = {**body(tls={"mode": "operator"}), "status": {"initialized": True}}
    assert specs.mode_of(asked) == "operator"


def test_server_names():
    names = pki.server_names(body(), CONFIG)
    assert names[:3] == [f"orders-{i}.orders-headless.shop.svc" for i in range(3)]
    assert {"orders", "orders.shop", "orders.shop.svc", "localhost", "127.0.0.1"} <= set(names)
    domain = pki.server_names(body(), OperatorConfig(cluster_domain="cluster.local"))
    assert "orders.shop.svc.cluster.local" in domain
    # The replicas dial the fully qualified peer names; clients may use either form.
    for i in range(3):
        assert f"orders-{i}.orders-headless.shop.svc.cluster.local" in domain
        assert f"orders-{i}.orders-headless.shop.svc" in domain
        # From the log's namespace a pod answers to its short names too, as a Service does
        # (`rlog status --endpoint orders-0.orders-headless:7000` in the cluster demo).
        assert f"orders-{i}.orders-headless.shop" in domain
        assert f"orders-{i}.orders-headless" in domain


def test_needs_renewal(now):
    ca = certs.new_ca("ca")
    pem = certs.issue(ca, "x", ["a.example"], days=90)
    assert not pki.needs_renewal(pem.cert, now, datetime.timedelta(days=30))
    assert pki.needs_renewal(
        pem.cert, now + datetime.timedelta(days=61), datetime.timedelta(days=30)
    )
    assert pki.needs_renewal(pem.cert, now - datetime.timedelta(days=1))  # not yet valid
    assert pki.needs_renewal(None, now)
    assert pki.needs_renewal(b"garbage", now)
    assert not pki.needs_renewal(pem.cert, now, names=["a.example"])
    assert pki.needs_renewal(pem.cert, now, names=["a.example", "b.example"])


def test_plan_creates_then_keeps_then_renews(now):
    log = body()
    first = by_name(pki.plan_secrets(log, CONFIG, {}, now))
    assert set(first) == {
        "orders-auth",
        "orders-tls-ca",
        "orders-tls-peer-ca",
        "orders-tls",
        "orders-tls-operator",
    }
    peer_ca = pki.secret_bytes(first["orders-tls-peer-ca"], pki.CA_KEY)
    client_ca = pki.secret_bytes(first["orders-tls-ca"], pki.CA_KEY)
    assert peer_ca != client_ca
    # Whoever issues clients from the client CA finds what verifies the replicas beside it.
    assert pki.secret_bytes(first["orders-tls-ca"], specs.PEER_CA_KEY) == peer_ca
    server = first["orders-tls"]
    assert server["type"] == "kubernetes.io/tls"
    assert pki.secret_bytes(server, specs.PEER_CA_KEY) == peer_ca
    assert pki.secret_bytes(server, specs.CLIENT_CA_KEY) == client_ca
    assert set(pki.server_names(log, CONFIG)) <= sans(pki.secret_bytes(server, pki.CERT_KEY))
    operator = x509.load_pem_x509_certificate(
        pki.secret_bytes(first["orders-tls-operator"], pki.CERT_KEY)
    )
    assert operator.subject.rfc4514_string() == "CN=rlog-operator"
    # Everything current: nothing to write.
    assert pki.plan_secrets(log, CONFIG, first, now) == []
    # Close to expiry: the certificates are issued again by the same CA, the CA kept.
    later = now + datetime.timedelta(days=pki.CERT_DAYS - 10)
    renewed = by_name(pki.plan_secrets(log, CONFIG, first, later))
    assert set(renewed) == {"orders-tls", "orders-tls-operator"}
    assert pki.secret_bytes(renewed["orders-tls"], specs.PEER_CA_KEY) == peer_ca
    assert pki.issued_by(pki.secret_bytes(renewed["orders-tls"], pki.CERT_KEY), peer_ca)
    # A fifth replica: its name is missing from the certificate, which is issued again.
    grown = by_name(pki.plan_secrets(body(replicas=5), CONFIG, first, now))
    assert "orders-tls" in grown and "orders-tls-operator" not in grown


def test_replicas_and_operator_are_of_the_peer_ca_and_clients_of_the_client_ca(now):
    """The attack the peer CA stops: the client CA (whose key onboards clients) signs a
    certificate with the replicas' and the operator's names; the replicas, started with
    the flags and files the operator renders, give it neither peer nor admin."""
    from rlog.runtime.tls import PeerAuthority

    log = body(backup={"s3": {}})
    secrets = by_name(pki.plan_secrets(log, CONFIG, {}, now))
    server = secrets["orders-tls"]
    peer_ca = pki.secret_bytes(secrets["orders-tls-peer-ca"], pki.CA_KEY)
    client_ca = certs.Pem(
        pki.secret_bytes(secrets["orders-tls-ca"], pki.CA_KEY),
        pki.secret_bytes(secrets["orders-tls-ca"], pki.CA_PRIVATE_KEY),
    )
    cert_of = {name: pki.secret_bytes(secrets[name], pki.CERT_KEY) for name in secrets}
    assert pki.issued_by(cert_of["orders-tls"], peer_ca)
    assert pki.issued_by(cert_of["orders-tls-operator"], peer_ca)
    # The archiver too: the operator verifies its control port (HTTPS) with the peer CA;
    # its roles-file name gives it read, and the peer CA alone grants no more.
    assert pki.issued_by(cert_of["orders-tls-archiver"], peer_ca)
    assert not pki.issued_by(cert_of["orders-tls-archiver"], client_ca.cert)
    # Every identity verifies the replicas with the peer CA (its ca.crt).
    for name in ("orders-tls-operator", "orders-tls-archiver"):
        assert pki.secret_bytes(secrets[name], pki.CA_KEY) == peer_ca
    args = specs.security_args(log)
    assert args[args.index("--tls-peer-ca") + 1].endswith("/" + specs.PEER_CA_KEY)
    assert args[args.index("--tls-client-ca") + 1].endswith("/" + specs.CLIENT_CA_KEY)
    assert {"name": "RLOG_CA", "value": f"{specs.TLS_MOUNT}/{specs.PEER_CA_KEY}"} in (
        specs.security_env(log)
    )
    authority = PeerAuthority(pki.secret_bytes(server, specs.PEER_CA_KEY))
    policy = parse_policy(json.loads(json.dumps(pki.roles(log))), "roles")
    forged = certs.issue(client_ca, "orders-replica", ["rlog-operator"])
    caller = Caller(("orders-replica", "rlog-operator"), from_peer_ca=authority.issued(forged.cert))
    assert caller.from_peer_ca is False
    for method in ("/rlog.v1.Replica/Learned", "/rlog.v1.Admin/StepDown"):
        assert not decide(policy, method, caller).allowed
    replica = Caller(("orders-replica",), from_peer_ca=authority.issued(cert_of["orders-tls"]))
    assert decide(policy, "/rlog.v1.Replica/Learned", replica).allowed
    operator = Caller(
        ("rlog-operator",), from_peer_ca=authority.issued(cert_of["orders-tls-operator"])
    )
    assert decide(policy, "/rlog.v1.Admin/StepDown", operator).allowed


def test_a_log_made_with_one_ca_keeps_it_as_the_client_ca(now):
    """A log whose PKI predates the peer CA: its CA stays (the clients' certificates stay
    valid) as the client CA; a peer CA is made, and the replicas' and operator's
    certificates, which that one CA issued, are issued again by the peer CA. The replicas'
    ca.crt carries both CAs, what a replica still on the old flags trusts while it rolls."""
    log = body()
    one_ca = certs.new_ca("rlog shop/orders CA")
    replica = certs.issue(one_ca, "orders-replica", pki.server_names(log, CONFIG))
    operator = certs.issue(one_ca, "rlog-operator")

    def secret(name, data):
        return {"metadata": {"name": name}, "data": {k: pki._b64(v) for k, v in data.items()}}

    before = {
        "orders-tls-ca": secret("orders-tls-ca", {"ca.crt": one_ca.cert, "ca.key": one_ca.key}),
        "orders-tls": secret(
            "orders-tls", {"ca.crt": one_ca.cert, "tls.crt": replica.cert, "tls.key": replica.key}
        ),
        "orders-tls-operator": secret(
            "orders-tls-operator",
            {"ca.crt": one_ca.cert, "tls.crt": operator.cert, "tls.key": operator.key},
        ),
    }
    plan = by_name(pki.plan_secrets(log, CONFIG, before, now))
    kept = plan["orders-tls-ca"]  # kept as the client CA, with the peer CA's certificate
    assert pki.secret_bytes(kept, pki.CA_KEY) == one_ca.cert
    assert pki.secret_bytes(kept, pki.CA_PRIVATE_KEY) == one_ca.key
    assert {"orders-tls-peer-ca", "orders-tls", "orders-tls-operator"} <= set(plan)
    peer_ca = pki.secret_bytes(plan["orders-tls-peer-ca"], pki.CA_KEY)
    assert pki.secret_bytes(kept, specs.PEER_CA_KEY) == peer_ca
    server = plan["orders-tls"]
    assert pki.secret_bytes(server, specs.CLIENT_CA_KEY) == one_ca.cert
    assert pki.issued_by(pki.secret_bytes(server, pki.CERT_KEY), peer_ca)
    both = x509.load_pem_x509_certificates(pki.secret_bytes(server, pki.CA_KEY))
    assert {c.subject.rfc4514_string() for c in both} == {
        "CN=rlog shop/orders CA",
        "CN=rlog shop/orders peer CA",
    }
    # Once written, nothing more to do.
    after = {**before, **plan}
    assert pki.plan_secrets(log, CONFIG, after, now) == []


def test_plan_modes(now):
    assert pki.plan_secrets(body(tls={"mode": "disabled"}), CONFIG, {}, now) == []
    manager = body(tls={"mode": "certManager", "issuerRef": {"name": "corp"}})
    assert [s["metadata"]["name"] for s in pki.plan_secrets(manager, CONFIG, {}, now)] == [
        "orders-auth"
    ]
    request = pki.certificate_request(manager, CONFIG)
    assert request["spec"]["secretName"] == "orders-tls"
    assert request["spec"]["issuerRef"] == {
        "name": "corp",
        "kind": "Issuer",
        "group": "cert-manager.io",
    }
    assert "127.0.0.1" in request["spec"]["ipAddresses"]
    assert "orders.shop.svc" in request["spec"]["dnsNames"]
    with pytest.raises(ValueError, match="issuerRef"):
        pki.certificate_request(body(tls={"mode": "certManager"}), CONFIG)


def test_cert_manager_issues_every_identity_of_the_log():
    """Mode certManager asks cert-manager for the same identities mode operator issues
    itself, each into the Secret the pods and the operator read, and each name gets the
    role the roles file gives it."""
    issuer = {"name": "corp-ca", "kind": "ClusterIssuer"}
    plain = body(tls={"mode": "certManager", "issuerRef": issuer})
    backed = body(tls={"mode": "certManager", "issuerRef": issuer}, backup={"s3": {}})
    assert [r["metadata"]["name"] for r in pki.certificate_requests(plain, CONFIG)] == [
        "orders-tls",
        "orders-tls-operator",
    ]
    requests = {r["metadata"]["name"]: r for r in pki.certificate_requests(backed, CONFIG)}
    assert list(requests) == ["orders-tls", "orders-tls-operator", "orders-tls-archiver"]
    policy = parse_policy(json.loads(json.dumps(pki.roles(backed))), "roles")
    roles = {}
    for name, request in requests.items():
        spec = request["spec"]
        assert request["apiVersion"] == "cert-manager.io/v1" and request["kind"] == "Certificate"
        assert spec["secretName"] == name and request["metadata"]["namespace"] == "shop"
        assert spec["issuerRef"] == {**issuer, "group": "cert-manager.io"}
        assert spec["privateKey"]["rotationPolicy"] == "Always"
        found = policy.role_of_subject([spec["commonName"]])
        roles[name] = found[0] if found else None
    assert roles == {
        "orders-tls": "peer",
        "orders-tls-operator": "admin",
        "orders-tls-archiver": "read",
    }
    assert requests["orders-tls-operator"]["spec"]["usages"] == ["client auth"]
    assert "dnsNames" not in requests["orders-tls-operator"]["spec"]
    assert "server auth" in requests["orders-tls"]["spec"]["usages"]
    with pytest.raises(ValueError, match="issuerRef"):
        pki.certificate_requests(body(tls={"mode": "certManager", "issuerRef": {}}), CONFIG)


def test_cert_manager_with_a_peer_issuer_keeps_peers_apart():
    """spec.tls.peerIssuerRef: the log's own identities come from the peers' issuer, the
    clients' issuer signs only a CA anchor (no role) whose ca.crt the replicas trust for
    clients, and the replicas run with --tls-peer-ca on their own Secret's ca.crt."""
    clients = {"name": "corp-clients", "kind": "ClusterIssuer"}
    peers = {"name": "orders-peers"}
    log = body(
        tls={"mode": "certManager", "issuerRef": clients, "peerIssuerRef": peers},
        backup={"s3": {}},
    )
    requests = {r["metadata"]["name"]: r for r in pki.certificate_requests(log, CONFIG)}
    issuer_of = {name: r["spec"]["issuerRef"]["name"] for name, r in requests.items()}
    assert issuer_of == {
        "orders-tls": "orders-peers",
        "orders-tls-operator": "orders-peers",
        "orders-tls-archiver": "orders-peers",
        "orders-tls-client-ca": "corp-clients",
    }
    anchor = requests["orders-tls-client-ca"]["spec"]
    assert anchor["usages"] == ["client auth"]
    policy = parse_policy(json.loads(json.dumps(pki.roles(log))), "roles")
    assert policy.role_of_subject([anchor["commonName"]]) is None  # no role
    args = specs.security_args(log)
    assert args[args.index("--tls-peer-ca") + 1] == "/etc/rlog/tls/ca.crt"
    assert args[args.index("--tls-client-ca") + 1] == "/etc/rlog/client-ca/ca.crt"
    vols, mounts = specs.security_volumes(log)
    (client_ca,) = [v for v in vols if v["name"] == "client-ca"]
    assert client_ca["secret"]["secretName"] == "orders-tls-client-ca"
    assert client_ca["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]  # no key
    assert {"name": "client-ca", "mountPath": "/etc/rlog/client-ca", "readOnly": True} in mounts
    (ctr,) = specs.statefulset(log, CONFIG)["spec"]["template"]["spec"]["containers"]
    assert "--tls-peer-ca" in ctr["args"]
    # The peers' issuer must be another issuer than the clients'.
    same = body(tls={"mode": "certManager", "issuerRef": peers, "peerIssuerRef": peers})
    with pytest.raises(ValueError, match="same issuer"):
        pki.certificate_requests(same, CONFIG)
    # Without it: one issuer, no anchor, peers known by name (as before).
    one = body(tls={"mode": "certManager", "issuerRef": clients})
    assert "orders-tls-client-ca" not in {
        r["metadata"]["name"] for r in pki.certificate_requests(one, CONFIG)
    }
    assert "--tls-peer-ca" not in specs.security_args(one)
    assert [v["name"] for v in specs.security_volumes(one)[0]] == ["tls", "auth"]


def test_roles_file_is_a_valid_policy():
    log = body(
        auth={
            "subjects": [{"name": "spark-*", "role": "append"}],
            "tokens": [
                {"secretRef": {"name": "dash", "key": "token"}, "role": "read"},
                {"secretRef": {"name": "absent"}, "role": "admin"},
            ],
        }
    )
    roles = pki.roles(log, {"dash/token": b"t0ken\n"})
    policy = parse_policy(json.loads(json.dumps(roles)), "roles")
    assert policy.role_of_subject(["orders-replica"]) == ("peer", "orders-replica")
    assert policy.role_of_subject(["rlog-operator"]) == ("admin", "rlog-operator")
    assert policy.role_of_subject(["spark-7"]) == ("append", "spark-7")
    rule = policy.role_of_token("t0ken")
    assert rule is not None and rule.role == "read"
    assert len(policy.tokens) == 1  # the absent Secret grants nothing
    assert "t0ken" not in json.dumps(roles)  # only its digest


def test_rendered_roles_give_the_operator_and_peers_what_they_call():
    """The destroy kind (Truncate, TakeEpoch) stays with the operator (admin) and the
    replicas (peer: they forward their clients' truncations), `spec.auth` may name the
    owner role, and an append subject cannot destroy."""
    log = body(
        backup={"bucket": "b", "credentialsSecret": "s"},
        auth={"subjects": [{"name": "spark-*", "role": "append"}, {"name": "gc", "role": "owner"}]},
    )
    policy = parse_policy(json.loads(json.dumps(pki.roles(log))), "roles")

    def may(name: str, method: str) -> bool:
        return decide(policy, f"/rlog.v1.{method}", Caller(names=(name,))).allowed

    for method in ("Log/Truncate", "Log/TakeEpoch", "Log/Append"):
        assert may("orders-replica", method) and may("rlog-operator", method)
        assert may("gc", method)
        assert not may("orders-archiver", method)
    for method in ("Admin/StepDown", "Admin/GrantPermit", "Admin/RevokePermit"):
        assert may("rlog-operator", method) and not may("gc", method)
    assert may("orders-replica", "Replica/Promise") and not may("rlog-operator", "Replica/Promise")
    assert may("orders-archiver", "Log/Tail")
    assert may("spark-1", "Log/Append") and not may("spark-1", "Log/Truncate")


def test_crd_offers_every_client_role():
    """spec.auth's role enum (both copies of the CRD) is every role a client may be given:
    all of authz.ROLE_GRANTS but peer (the replicas' own) and none (the default)."""
    yaml = pytest.importorskip("yaml")
    root = Path(__file__).parents[2]
    for path in ("crds/replicatedlog.yaml", "helm/rlog-operator/crds/replicatedlog.yaml"):
        crd = yaml.safe_load((root / path).read_text())
        auth = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
            "properties"
        ]["auth"]["properties"]
        for key in ("subjects", "tokens"):
            enum = auth[key]["items"]["properties"]["role"]["enum"]
            assert set(enum) == set(ROLE_GRANTS) - {"peer", "none"}, (path, key)
        # an identity the operator issues: never admin either (authz.CERTIFICATE_ROLES)
        enum = auth["clients"]["items"]["properties"]["role"]["enum"]
        assert set(enum) == CERTIFICATE_ROLES, path


def test_replica_wiring():
    on, off = body(), body(tls={"mode": "disabled"})
    args = specs.security_args(on)
    assert args[args.index("--tls-client-ca") + 1] == "/etc/rlog/tls/client-ca.crt"
    assert args[args.index("--tls-peer-ca") + 1] == "/etc/rlog/tls/peer-ca.crt"
    assert args[args.index("--auth-config") + 1] == "/etc/rlog/auth/roles.json"
    manager = body(tls={"mode": "certManager", "issuerRef": {"name": "corp"}})
    one_issuer = specs.security_args(manager)  # one issuer: peers known by name
    assert "--tls-peer-ca" not in one_issuer
    assert one_issuer[one_issuer.index("--tls-client-ca") + 1] == "/etc/rlog/tls/ca.crt"
    assert specs.security_args(off) == ["--insecure", "--admin-from-anywhere"]
    assert specs.security_volumes(off) == ([], [])
    vols, mounts = specs.security_volumes(on)
    assert {v["secret"]["secretName"] for v in vols} == {"orders-tls", "orders-auth"}
    assert all("subPath" not in m for m in mounts)  # subPath mounts never update
    (ctr,) = specs.statefulset(on, CONFIG)["spec"]["template"]["spec"]["containers"]
    assert ctr["args"][-len(args) :] == args
    env = {e["name"]: e.get("value") for e in ctr["env"]}
    assert env["RLOG_CERT"] == "/etc/rlog/tls/tls.crt"  # the probes' credentials
    assert {m["mountPath"] for m in ctr["volumeMounts"]} >= {"/etc/rlog/tls", "/etc/rlog/auth"}
    (plain,) = specs.statefulset(off, CONFIG)["spec"]["template"]["spec"]["containers"]
    assert "--tls-cert" not in plain["args"] and "RLOG_CERT" not in str(plain["env"])
    assert plain["args"][-2:] == ["--insecure", "--admin-from-anywhere"]
    assert pki.tls_status(on)["transport"] == "mutual-tls"
    assert pki.tls_status(off) == {
        "mode": "disabled",
        "transport": "plaintext",
        "authorization": "off",
    }
