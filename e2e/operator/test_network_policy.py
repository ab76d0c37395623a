"""A log's NetworkPolicy on a real Kubernetes (conftest.py).

The local cluster (e2e/cluster/up.sh) wires pods with the reference bridge plugin, which
enforces nothing, and runs kube-router as its NetworkPolicy agent (a DaemonSet labelled
rlog.io/network-policy-agent=true, docs/local-cluster.md). Where that agent is Ready, the
denial tests run: pods the policy does not name are refused at the network, while the
peers, the operator and the admitted client get through. E2E_CNI_ENFORCES_POLICIES=1 says
so for a cluster with another enforcing plugin (kind with Calico or Cilium), =0 skips them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from e2elib import Kubectl, delete_and_wait, wait_until
from oplib import REPLICA_IMAGE, Log, delete_logs

NAME = "netpol-log"
AGENT_LABEL = "rlog.io/network-policy-agent=true"

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


def _enforced(cluster: Kubectl) -> bool:
    """Whether the cluster enforces NetworkPolicies: the environment says so, or the local
    cluster's agent runs. An agent that is there but not Ready fails the test: a silent skip
    would hide that the policies are not enforced."""
    said = os.environ.get("E2E_CNI_ENFORCES_POLICIES")
    if said in ("0", "1"):
        return said == "1"
    agents = cluster.json("get", "daemonsets", "-A", "-l", AGENT_LABEL, namespaced=False)["items"]
    for ds in agents:
        st = ds.get("status") or {}
        want = st.get("desiredNumberScheduled", 0)
        if not want or st.get("numberReady", 0) < want:
            name = f"{ds['metadata']['namespace']}/{ds['metadata']['name']}"
            pytest.fail(f"the NetworkPolicy agent {name} is not Ready: {st}")
    return bool(agents)


@pytest.fixture(scope="module")
def enforced(cluster: Kubectl) -> None:
    if not _enforced(cluster):
        pytest.skip("the cluster does not enforce NetworkPolicies (no agent found)")


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    k = Kubectl(namespace)
    log = Log(k, NAME)
    k.apply(MANIFEST)
    try:
        log.wait_ready("every replica VOTING under its NetworkPolicy")
        yield log
    finally:
        k.run("delete", "pod", "allowed-client", *DENIED, "--wait=false", check=False)
        delete_logs(k, NAME)


def test_the_log_owns_its_policy(log: Log, operator: str) -> None:
    policy = log.k.json("get", "networkpolicy", NAME)
    owners = policy["metadata"].get("ownerReferences") or []
    assert [o["kind"] for o in owners] == ["ReplicatedLog"], owners
    grpc, lane = policy["spec"]["ingress"]
    assert grpc["ports"] == [{"protocol": "TCP", "port": 7000}]
    # the lane (the leader's writes, clients' appends): the log's own pods and the clients
    assert lane["ports"] == [{"protocol": "TCP", "port": 7001}]
    lane_peers, lane_client = lane["from"]
    assert lane_peers["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == NAME
    assert lane_client == {"podSelector": {"matchLabels": {"rlog-client": NAME}}}
    peers, op, client = grpc["from"]
    assert peers["podSelector"]["matchLabels"]["app.kubernetes.io/instance"] == NAME
    assert op["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == operator
    assert client == {"podSelector": {"matchLabels": {"rlog-client": NAME}}}


@pytest.fixture(scope="module")
def allowed_client(log: Log) -> str:
    """A pod that the log's `clients` selector names."""
    _client_pod(log.k, "allowed-client", {"rlog-client": NAME})
    return "allowed-client"


def test_an_admitted_client_connects(log: Log, allowed_client: str) -> None:
    wait_until(
        "the admitted client reaches the log", lambda: _status_from(log.k, allowed_client), 60, 2
    )
    assert log.all_voting()  # peers and the operator still get through


# Pods the policy does not name, each with the operator's client certificate (so only the
# network can refuse them), in the log's namespace: one with no labels, and one that wears
# the operator's label outside the operator's namespace.
DENIED = {
    "denied-client": {},
    "fake-operator": {"app.kubernetes.io/name": "rlog-operator"},
}


@pytest.mark.parametrize("pod", sorted(DENIED))
def test_pods_the_policy_does_not_name_are_refused(
    log: Log, allowed_client: str, enforced: None, pod: str
) -> None:
    _client_pod(log.k, pod, DENIED[pod])
    # the admitted client, with the same image and certificate, gets through at this moment
    wait_until("the admitted client reaches the log", lambda: _status_from(log.k, allowed_client))
    assert not _status_from(log.k, pod)
    assert log.all_voting()  # the peers and the operator still get through


# What someone may delete by hand (the log's NetworkPolicy, its client Service and its
# PodDisruptionBudget): the operator's observe timer sees each gone from its watch and
# creates it again from the spec (rlog_operator/children.py).
DELETED_BY_HAND = [("networkpolicy", NAME), ("service", NAME), ("poddisruptionbudget", NAME)]


def _uid(k: Kubectl, kind: str, name: str) -> str | None:
    out = k.run("get", kind, name, "-o", "jsonpath={.metadata.uid}", check=False)
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def test_deleted_children_are_created_again(log: Log) -> None:
    before = {(kind, name): _uid(log.k, kind, name) for kind, name in DELETED_BY_HAND}
    assert all(before.values()), before
    for kind, name in DELETED_BY_HAND:
        delete_and_wait(log.k, kind, name)
    for kind, name in DELETED_BY_HAND:
        uid = wait_until(
            f"{kind} {name} created again", lambda kind=kind, name=name: _uid(log.k, kind, name)
        )
        assert uid != before[(kind, name)], f"{kind} {name} was not deleted"
        owners = log.k.json("get", kind, name)["metadata"].get("ownerReferences") or []
        assert [o["kind"] for o in owners] == ["ReplicatedLog"], owners
    events = log.k.json(
        "get", "events", "--field-selector", f"involvedObject.name={NAME},reason=RecreatedChild"
    )["items"]
    said = " ".join(e["message"] for e in events)
    for kind, name in (("NetworkPolicy", NAME), ("Service", NAME), ("PodDisruptionBudget", NAME)):
        assert f"{kind} {name} was deleted: created it again" in said, said
    assert log.all_voting()


def test_the_policy_goes_when_the_spec_no_longer_asks_for_it(log: Log) -> None:
    """Last in this module: it removes spec.networkPolicy."""
    assert _uid(log.k, "networkpolicy", NAME)
    log.k(
        "patch", "replicatedlog", NAME, "--type=json",
        "-p", '[{"op": "remove", "path": "/spec/networkPolicy"}]',
    )  # fmt: skip
    wait_until("the policy deleted", lambda: _uid(log.k, "networkpolicy", NAME) is None)
    events = log.k.json(
        "get", "events", "--field-selector", f"involvedObject.name={NAME},reason=DeletedChild"
    )["items"]
    said = " ".join(e["message"] for e in events)
    assert f"NetworkPolicy {NAME} is no longer in the spec: deleted it" in said, said
    assert _uid(log.k, "service", NAME) and _uid(log.k, "poddisruptionbudget", NAME)
    assert log.all_voting()
