"""The manifests a ReplicatedLog becomes (rlog_operator.specs): pure, so golden-ish."""

import re

import pytest

from rlog_operator import constants as c
from rlog_operator import specs
from rlog_operator.specs import OperatorConfig

CONFIG = OperatorConfig()
UID = "0b6f3c2e-1111-2222-3333-444455556666"


def body(replicas=3, **spec):
    return {
        "apiVersion": "rlog.io/v1alpha1",
        "kind": "ReplicatedLog",
        "metadata": {"name": "orders", "namespace": "shop", "uid": UID, "generation": 1},
        "spec": {"replicas": replicas, "storage": {"size": "1Gi"}, **spec},
    }


def container(sts):
    (ctr,) = sts["spec"]["template"]["spec"]["containers"]
    return ctr


def arg(ctr, flag):
    args = ctr["args"]
    return args[args.index(flag) + 1]


EXPECTED_LABELS = {
    "app.kubernetes.io/name": "rlog",
    "app.kubernetes.io/instance": "orders",
    "app.kubernetes.io/component": "replica",
    "app.kubernetes.io/managed-by": "rlog-operator",
}


def test_labels_on_everything():
    for obj in specs.desired_objects(body(), CONFIG):
        assert obj["metadata"]["labels"] == EXPECTED_LABELS, obj["kind"]
        assert obj["metadata"]["namespace"] == "shop"
        assert "ownerReferences" not in obj["metadata"]  # kopf.adopt adds them
    sts = specs.statefulset(body(), CONFIG)
    template_labels = sts["spec"]["template"]["metadata"]["labels"]
    assert EXPECTED_LABELS.items() <= template_labels.items()
    claim = sts["spec"]["volumeClaimTemplates"][0]
    assert claim["metadata"]["labels"] == EXPECTED_LABELS


def test_selector_is_a_subset_of_pod_labels_and_stable():
    sts = specs.statefulset(body(), CONFIG)
    selector = sts["spec"]["selector"]["matchLabels"]
    assert selector.items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    assert c.LABEL_MANAGED_BY not in selector  # a selector is immutable: identity only
    # user pod labels cannot override the operator's
    sts = specs.statefulset(
        body(podLabels={"app.kubernetes.io/instance": "x", "team": "a"}), CONFIG
    )
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/instance"] == "orders" and labels["team"] == "a"


