"""TLS and roles under the operator (docs/security.md), end to end on a real Kubernetes.

Run: .venv/bin/python -m pytest e2e/operator/test_tls.py -v (after `make images`).

- a new log is mutual TLS by default: its Secrets exist, its status says so, the replicas
  say so, and the rlog CLI in a replica pod works (it presents the replica's certificate
  through RLOG_CA/RLOG_CERT/RLOG_KEY) while a plaintext client and a client without a
  certificate are refused;
- a renewed certificate (the Secret deleted: the operator issues a new one) is taken by the
  replicas without a restart while appends go on;
- `spec.tls.mode: disabled` is plaintext, and says so.
"""

from __future__ import annotations

import json
import time

import pytest
from e2elib import Kubectl, wait_until
from oplib import PORT, Log, delete_logs, manifest

NAME = "e2e-tls"
PLAIN = "e2e-plain"


@pytest.fixture(scope="module")
def log(operator: str, namespace: str):
    k = Kubectl(namespace)
    k.apply(manifest(NAME))
    log = Log(k, NAME)
    log.wait_ready("every replica VOTING with mutual TLS")
    yield log
    delete_logs(k, NAME)


def test_a_new_log_is_mutual_tls(log: Log) -> None:
    status = log.status()
    assert status.get("tls") == {
        "mode": "operator",
        "transport": "mutual-tls",
        "authorization": "roles",
    }, status
    for secret in (f"{NAME}-tls-ca", f"{NAME}-tls", f"{NAME}-tls-operator", f"{NAME}-auth"):
        assert log.k.run("get", "secret", secret, check=False).returncode == 0, secret
    for pod in log.pods:
        replica = log.replica_status(pod)
        assert replica["transport"] == "mutual-tls" and replica["authorization"] == "roles"
    log.rlog(log.pods[0], "append", "--endpoint", log.service, "over-tls")
    values = [v for _, v in log.entries(log.pods[1], endpoint=log.service, stale=False)]
    assert "over-tls" in values


def test_plaintext_and_certificateless_clients_are_refused(log: Log) -> None:
    pod = log.pods[0]
    base = ["exec", pod, "-c", "replica", "--", "env"]
    plain = log.k.run(
        *base, "-u", "RLOG_CA", "-u", "RLOG_CERT", "-u", "RLOG_KEY",
        "rlog", "status", "--endpoint", f"127.0.0.1:{PORT}", "--timeout", "5",
        check=False,
    )  # fmt: skip
    assert plain.returncode != 0
    no_cert = log.k.run(
        *base, "-u", "RLOG_CERT", "-u", "RLOG_KEY",
        "rlog", "status", "--endpoint", f"127.0.0.1:{PORT}", "--timeout", "5",
        check=False,
    )  # fmt: skip
    assert no_cert.returncode != 0


def test_renewed_certificate_is_taken_without_restart(log: Log) -> None:
    uids = log.pod_uids()
    before = log.k.json("get", "secret", f"{NAME}-tls")["data"]["tls.crt"]
    log.k("delete", "secret", f"{NAME}-tls")
    wait_until(
        "the operator issues the replicas' certificate again",
        lambda: log.k.run("get", "secret", f"{NAME}-tls", check=False).returncode == 0,
        60,
        2,
    )
    after = log.k.json("get", "secret", f"{NAME}-tls")["data"]["tls.crt"]
    assert after != before
    appended = 0
    deadline = time.monotonic() + 240  # the kubelet refreshes Secret volumes within minutes

    def reloaded_everywhere() -> bool:
        nonlocal appended
        log.rlog(log.pods[0], "append", "--endpoint", log.service, f"renewal-{appended}")
        appended += 1
        logs = [log.k("logs", pod, "-c", "replica") for pod in log.pods]
        return all("reloaded the TLS certificate" in text for text in logs)

    while not reloaded_everywhere():
        assert time.monotonic() < deadline, "a replica never reloaded its certificate"
        time.sleep(5)
    assert log.pod_uids() == uids  # no pod was replaced
    values = [v for _, v in log.entries(log.pods[2], endpoint=log.service, stale=False)]
    assert all(f"renewal-{i}" in values for i in range(appended))


def test_disabled_is_plaintext_and_says_so(operator: str, namespace: str) -> None:
    k = Kubectl(namespace)
    k.apply(manifest(PLAIN) + "  tls:\n    mode: disabled\n")
    plain = Log(k, PLAIN)
    try:
        plain.wait_ready("a plaintext log VOTING")
        assert plain.status().get("tls", {}).get("transport") == "plaintext"
        replica = json.loads(
            plain.rlog(plain.pods[0], "status", "--endpoint", f"127.0.0.1:{PORT}", "--json")
        )
        assert replica["transport"] == "plaintext" and replica["authorization"] == "off"
    finally:
        delete_logs(k, PLAIN)
