"""The Helm chart: lints, renders, ships the same CRD as crds/, and its RBAC covers what the
handlers call."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from toolchain import ALL_ON, CHART, KUBE_VERSION, find_or_build_helm, helm_template

from rlog import __version__
from rlog.version import semver
from rlog_operator.specs import OperatorConfig

ROOT = Path(__file__).resolve().parents[2]
# the operator's modules, whose kubernetes-client calls the chart must grant (not the CLI
# plugin, rlog_operator.plugin, which runs with the user's own credentials)
CALLERS = sorted((ROOT / "operator" / "rlog_operator").glob("*.py"))  # not plugin/


@pytest.fixture(scope="module")
def helm() -> str:
    """helm from PATH or the cluster cache, else built (tests/toolchain.py): never skipped."""
    return find_or_build_helm()


# kubernetes-client method stem -> (api group, resource); verbs: read->get, others as named.
RESOURCES = {
    "pod": ("", "pods"),
    "persistent_volume_claim": ("", "persistentvolumeclaims"),
    "persistent_volume": ("", "persistentvolumes"),
    "stateful_set": ("apps", "statefulsets"),
    "deployment": ("apps", "deployments"),
    "service": ("", "services"),
    "pod_disruption_budget": ("policy", "poddisruptionbudgets"),
    "secret": ("", "secrets"),
    "custom_object": ("cert-manager.io", "certificates"),
    "lease": ("coordination.k8s.io", "leases"),
    "storage_class": ("storage.k8s.io", "storageclasses"),
    "network_policy": ("networking.k8s.io", "networkpolicies"),
}
VERBS = {"read": "get", "replace": "update"}  # client method prefix -> RBAC verb
# what kopf itself does for the ReplicatedLog handlers: list and watch the CRs, patch them
# (finalizer, progress) and their status, post Events
KOPF_CR_CALLS = [
    ("rlog.io", "replicatedlogs", "list"),
    ("rlog.io", "replicatedlogs", "watch"),
    ("rlog.io", "replicatedlogs", "patch"),
    ("rlog.io", "replicatedlogs/status", "patch"),
    ("", "events", "create"),
]
CLUSTER_SCOPED = {"persistentvolumes", "storageclasses", "nodes"}
# kube.apply_one creates or patches every kind desired_objects builds
APPLIED = ["stateful_set", "deployment", "service", "pod_disruption_budget", "network_policy"]


def _render(helm: str, *args: str) -> list[dict[str, Any]]:
    return helm_template(helm, "t", *args)


def test_helm_lint_is_clean(helm: str) -> None:
    for extra in ([], ALL_ON):
        out = subprocess.run(
            [helm, "lint", "--strict", str(CHART), *extra],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "[WARNING]" not in out.stdout and "[ERROR]" not in out.stdout, out.stdout


def test_chart_crd_is_the_repository_crd() -> None:
    chart_crds = sorted(p.name for p in (CHART / "crds").iterdir())
    repo_crds = sorted(p.name for p in (ROOT / "crds").iterdir())
    assert chart_crds == repo_crds
    for name in repo_crds:
        assert (CHART / "crds" / name).read_bytes() == (ROOT / "crds" / name).read_bytes(), (
            f"helm/rlog-operator/crds/{name} differs from crds/{name}: copy it again"
        )


def test_the_chart_and_its_images_carry_the_project_version(helm: str) -> None:
    """One source (rlog.__version__, docs/upgrades.md "Versions"): the chart's version and
    appVersion are its SemVer spelling (Helm requires SemVer 2), and by default the
    operator's and the replicas' images are tagged with that; a tag given wins (a local
    build's `dev`)."""
    version = semver(__version__)
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["version"] == version, f"helm/rlog-operator/Chart.yaml's version: {version}"
    assert chart["appVersion"] == version, f"Chart.yaml's appVersion: {version!r}"

    def images(*args: str) -> tuple[str, str]:
        dep = next(d for d in _render(helm, *args) if d["kind"] == "Deployment")
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        return container["image"], env["RLOG_REPLICA_IMAGE"]

    assert images() == (
        f"docker.io/rlog/rlog-operator:{version}",
        f"docker.io/rlog/rlog-replica:{version}",
    )
    # the operator without the chart (no RLOG_REPLICA_IMAGE) runs the same replica image
    assert OperatorConfig().replica_image == f"docker.io/rlog/rlog-replica:{version}"
    assert images("--set", "image.tag=dev", "--set", "replicaImage.tag=dev") == (
        "docker.io/rlog/rlog-operator:dev",
        "docker.io/rlog/rlog-replica:dev",
    )


def test_toggles_render_the_monitoring_objects(helm: str) -> None:
    kinds = {d["kind"] for d in _render(helm)}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"} <= kinds
    assert not kinds & {"PrometheusRule", "ServiceMonitor", "PodMonitor"}
    docs = _render(helm, *ALL_ON)
    kinds = {d["kind"] for d in docs}
    assert {"PrometheusRule", "ServiceMonitor", "PodMonitor", "ConfigMap", "Service"} <= kinds
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    for name in (
        "NoQuorum",
        "NoLeader",
        "ReplicaNotVoting",
        "DataLoss",
        "RollingUpdateStuck",
        "ReplicaNodeLost",
    ):
        assert any(a.endswith(name) for a in alerts), name
    not_voting = next(
        r for g in rule["spec"]["groups"] for r in g["rules"] if r["alert"].endswith("NotVoting")
    )
    assert not_voting["for"] == "10m"


def test_deployment_is_restricted_with_a_liveness_probe(helm: str) -> None:
    dep = next(d for d in _render(helm) if d["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    # two pods, one acting (the Lease): test_two_operator_pods_with_a_lease_by_default
    assert dep["spec"]["replicas"] == 2 and dep["spec"]["strategy"]["type"] == "RollingUpdate"
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_dashboard_is_json_on_the_replica_metrics(helm: str) -> None:
    import json

    cm = next(d for d in _render(helm) if d["kind"] == "ConfigMap")
    board = json.loads(cm["data"]["rlog.json"])
    exprs = " ".join(t["expr"] for p in board["panels"] for t in p["targets"])
    for metric in (
        "rlog_replica_status",
        "rlog_replica_is_leader",
        "rlog_log_learned_position",
        "rlog_appends_total",
        "rlog_append_latency_seconds",
        "rlog_fsync_latency_seconds",
        "rlog_catchup_remaining_positions",
        "rlog_elections_total",
        "rlog_disk_data_dir_bytes",
        "rlog_disk_available_bytes",
        "rlog_disk_full",
        "rlog_storage_corrupt_records_total",
    ):
        assert metric in exprs, metric


def _handler_calls() -> set[tuple[str, str, str]]:
    """(group, resource, verb) of every kubernetes-client call the operator makes."""
    needed: set[tuple[str, str, str]] = set()
    for path in CALLERS:
        for verb, stem in re.findall(
            r"\.(read|list|delete|create|patch|replace)_(?:namespaced_)?(\w+)\(", path.read_text()
        ):
            assert stem in RESOURCES, f"{path.name} calls {verb}_{stem}: add it to RESOURCES"
            group, resource = RESOURCES[stem]
            needed.add((group, resource, VERBS.get(verb, verb)))
    for stem in APPLIED:
        group, resource = RESOURCES[stem]
        needed |= {(group, resource, "create"), (group, resource, "patch")}
    # kube.delete_child deletes an owned object of a kind children.REMOVABLE names
    from rlog_operator import children

    needed |= {(*children.WATCHED[kind], "delete") for kind in children.REMOVABLE}
    needed |= set(KOPF_CR_CALLS)
    needed |= _kopf_index_calls()
    return needed


def _kopf_index_calls() -> set[tuple[str, str, str]]:
    """kopf lists and watches the resource of every index the handlers register."""
    import kopf

    from rlog_operator import handlers  # noqa: F401  (registers the handlers)

    calls: set[tuple[str, str, str]] = set()
    for handler in kopf.get_default_registry()._indexing.get_all_handlers():
        selector = handler.selector
        assert selector is not None
        group = selector.group or ""
        resource = selector.plural or selector.any_name
        assert resource, handler.id
        calls |= {(group, str(resource), "list"), (group, str(resource), "watch")}
    return calls


def _grants(doc: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v)
        for rule in doc["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
        for v in rule["verbs"]
    }


def test_rbac_grants_exactly_what_the_operator_calls(helm: str) -> None:
    """Every call is granted, and every granted (resource, verb) is called: a verb the
    operator never uses fails this test."""
    needed = _handler_calls()
    docs = _render(helm)
    (role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    (lease_role,) = [
        d for d in docs if d["kind"] == "Role"
    ]  # the Lease, in the release's namespace
    assert {r for _, r, _ in _grants(lease_role)} == {"leases"}
    granted = _grants(role) | _grants(lease_role)
    assert granted - needed == set(), f"granted, never called: {sorted(granted - needed)}"
    assert needed - granted == set(), f"called, not granted: {sorted(needed - granted)}"
    assert all("*" not in rule["verbs"] and "*" not in rule["resources"] for rule in role["rules"])
    # the operator deletes only what it replaces (a StatefulSet only to replace its claim
    # template, orphaning its pods) and owned objects the spec no longer asks for (with a UID
    # precondition: children.py; a revoked client identity's Secret, labelled as one:
    # identities.py); nodes it only lists and watches (node_loss.py: it never deletes one,
    # nor taints it out of service: that confirmation is the admin's)
    assert {r for g, r, v in granted if v == "delete"} == {
        "secrets",
        "pods",
        "persistentvolumeclaims",
        "statefulsets",
        "services",
        "networkpolicies",
        "deployments",
    }
    assert {v for g, r, v in granted if r == "nodes"} == {"list", "watch"}


def test_rbac_is_namespaced_when_watch_namespaces_is_set(helm: str) -> None:
    needed = _handler_calls()
    docs = _render(helm, "--set", "watchNamespaces={shop,billing}")
    (cluster_role,) = [d for d in docs if d["kind"] == "ClusterRole"]
    # cluster-wide: only what is cluster-scoped, read-only
    assert {r for _, r, _ in _grants(cluster_role)} == CLUSTER_SCOPED
    assert {v for _, _, v in _grants(cluster_role)} <= {"get", "list", "watch"}
    lease = _grants(
        next(d for d in docs if d["kind"] == "Role" and "lease" in d["metadata"]["name"])
    )
    roles = {
        d["metadata"]["namespace"]: d
        for d in docs
        if d["kind"] == "Role" and d["metadata"]["namespace"] != "default"
    }
    bindings = {
        d["metadata"]["namespace"]: d
        for d in docs
        if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] != "default"
    }
    assert set(roles) == set(bindings) == {"shop", "billing"}
    for namespace, role in roles.items():
        granted = _grants(role) | _grants(cluster_role) | lease
        assert granted == needed, (namespace, sorted(granted ^ needed))
        binding = bindings[namespace]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        (subject,) = binding["subjects"]
        assert subject["kind"] == "ServiceAccount"


def test_every_granted_verb_says_why() -> None:
    """A comment per verb in the chart's RBAC template."""
    template = (CHART / "templates" / "rbac.yaml").read_text()
    verbs = [
        line
        for line in template.splitlines()
        if re.match(r"\s+- (get|list|watch|create|patch|delete|update)\b", line)
    ]
    assert verbs
    assert all("#" in line for line in verbs), [line for line in verbs if "#" not in line]


def test_two_operator_pods_with_a_lease_by_default(helm: str) -> None:
    (deployment,) = [d for d in _render(helm) if d["kind"] == "Deployment"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["RLOG_OPERATOR_LEASE"]["value"] == "t-rlog-operator"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    single = _render(helm, "--set", "leaderElection.enabled=false", "--set", "replicaCount=1")
    (deployment,) = [d for d in single if d["kind"] == "Deployment"]
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    assert not [d for d in single if d["kind"] == "Role"]
    out = subprocess.run(
        [
            *(helm, "template", "t", str(CHART), "--kube-version", KUBE_VERSION),
            *("--set", "leaderElection.enabled=false"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0 and "replicaCount must be 1" in out.stderr


def test_monitoring_objects_take_extra_labels(helm: str) -> None:
    """kube-prometheus-stack selects monitors and rules by a label (release: <name>)."""
    extra = [
        "--set", "metrics.serviceMonitor.labels.release=kps",
        "--set", "metrics.podMonitor.labels.release=kps",
        "--set", "prometheusRule.labels.release=kps",
    ]  # fmt: skip
    docs = _render(helm, *ALL_ON, *extra)
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule"):
        doc = next(d for d in docs if d["kind"] == kind)
        assert doc["metadata"]["labels"]["release"] == "kps", doc["metadata"]
        assert doc["metadata"]["labels"]["app.kubernetes.io/name"] == "rlog-operator"


def test_log_format_reaches_the_operator_and_only_text_or_json_is_taken(helm: str) -> None:
    def env_of(*args: str) -> dict[str, str]:
        dep = next(d for d in _render(helm, *args) if d["kind"] == "Deployment")
        (container,) = dep["spec"]["template"]["spec"]["containers"]
        return {e["name"]: e.get("value") for e in container["env"]}

    assert env_of()["RLOG_LOG_FORMAT"] == "text"
    assert env_of("--set", "logFormat=json")["RLOG_LOG_FORMAT"] == "json"
    refused = subprocess.run(
        [
            helm,
            "template",
            "t",
            str(CHART),
            "--kube-version",
            KUBE_VERSION,
            "--set",
            "logFormat=xml",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "logFormat" in refused.stderr


def test_conventions_a_cluster_admin_expects(helm: str) -> None:
    """Pull secrets for the operator's image, annotations on its ServiceAccount (workload
    identity), the dashboard where Grafana's sidecar looks, a kubeVersion, and a values
    schema that refuses a key it does not know (a typo is an error, not a silent default)."""
    objects = _render(
        helm,
        "--set", "imagePullSecrets[0].name=regcred",
        "--set", "serviceAccount.annotations.iam\\.example/role=operator",
        "--set", "grafanaDashboard.namespace=monitoring",
    )  # fmt: skip
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    account = next(o for o in objects if o["kind"] == "ServiceAccount")
    assert account["metadata"]["annotations"] == {"iam.example/role": "operator"}
    dashboard = next(
        o for o in objects if o["kind"] == "ConfigMap" and "dashboard" in o["metadata"]["name"]
    )
    assert dashboard["metadata"]["namespace"] == "monitoring"
    plain = _render(helm)
    assert (
        "imagePullSecrets"
        not in next(o for o in plain if o["kind"] == "Deployment")["spec"]["template"]["spec"]
    )
    assert "annotations" not in next(o for o in plain if o["kind"] == "ServiceAccount")["metadata"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == ">=1.28.0-0"
    for bad in ("imagePullSecret[0].name=x", "grafanaDashbaord.enabled=false"):
        out = subprocess.run(
            [helm, "template", "t", str(CHART), "--kube-version", KUBE_VERSION, "--set", bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0 and "additional properties" in out.stderr, (bad, out.stderr)
    old = subprocess.run(
        [helm, "template", "t", str(CHART), "--kube-version", "v1.27.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert old.returncode != 0 and "kubeVersion" in old.stderr


def test_objects_are_named_by_helms_convention_and_the_lease_after_the_release(
    helm: str,
) -> None:
    """Release rlog-operator names its objects rlog-operator (not
    rlog-operator-rlog-operator), release rlog names them rlog-rlog-operator, and
    fullnameOverride replaces either; the Lease stays <release>-rlog-operator whatever the
    objects are called (a rename on an upgrade must not give two pods two Leases). The
    upgrade of a release named under the old rule keeps its names: e2e, test_upgrade_release."""

    def names(release: str, *args: str) -> tuple[set[str], str]:
        objects = helm_template(helm, release, "-n", "ops", *args)
        deployment = next(o for o in objects if o["kind"] == "Deployment")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        lease = next(e["value"] for e in container["env"] if e["name"] == "RLOG_OPERATOR_LEASE")
        assert (
            deployment["spec"]["template"]["spec"]["serviceAccountName"]
            == (deployment["metadata"]["name"])
        )
        kinds = ("Deployment", "ServiceAccount", "Service", "ClusterRole", "Role")
        return {o["metadata"]["name"] for o in objects if o["kind"] in kinds}, lease

    assert names("rlog-operator") == (
        {"rlog-operator", "rlog-operator-metrics", "rlog-operator-lease", "ops-rlog-operator"},
        "rlog-operator-rlog-operator",
    )
    assert names("rlog") == (
        {"rlog-rlog-operator", "rlog-rlog-operator-metrics", "rlog-rlog-operator-lease",
         "ops-rlog-rlog-operator"},
        "rlog-rlog-operator",
    )  # fmt: skip
    assert names("rlog-operator", "--set", "fullnameOverride=ops") == (
        {"ops", "ops-metrics", "ops-lease", "ops-ops"},
        "rlog-operator-rlog-operator",
    )
    for bad in ("Ops", "-ops", "o" * 54):
        out = subprocess.run(
            [helm, "template", "t", str(CHART), "--kube-version", KUBE_VERSION,
             "--set", f"fullnameOverride={bad}"],
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        assert out.returncode != 0 and "fullnameOverride" in out.stderr, (bad, out.stderr)