def test_statefulset_shape():
    sts = specs.statefulset(body(), CONFIG)
    assert (sts["apiVersion"], sts["kind"]) == ("apps/v1", "StatefulSet")
    assert sts["metadata"]["name"] == "orders"
    s = sts["spec"]
    assert s["replicas"] == 3
    assert s["podManagementPolicy"] == "Parallel"
    assert s["updateStrategy"] == {"type": "OnDelete"}
    assert s["serviceName"] == specs.headless_service(body(), CONFIG)["metadata"]["name"]
    assert s["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    (claim,) = s["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert "storageClassName" not in claim["spec"]
    mounts = {m["name"]: m["mountPath"] for m in container(sts)["volumeMounts"]}
    assert mounts["data"] == "/data"


def test_storage_class_passes_through():
    sts = specs.statefulset(body(storage={"size": "5Gi", "storageClassName": "fast"}), CONFIG)
    claim = sts["spec"]["volumeClaimTemplates"][0]["spec"]
    assert claim["storageClassName"] == "fast"
    assert claim["resources"]["requests"]["storage"] == "5Gi"


@pytest.mark.parametrize("replicas", [1, 3, 5, 7])
def test_peers_in_ordinal_order(replicas):
    ctr = container(specs.statefulset(body(replicas), CONFIG))
    peers = arg(ctr, "--peers").split(",")
    assert peers == [f"orders-{i}.orders-headless.shop.svc:{c.GRPC_PORT}" for i in range(replicas)]


def test_peers_with_cluster_domain():
    config = OperatorConfig(cluster_domain="cluster.local", grpc_port=7100)
    assert specs.peers(body(1), config) == ["orders-0.orders-headless.shop.svc.cluster.local:7100"]


def test_replica_command_line():
    ctr = container(specs.statefulset(body(), CONFIG))
    assert ctr["command"] == ["rlog", "replica"]
    assert arg(ctr, "--id") == "$(RLOG_REPLICA_ID)"
    assert arg(ctr, "--data-dir") == c.DATA_DIR and c.DATA_DIR.startswith("/data/")
    assert arg(ctr, "--log-id") == UID
    assert arg(ctr, "--metrics-port") == str(c.METRICS_PORT)
    assert arg(ctr, "--listen") == f"0.0.0.0:{c.GRPC_PORT}"
    assert "--auto-initialize" not in ctr["args"]  # the operator grants the permit
    env = {e["name"]: e for e in ctr["env"]}
    # the ordinal from the downward API (k8s >= 1.28), expanded by the kubelet: no shell
    assert env["RLOG_REPLICA_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    # every $(VAR) in args is defined before use
    for var in re.findall(r"\$\((\w+)\)", " ".join(ctr["args"])):
        assert var in env
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert ports == {
        "grpc": c.GRPC_PORT,
        "lane": c.GRPC_PORT + 1,
        "metrics": c.METRICS_PORT,
        "health": c.HEALTH_PORT,
    }
    # the leader's writes on the write lane, at the gRPC port + 1
    assert arg(ctr, "--write-lane-offset") == "1"


@pytest.mark.parametrize(
    ("rate", "flag"),
    [("100Mi", str(100 * 2**20)), (50_000_000, "50000000"), ("1.5k", "1500"), ("0.5", "1"),
     ("0", None), (0, None), (None, None)],
)  # fmt: skip
def test_the_catch_up_rate_from_spec(rate, flag):
    spec = {} if rate is None else {"catchUpRate": rate}
    ctr = container(specs.statefulset(body(**spec), CONFIG))
    if flag is None:
        assert "--catchup-rate" not in ctr["args"]  # no cap
    else:
        assert arg(ctr, "--catchup-rate") == flag


def test_image_override_and_default():
    assert container(specs.statefulset(body(), CONFIG))["image"] == CONFIG.replica_image
    sts = specs.statefulset(body(image="reg/rlog:2"), CONFIG)
    assert container(sts)["image"] == "reg/rlog:2"


def test_probes_are_the_kubelets_grpc_probes_of_the_health_port():
    from rlog.runtime.health import READY_SERVICE

    ctr = container(specs.statefulset(body(), CONFIG))
    assert arg(ctr, "--health-port") == str(c.HEALTH_PORT)
    assert {"name": "health", "containerPort": c.HEALTH_PORT, "protocol": "TCP"} in ctr["ports"]
    # ready: the service the replica reports SERVING only while VOTING
    assert c.READY_SERVICE == READY_SERVICE
    ready = ctr["readinessProbe"]
    assert ready["grpc"] == {"port": c.HEALTH_PORT, "service": READY_SERVICE}
    # liveness and startup only need the server: a catching-up replica is alive
    live, start = ctr["livenessProbe"], ctr["startupProbe"]
    assert live["grpc"] == start["grpc"] == {"port": c.HEALTH_PORT}
    # no Python started per probe; and every other handler type null, so the merge patch
    # of a template with `exec` probes (release 0.1.0) deletes them
    for probe in (ready, live, start):
        assert {k: probe[k] for k in ("exec", "httpGet", "tcpSocket")} == dict.fromkeys(
            ("exec", "httpGet", "tcpSocket")
        )
    assert live["periodSeconds"] * live["failureThreshold"] >= 120
    assert start["periodSeconds"] * start["failureThreshold"] >= 300


@pytest.mark.parametrize(
    "env, clash",
    [
        ({"RLOG_HEALTH_PORT": "7000"}, "RLOG_GRPC_PORT"),
        ({"RLOG_HEALTH_PORT": "7001"}, "write lane"),
        ({"RLOG_METRICS_PORT": "7002"}, "RLOG_HEALTH_PORT"),
        ({"RLOG_GRPC_PORT": "9099"}, "write lane"),  # its lane on the metrics port
        ({"RLOG_METRICS_PORT": "7001"}, "write lane"),
        ({"RLOG_GRPC_PORT": "9100"}, "RLOG_METRICS_PORT 9100 collides with RLOG_GRPC_PORT"),
    ],
)
def test_colliding_ports_are_refused_naming_both(env, clash):
    with pytest.raises(ValueError, match="collides") as refused:
        specs.OperatorConfig.from_env(env)
    assert clash in str(refused.value)


def test_security_context_is_restricted():
    sts = specs.statefulset(body(), CONFIG)
    pod = sts["spec"]["template"]["spec"]
    psc = pod["securityContext"]
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001
    assert psc["fsGroup"] == 10001
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    csc = container(sts)["securityContext"]
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"] == {"drop": ["ALL"]}
    assert csc["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    # a writable /tmp for a read-only root filesystem
    assert {"name": "tmp", "mountPath": "/tmp"} in container(sts)["volumeMounts"]


def test_pod_settings_from_spec():
    resources = {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
    b = body(
        resources=resources,
        nodeSelector={"disk": "ssd"},
        tolerations=[{"key": "k", "operator": "Exists"}],
        podAnnotations={"a": "b"},
        priorityClassName="high",
    )
    sts = specs.statefulset(b, CONFIG)
    pod = sts["spec"]["template"]
    assert container(sts)["resources"] == resources
    assert container(sts)["resources"] is not resources  # copies, never aliases
    assert pod["spec"]["nodeSelector"] == {"disk": "ssd"}
    assert pod["spec"]["tolerations"] == [{"key": "k", "operator": "Exists"}]
    assert pod["spec"]["priorityClassName"] == "high"
    assert pod["metadata"]["annotations"]["a"] == "b"
    assert pod["metadata"]["annotations"][c.ANNOTATION_LOG_ID] == UID


def test_default_affinity_spreads_replicas():
    pod = specs.statefulset(body(), CONFIG)["spec"]["template"]["spec"]
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term[0]["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    custom = {"nodeAffinity": {"x": 1}}
    pod = specs.statefulset(body(affinity=custom), CONFIG)["spec"]["template"]["spec"]
    assert pod["affinity"] == custom


def test_default_topology_spread_over_zones_and_nodes_softly():
    pod = specs.statefulset(body(), CONFIG)["spec"]["template"]["spec"]
    spread = pod["topologySpreadConstraints"]
    assert [t["topologyKey"] for t in spread] == [
        "topology.kubernetes.io/zone",
        "kubernetes.io/hostname",
    ]
    assert {t["whenUnsatisfiable"] for t in spread} == {"ScheduleAnyway"}
    assert all(t["labelSelector"]["matchLabels"] == specs.selector_labels(body()) for t in spread)


def test_topology_spread_is_overridable_and_can_be_turned_off():
    custom = [{"maxSkew": 2, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule"}]
    pod = specs.statefulset(body(topologySpreadConstraints=custom), CONFIG)
    assert pod["spec"]["template"]["spec"]["topologySpreadConstraints"] == custom
    off = specs.statefulset(body(topologySpreadConstraints=[]), CONFIG)
    assert off["spec"]["template"]["spec"]["topologySpreadConstraints"] == []


def test_the_replica_drains_within_the_grace_period():
    sts = specs.statefulset(body(), CONFIG)
    drain = float(arg(container(sts), "--drain-timeout"))
    assert drain == CONFIG.drain_seconds > 0
    # the drain, then closing the store, before the kubelet's SIGKILL
    assert sts["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] >= drain + 10


def test_paused_only_by_true():
    def annotated(value):
        return {
            **body(),
            "metadata": {**body()["metadata"], "annotations": {c.ANNOTATION_PAUSED: value}},
        }

    assert specs.paused(annotated("true")) and specs.paused(annotated(" True "))
    assert not specs.paused(annotated("false")) and not specs.paused(annotated(""))
    assert not specs.paused(body())


def test_services():
    headless = specs.headless_service(body(), CONFIG)
    assert headless["metadata"]["name"] == "orders-headless"
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert {p["name"] for p in headless["spec"]["ports"]} == {"grpc", "lane", "metrics"}
    client = specs.client_service(body(), CONFIG)
    assert client["metadata"]["name"] == "orders"
    assert client["spec"]["type"] == "ClusterIP"
    assert not client["spec"].get("publishNotReadyAddresses")  # only VOTING replicas
    # gRPC, and the lane (clients' appends: docs/data-path.md)
    assert [p["port"] for p in client["spec"]["ports"]] == [c.GRPC_PORT, c.GRPC_PORT + 1]
    for svc in (headless, client):
        assert svc["spec"]["selector"] == specs.selector_labels(body())


def test_pdb():
    pdb = specs.pod_disruption_budget(body())
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == specs.selector_labels(body())


def test_template_is_deterministic():
    """Same CR and config -> same template, so no spurious revisions (and rollings)."""
    assert specs.statefulset(body(), CONFIG) == specs.statefulset(body(), CONFIG)
    a = specs.statefulset(body(), CONFIG)["spec"]["template"]
    b = specs.statefulset(body(podAnnotations={"x": "y"}), CONFIG)["spec"]["template"]
    assert a != b


def test_names_and_ordinals():
    assert specs.pod_name(body(), 2) == "orders-2"
    assert specs.pvc_name(body(), 2) == "data-orders-2"
    assert specs.ordinal_of("orders-12") == 12
    assert specs.ordinal_of("my-log-0") == 0
    assert specs.ordinal_of("orders") is None


def test_defaults_when_spec_fields_missing():
    b = body()
    del b["spec"]["replicas"]
    assert specs.statefulset(b, CONFIG)["spec"]["replicas"] == 3


def test_config_from_env():
    config = OperatorConfig.from_env(
        {"RLOG_REPLICA_IMAGE": "r/i:1", "RLOG_GRPC_PORT": "7010", "RLOG_CLUSTER_DOMAIN": "c.l."}
    )
    assert config.replica_image == "r/i:1"
    assert config.grpc_port == 7010
    assert config.cluster_domain == "c.l"
    assert OperatorConfig.from_env({}) == OperatorConfig()


def test_the_operators_json_log_format_reaches_the_replicas_and_text_changes_nothing():
    """Text is the default: the replicas' arguments stay as before it existed, so upgrading
    the operator restarts no replica for it."""
    text = specs.replica_args(body(), OperatorConfig.from_env({"RLOG_LOG_FORMAT": "text"}))
    assert text == specs.replica_args(body(), OperatorConfig())
    assert "--log-format" not in text
    json_args = specs.replica_args(body(), OperatorConfig.from_env({"RLOG_LOG_FORMAT": "json"}))
    at = json_args.index("--log-format")
    assert json_args[at + 1] == "json"
    with pytest.raises(ValueError, match="log format 'yaml' is not one of text, json"):
        OperatorConfig.from_env({"RLOG_LOG_FORMAT": "yaml"})


def test_ports_apart_are_taken():
    config = specs.OperatorConfig.from_env({"RLOG_GRPC_PORT": "8000", "RLOG_HEALTH_PORT": "8002"})
    assert (config.grpc_port, config.health_port) == (8000, 8002)
