"""NetworkPolicies of a log and of the operator (rlog_operator.netpol): pure builders, and
the chart's operator policy is the builder's."""

from __future__ import annotations

import pytest
from toolchain import find_or_build_helm, helm_template

from rlog_operator import netpol, specs

CONFIG = specs.OperatorConfig(operator_namespace="rlog-system")
APPS = {"namespaceSelector": {"matchLabels": {"team": "shop"}}}
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def body(**spec):
    return {
        "metadata": {"name": "orders", "namespace": "shop", "uid": "u"},
        "spec": {"replicas": 3, "storage": {"size": "1Gi"}, **spec},
    }


def test_no_policy_without_the_spec_section():
    assert netpol.for_log(body(), CONFIG) == []


def test_the_log_policy_admits_peers_operator_and_clients_on_grpc_and_the_lane():
    (policy,) = netpol.for_log(body(networkPolicy={"clients": [APPS]}), CONFIG)
    assert policy["kind"] == "NetworkPolicy"
    assert policy["metadata"]["namespace"] == "shop"
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"] == specs.selector_labels(body())
    assert spec["policyTypes"] == ["Ingress"]
    grpc, lane = spec["ingress"]  # no metrics scrapers named: no metrics rule
    assert grpc["ports"] == [{"protocol": "TCP", "port": CONFIG.grpc_port}]
    # The lane: the log's own pods (the leader's writes) and the clients (their appends),
    # never the operator (it makes no appends).
    assert lane == {
        "from": [{"podSelector": {"matchLabels": specs.selector_labels(body())}}, APPS],
        "ports": [{"protocol": "TCP", "port": CONFIG.grpc_port + 1}],
    }
    peers, operator, clients = grpc["from"]
    assert peers == {"podSelector": {"matchLabels": specs.selector_labels(body())}}
    assert operator["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "rlog-system"
    }
    assert operator["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "rlog-operator"}
    assert clients == APPS and clients is not APPS  # copied, never aliased


def test_metrics_scrapers_get_the_metrics_port_only():
    (policy,) = netpol.for_log(body(networkPolicy={"metrics": [PROMETHEUS]}), CONFIG)
    grpc, _lane, metrics = policy["spec"]["ingress"]
    assert len(grpc["from"]) == 2  # peers and operator: no clients named, none admitted
    assert metrics == {"from": [PROMETHEUS], "ports": [{"protocol": "TCP", "port": 9100}]}


def test_an_empty_section_admits_only_peers_and_operator():
    (policy,) = netpol.for_log(body(networkPolicy={}), CONFIG)
    grpc, lane = policy["spec"]["ingress"]
    assert len(grpc["from"]) == 2
    assert len(lane["from"]) == 1


def test_a_log_with_backup_admits_its_archiver_before_the_clients():
    backup = {"bucket": "b", "credentialsSecret": "s3"}
    (policy,) = netpol.for_log(body(backup=backup, networkPolicy={"clients": [APPS]}), CONFIG)
    grpc, _lane = policy["spec"]["ingress"]
    _peers, _operator, archiver, clients = grpc["from"]
    (deployment,) = [
        o for o in specs.desired_objects(body(backup=backup), CONFIG) if o["kind"] == "Deployment"
    ]
    archiver_pods = deployment["spec"]["template"]["metadata"]["labels"]
    selector = archiver["podSelector"]["matchLabels"]
    assert selector.items() <= archiver_pods.items()  # the archiver's pods are admitted
    assert not selector.items() <= specs.labels(body()).items()  # and not only the replicas
    assert clients == APPS


def test_the_operator_namespace_comes_from_the_environment():
    config = specs.OperatorConfig.from_env({"RLOG_OPERATOR_NAMESPACE": "ops"})
    (policy,) = netpol.for_log(body(networkPolicy={}), config)
    operator = policy["spec"]["ingress"][0]["from"][1]
    assert operator["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] == "ops"


@pytest.fixture(scope="module")
def helm() -> str:
    return find_or_build_helm()


def test_the_charts_operator_policy_is_the_builders(helm: str) -> None:
    docs = helm_template(
        helm,
        "t",
        "--set", "networkPolicy.enabled=true",
        "--set", "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=obs",
    )  # fmt: skip
    (rendered,) = [d for d in docs if d["kind"] == "NetworkPolicy"]
    expected = netpol.operator_network_policy(
        "t-rlog-operator",
        "default",
        {"app.kubernetes.io/name": "rlog-operator", "app.kubernetes.io/instance": "t"},
        8080,
        [{"namespaceSelector": {"matchLabels": {"team": "obs"}}}],
    )
    assert rendered == expected
    closed = [d for d in helm_template(helm, "t", "--set", "networkPolicy.enabled=true")
              if d["kind"] == "NetworkPolicy"]  # fmt: skip
    assert closed[0]["spec"]["ingress"] == []
    assert not [d for d in helm_template(helm, "t") if d["kind"] == "NetworkPolicy"]
