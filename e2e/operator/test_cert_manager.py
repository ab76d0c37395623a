"""A log whose certificates come from cert-manager (`spec.tls.mode: certManager`,
docs/security.md), end to end on a real Kubernetes with a real cert-manager.

Run: `make e2e-cert-manager` (builds cert-manager from the Go module proxy, installs it with
e2e/certmanager/certmanager.sh, then runs this file). Skipped when cert-manager is not on
the cluster.

- cert-manager's admission webhook answers (the cainjector gave the API server its CA): it
  refuses an Issuer that names no way of issuing;
- a self-signed Issuer makes a CA, a CA Issuer signs with it; a log naming the CA Issuer in
  `spec.tls.issuerRef` gets Ready with every replica VOTING, and every replica serves the
  certificate cert-manager wrote into `<log>-tls` (same serial, signed by that CA, as a
  client sees it in a TLS handshake); the operator's client identity (`<log>-tls-operator`)
  comes from the same Issuer (the operator asks for it; with an operator image from before
  it did, the test issues it as a user had to);
- a client certificate of the same Issuer (its name given role append in `spec.auth`)
  appends and reads through mutual TLS from outside the cluster (a port-forward);
- a renewal forced the way `cmctl renew` does it (the Certificate's Issuing condition) gives
  a new key and serial, which every replica serves to new handshakes without a restart.
"""

from __future__ import annotations

import base64
import datetime
import json
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from cryptography import x509
from e2elib import Kubectl, wait_until
from oplib import (
    Log,
    client_files,
    delete_logs,
    exists,
    manifest,
    port_forward,
    secret_data,
)

NAME = "e2e-cm"
SELF_SIGNED = "e2e-cm-selfsigned"
CA_ISSUER = "e2e-cm-ca"
CA_SECRET = "e2e-cm-ca"
WRITER = "e2e-cm-writer"
CM_NAMESPACE = "cert-manager"

pytestmark = pytest.mark.cert_manager
IDENTITY: dict[str, str] = {}  # who created the operator's identity Certificate


def _certificate(name: str, common_name: str, issuer: str, *extra: str) -> str:
    lines = "\n".join(f"  {line}" for line in extra)
    return f"""
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: {name}
spec:
  secretName: {name}
  commonName: {common_name}
  duration: 2160h
  privateKey: {{algorithm: ECDSA, size: 256, rotationPolicy: Always}}
  issuerRef: {{name: {issuer}, kind: Issuer, group: cert-manager.io}}
{lines}
"""


def _installed(cluster: Kubectl) -> str | None:
    """None when cert-manager answers on the cluster, else why not."""
    crd = cluster.run("get", "crd", "certificates.cert-manager.io", check=False, namespaced=False)
    if crd.returncode != 0:
        return "cert-manager is not installed (make e2e-cert-manager installs it)"
    webhook = cluster.run(
        "-n", CM_NAMESPACE, "wait", "deployment/cert-manager-webhook",
        "--for=condition=Available", "--timeout=60s", check=False, namespaced=False,
    )  # fmt: skip
    if webhook.returncode != 0:
        return f"cert-manager's webhook is not available: {webhook.stderr.strip()}"
    return None


def _serial(pem: bytes) -> int:
    return x509.load_pem_x509_certificate(pem).serial_number


