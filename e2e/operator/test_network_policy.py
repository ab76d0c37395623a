"""A log's NetworkPolicy on a real Kubernetes (conftest.py). For the lead to run.

The local cluster (e2e/cluster/up.sh) uses the reference CNI plugins (bridge, host-local,
firewall, portmap), which do not enforce NetworkPolicies: there the tests check the object,
that the log keeps serving under it (peers and operator admitted), and that an admitted
client connects; the denial test runs only with E2E_CNI_ENFORCES_POLICIES=1 (a cluster with
an enforcing plugin, e.g. kind with Calico or Cilium).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from e2elib import Kubectl, wait_until
from oplib import REPLICA_IMAGE, Log

NAME = "netpol-log"
ENFORCED = os.environ.get("E2E_CNI_ENFORCES_POLICIES") == "1"

MANIFEST = f"""
apiVersion: rlog.io/v1alpha1
kind: ReplicatedLog
metadata:
  name: {NAME}
spec:
  replicas: 3
  storage:
    size: 64Mi
  networkPolicy:
    clients:
      - podSelector:
          matchLabels:
            rlog-client: "{NAME}"
"""


def _client_pod(k: Kubectl, name: str, labels: dict[str, str]) -> None:
    label_lines = "".join(f'\n    {key}: "{value}"' for key, value in labels.items())
    k.apply(
        f"""
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels:{label_lines or " {}"}
spec:
  restartPolicy: Never
  securityContext:
    runAsNonRoot: true
    runAsUser: 10001
    seccompProfile: {{type: RuntimeDefault}}
  containers:
    - name: client
      image: {REPLICA_IMAGE}
      imagePullPolicy: IfNotPresent
      command: ["sleep", "3600"]
      securityContext:
        allowPrivilegeEscalation: false
        capabilities: {{drop: ["ALL"]}}
      # the log is mutual TLS (the default): the client presents the operator's certificate,
      # so what decides whether it gets through is the network, not a failed handshake
      env:
        - {{name: RLOG_CA, value: /etc/rlog/tls/ca.crt}}
        - {{name: RLOG_CERT, value: /etc/rlog/tls/tls.crt}}
        - {{name: RLOG_KEY, value: /etc/rlog/tls/tls.key}}
      volumeMounts: [{{name: tls, mountPath: /etc/rlog/tls}}]
  volumes:
    - name: tls
      secret: {{secretName: {NAME}-tls-operator}}
"""
    )
    k("wait", "--for=condition=Ready", f"pod/{name}", "--timeout=120s", timeout=150)


def _status_from(k: Kubectl, pod: str) -> bool:
    out = k.run(
        "exec", pod, "--", "rlog", "status", "--endpoint", f"{NAME}:7000", "--timeout", "5",
        check=False, timeout=60,
    )  # fmt: skip
    return out.returncode == 0


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    k = Kubectl(namespace)
    log = Log(k, NAME)
    k.apply(MANIFEST)
    try:
        log.wait_ready("every replica VOTING under its NetworkPolicy")
        yield log
    finally:
        k.run("delete", "pod", "allowed-client", "denied-client", "--wait=false", check=False)
        k.run("delete", "replicatedlogs", NAME, "--wait=true", check=False, timeout=180)


def test_the_log_owns_its_policy(log: Log, operator: str) -> None:
    policy = log.k.json("get", "networkpolicy", NAME)
    owners = policy["metadata"].get("ownerReferences") or []
    assert [o["kind"] for o in owners] == ["ReplicatedLog"], owners
    (grpc,) = policy["spec"]["ingress"]
    assert grpc["ports"] == [{"protocol": "TCP", "port": 7000}]
    peers, op, client = grpc["from"]
    assert peers["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == NAME
    assert op["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == operator
    assert client == {"podSelector": {"matchLabels": {"rlog-client": NAME}}}


def test_an_admitted_client_connects(log: Log) -> None:
    _client_pod(log.k, "allowed-client", {"rlog-client": NAME})
    wait_until(
        "the admitted client reaches the log", lambda: _status_from(log.k, "allowed-client"), 60, 2
    )
    assert log.all_voting()  # peers and the operator still get through


@pytest.mark.skipif(not ENFORCED, reason="the cluster's CNI does not enforce NetworkPolicies")
def test_any_other_pod_is_refused(log: Log) -> None:
    _client_pod(log.k, "denied-client", {})
    assert not _status_from(log.k, "denied-client")
