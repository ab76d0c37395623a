"""NetworkPolicies of a log and of the operator, built by pure functions (no I/O).

A log with `spec.networkPolicy` gets one NetworkPolicy selecting its replica pods, ingress
only:

* the gRPC port and the lane's from the log's own pods (the peers: Paxos, catch-up,
  forwarding; the leader's writes);
* the gRPC port and the lane's from `spec.networkPolicy.clients` (NetworkPolicyPeers: pod
  and namespace selectors, ipBlocks): the applications (their appends on the lane);
* the gRPC port from the operator's pods (Status, initialization permits, step-down);
* with `spec.backup`, the gRPC port from the log's archiver pod (it reads and tails the log
  through the client Service);
* the metrics port from `spec.networkPolicy.metrics` (e.g. Prometheus' namespace).

The Admin API shares the gRPC port with the Log API, and a NetworkPolicy cannot tell RPCs
apart: "admin only from the operator" is the Admin API's own check of the caller's identity
(mutual TLS). The policy narrows who can connect at all. Probes are exec probes inside the
pod and need no rule.

The operator's own policy (`operator_network_policy`, rendered by the chart the same way)
admits only its metrics port, from the peers the chart's values name.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from rlog_operator import archive_specs, specs
from rlog_operator import constants as c

Manifest = dict[str, Any]

OPERATOR_LABELS: Mapping[str, str] = {c.LABEL_NAME: "rlog-operator"}
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace (1.22+)


def wanted(body: Mapping[str, Any]) -> bool:
    """A log gets a NetworkPolicy when its spec has a networkPolicy section."""
    return (body.get("spec") or {}).get("networkPolicy") is not None


def name_of(body: Mapping[str, Any]) -> str:
    return specs.name_of(body)


def _port(port: int) -> list[Manifest]:
    return [{"protocol": "TCP", "port": port}]


def operator_peer(operator_namespace: str) -> Manifest:
    """The operator's pods, in its namespace."""
    return {
        "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: operator_namespace}},
        "podSelector": {"matchLabels": dict(OPERATOR_LABELS)},
    }


def log_network_policy(body: Mapping[str, Any], config: specs.OperatorConfig) -> Manifest:
    """The NetworkPolicy of a log (see the module docs)."""
    section = (body.get("spec") or {}).get("networkPolicy") or {}
    clients: Sequence[Manifest] = copy.deepcopy(list(section.get("clients") or []))
    scrapers: Sequence[Manifest] = copy.deepcopy(list(section.get("metrics") or []))
    grpc_from: list[Manifest] = [
        {"podSelector": {"matchLabels": specs.selector_labels(body)}},  # the peers
        operator_peer(config.operator_namespace),
    ]
    if (body.get("spec") or {}).get("backup"):
        grpc_from.append({"podSelector": {"matchLabels": archive_specs.archiver_labels(body)}})
    grpc_from += clients
    ingress: list[Manifest] = [
        {"from": grpc_from, "ports": _port(config.grpc_port)},
        {
            "from": [
                {"podSelector": {"matchLabels": specs.selector_labels(body)}},
                *copy.deepcopy(list(clients)),
            ],
            "ports": _port(specs.lane_port(config)),
        },
    ]
    if scrapers:
        ingress.append({"from": list(scrapers), "ports": _port(config.metrics_port)})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": name_of(body),
            "namespace": specs.namespace_of(body),
            "labels": specs.labels(body),
        },
        "spec": {
            "podSelector": {"matchLabels": specs.selector_labels(body)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def for_log(body: Mapping[str, Any], config: specs.OperatorConfig) -> list[Manifest]:
    """The NetworkPolicy a log owns ([] without spec.networkPolicy), applied before its
    other objects so that no replica pod runs unprotected."""
    return [log_network_policy(body, config)] if wanted(body) else []


def operator_network_policy(
    name: str,
    namespace: str,
    pod_labels: Mapping[str, str],
    metrics_port: int,
    metrics_from: Sequence[Manifest],
) -> Manifest:
    """The operator's NetworkPolicy: nothing comes in but metrics scrapes from
    `metrics_from` (the liveness probe is the kubelet's, from the node)."""
    ingress: list[Manifest] = []
    if metrics_from:
        ingress.append({"from": [dict(p) for p in metrics_from], "ports": _port(metrics_port)})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "podSelector": {"matchLabels": dict(pod_labels)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