@pytest.fixture(scope="module")
def pki(cluster: Kubectl, namespace: str, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A self-signed Issuer, the CA it signs, and the CA Issuer of that CA; the CA's
    certificate on disk."""
    why = _installed(cluster)
    if why:
        pytest.skip(why)
    k = Kubectl(namespace)
    k.apply(f"""
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: {SELF_SIGNED}
spec:
  selfSigned: {{}}
---
{_certificate(CA_SECRET, "rlog e2e cert-manager CA", SELF_SIGNED, "isCA: true")}
---
apiVersion: cert-manager.io/v1
kind: Issuer
metadata:
  name: {CA_ISSUER}
spec:
  ca: {{secretName: {CA_SECRET}}}
""")
    k("wait", f"issuer/{CA_ISSUER}", "--for=condition=Ready", "--timeout=180s", timeout=200)
    ca = secret_data(k, CA_SECRET)["tls.crt"]
    ca_path = tmp_path_factory.mktemp("cm-ca") / "ca.crt"
    ca_path.write_bytes(ca)
    return {"ca": ca, "ca_path": str(ca_path)}


@pytest.fixture(scope="module")
def log(operator: str, namespace: str, pki: dict) -> Iterator[Log]:
    k = Kubectl(namespace)
    # A writer's client identity from the same Issuer; spec.auth gives its name a role.
    k.apply(_certificate(WRITER, WRITER, CA_ISSUER, "usages: [client auth]"))
    k.apply(
        manifest(NAME)
        + f"""  tls:
    mode: certManager
    issuerRef: {{name: {CA_ISSUER}, kind: Issuer}}
  auth:
    subjects:
      - {{name: {WRITER}, role: append}}
"""
    )
    wait_until(
        "the operator to ask cert-manager for the replicas' certificate",
        lambda: exists(k, "certificate", f"{NAME}-tls"),
        120,
        2,
    )
    operator_cert = f"{NAME}-tls-operator"
    try:  # the operator asks for its own identity right after the replicas' certificate
        wait_until(
            "the operator's own Certificate", lambda: exists(k, "certificate", operator_cert), 20
        )
        IDENTITY["by"] = "operator"
    except AssertionError:
        # An operator image from before pki.certificate_requests: there the user issued the
        # operator's identity, as this does.
        k.apply(_certificate(operator_cert, "rlog-operator", CA_ISSUER, "usages: [client auth]"))
        IDENTITY["by"] = "test"
    print(f"the operator's identity Certificate was created by the {IDENTITY['by']}")
    log = Log(k, NAME)
    log.wait_ready("every replica VOTING with cert-manager's certificate", timeout=420)
    yield log
    delete_logs(k, NAME)


def _served(port: int, client: dict[str, str]) -> x509.Certificate:
    """The certificate a replica presents to a new TLS handshake on 127.0.0.1:port, checked
    against the client's CA (the handshake fails otherwise) and the name localhost."""
    ctx = ssl.create_default_context(cafile=client["RLOG_CA"])
    ctx.load_cert_chain(client["RLOG_CERT"], client["RLOG_KEY"])
    ctx.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def _served_by_every_replica(log: Log, client: dict[str, str]) -> dict[str, x509.Certificate]:
    served = {}
    for pod in log.pods:
        with port_forward(log.k, f"pod/{pod}") as forward:
            served[pod] = wait_until(
                f"a TLS handshake with {pod}",
                lambda port=forward.port: _served(port, client),
                30,
                1,
            )
    return served


def _rlog(endpoint: str, env: dict[str, str], *args: str) -> str:
    p = subprocess.run(
        [sys.executable, "-m", "rlog.tools.cli", *args, "--endpoint", endpoint],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
    )
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout


def _restarts(log: Log) -> dict[str, tuple[str, int]]:
    pods = log.k.json("get", "pods", "-l", f"app.kubernetes.io/instance={log.name}")["items"]
    return {
        p["metadata"]["name"]: (
            p["metadata"]["uid"],
            sum(s.get("restartCount", 0) for s in p["status"].get("containerStatuses") or []),
        )
        for p in pods
    }


def test_webhook_refuses_an_issuer_without_a_kind_of_issuing(cluster: Kubectl, pki: dict) -> None:
    out = cluster.run(
        "create", "--dry-run=server", "-f", "-", check=False, namespaced=False,
        input="apiVersion: cert-manager.io/v1\nkind: Issuer\n"
        "metadata: {name: e2e-cm-empty, namespace: default}\nspec: {}\n",
    )  # fmt: skip
    assert out.returncode != 0
    assert "webhook.cert-manager.io" in out.stderr, out.stderr


def test_replicas_serve_the_certificate_cert_manager_issued(log: Log, pki: dict, tmp_path) -> None:
    assert log.status().get("tls", {}).get("mode") == "certManager"
    cert = log.k.json("get", "certificate", f"{NAME}-tls")
    assert cert["spec"]["issuerRef"]["name"] == CA_ISSUER
    assert any(
        c["type"] == "Ready" and c["status"] == "True" for c in cert["status"]["conditions"]
    ), cert["status"]
    secret = secret_data(log.k, f"{NAME}-tls")
    assert secret["ca.crt"] == pki["ca"]  # cert-manager's CA Issuer names its CA
    issued = x509.load_pem_x509_certificate(secret["tls.crt"])
    ca = x509.load_pem_x509_certificate(pki["ca"])
    assert issued.issuer == ca.subject
    issued.verify_directly_issued_by(ca)
    client = client_files(log.k, WRITER, str(tmp_path))
    for pod, served in _served_by_every_replica(log, client).items():
        assert served.serial_number == issued.serial_number, pod
        assert served.issuer == ca.subject, pod
    for pod in log.pods:
        replica = log.replica_status(pod)
        assert replica["transport"] == "mutual-tls" and replica["authorization"] == "roles"
    # The operator's own identity (role admin) comes from the same CA.
    mine = x509.load_pem_x509_certificate(secret_data(log.k, f"{NAME}-tls-operator")["tls.crt"])
    mine.verify_directly_issued_by(ca)
    assert mine.subject.rfc4514_string() == "CN=rlog-operator"


def test_a_client_certificate_of_the_issuer_appends_and_reads(log: Log, tmp_path) -> None:
    env = client_files(log.k, WRITER, str(tmp_path))
    values = [f"cert-manager-{i}" for i in range(5)]
    with port_forward(log.k, f"svc/{NAME}") as forward:
        endpoint = forward.endpoint
        for value in values:
            _rlog(endpoint, env, "append", value)
        out = _rlog(endpoint, env, "read", "--json")
    read = [base64.b64decode(json.loads(line)["value"]).decode() for line in out.splitlines()]
    assert read[-len(values) :] == values


def test_a_forced_renewal_is_served_without_a_restart(log: Log, tmp_path) -> None:
    before = _restarts(log)
    old = _serial(secret_data(log.k, f"{NAME}-tls")["tls.crt"])
    # What `cmctl renew` does: the Issuing condition, set on the status.
    cert = log.k.json("get", "certificate", f"{NAME}-tls")
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [c for c in cert["status"].get("conditions") or [] if c["type"] != "Issuing"]
    conditions.append(
        {
            "type": "Issuing",
            "status": "True",
            "reason": "ManuallyTriggered",
            "message": "renewal forced by the e2e test",
            "lastTransitionTime": now,
        }
    )
    log.k(
        "patch", "certificate", f"{NAME}-tls", "--subresource=status", "--type=merge",
        "-p", json.dumps({"status": {"conditions": conditions}}),
    )  # fmt: skip
    new = wait_until(
        "cert-manager to write a new certificate",
        lambda: (s := _serial(secret_data(log.k, f"{NAME}-tls")["tls.crt"])) != old and s,
        120,
        2,
    )
    client = client_files(log.k, WRITER, str(tmp_path))
    # The kubelet refreshes a Secret volume within its sync period (about a minute), then
    # each replica reloads the files at its next handshake check.
    deadline = time.monotonic() + 240
    while True:
        served = {p: c.serial_number for p, c in _served_by_every_replica(log, client).items()}
        if all(s == new for s in served.values()):
            break
        assert time.monotonic() < deadline, f"replicas still serve {served}, want {new}"
        time.sleep(5)
    assert _restarts(log) == before  # same pods, no container restarted
    with port_forward(log.k, f"svc/{NAME}") as forward:
        _rlog(forward.endpoint, client_files(log.k, WRITER, str(tmp_path)), "append", "after")
    if not log.all_voting():  # the status is the operator's last look: it may lag a tick
        print(f"status right after the renewal: {json.dumps(log.status())}")
        log.wait_ready("every replica VOTING after the renewal", timeout=60)
