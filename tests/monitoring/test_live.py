"""A real Prometheus scraping a real 3-replica log (and the operator's status/metrics code
over it), loading the chart's real rules, answering the chart's dashboard queries; then real
faults (SIGKILL, volume loss, total data loss) make the real alerts fire.

Kubernetes is replaced by static targets: the scrape configs are built from the rendered
PodMonitor and ServiceMonitor the way the Prometheus Operator builds them (keep on the
selector labels and the port name, then namespace/pod/container/endpoint/job target labels,
podTargetLabels, honorLabels), and each target carries the `__meta_kubernetes_*` labels
Kubernetes service discovery would give it: for replicas, the pod labels and port names of
the StatefulSet the operator's own `specs.statefulset` builds; for the operator, the labels
of the chart's metrics Service. So a PodMonitor that selects no replica pod, a label the
alerts use that nothing provides, or a lost `honorLabels` all fail here.

The operator side is `operator_observer.py`: the operator's compute_status + metrics over the
real replicas (no Kubernetes), in the operator's namespace `rlog-system`, reporting the log
`rlog-test/demo`.
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import dashboard_png
import pytest
import yaml
from monlib import HERE, RELEASE_NAMESPACE, Chart, Tools

from rlog.client import Client
from rlog.client.errors import RlogError
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster, free_port
from rlog_operator import specs

pytestmark = pytest.mark.slow

NAMESPACE = "rlog-test"  # the ReplicatedLog's namespace
LOG = "demo"  # the ReplicatedLog's name (app.kubernetes.io/instance of its pods)
UID = "5b1e0c1e-0000-4000-8000-00000000d0d0"
SHORT_GROUP = "rlog-short-for"
T = TypeVar("T")


def _sanitize(label: str) -> str:
    """A Kubernetes label name as a Prometheus label name (what the Prometheus Operator and
    Kubernetes SD do): every character outside [a-zA-Z0-9_] becomes _."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _keep_selector(kind: str, match_labels: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "action": "keep",
            "source_labels": [
                f"__meta_kubernetes_{kind}_label_{_sanitize(k)}",
                f"__meta_kubernetes_{kind}_labelpresent_{_sanitize(k)}",
            ],
            "regex": f"({re.escape(v)});true",
        }
        for k, v in match_labels.items()
    ]


def _replace(source: str, target: str) -> dict[str, Any]:
    return {"source_labels": [source], "target_label": target}


def pod_monitor_job(pm: dict[str, Any], targets: list[dict[str, Any]]) -> dict[str, Any]:
    spec = pm["spec"]
    (ep,) = spec["podMetricsEndpoints"]
    relabel = _keep_selector("pod", spec["selector"]["matchLabels"])
    relabel += [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_pod_container_port_name"],
            "regex": ep["port"],
        },
        _replace("__meta_kubernetes_namespace", "namespace"),
        _replace("__meta_kubernetes_pod_container_name", "container"),
        _replace("__meta_kubernetes_pod_name", "pod"),
    ]
    relabel += [
        {
            "source_labels": [f"__meta_kubernetes_pod_label_{_sanitize(label)}"],
            "target_label": _sanitize(label),
            "regex": "(.+)",
            "replacement": "${1}",
        }
        for label in spec.get("podTargetLabels", [])
    ]
    relabel += [
        {
            "target_label": "job",
            "replacement": f"{pm['metadata']['namespace']}/{pm['metadata']['name']}",
        },
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]
    return {
        "job_name": f"podMonitor/{pm['metadata']['namespace']}/{pm['metadata']['name']}/0",
        "honor_labels": bool(ep.get("honorLabels", False)),
        "metrics_path": ep.get("path", "/metrics"),
        "scrape_interval": "1s",  # the chart's interval is 30s; 1s keeps the test short
        "scrape_timeout": "1s",
        "static_configs": targets,
        "relabel_configs": relabel,
    }


def service_monitor_job(sm: dict[str, Any], targets: list[dict[str, Any]]) -> dict[str, Any]:
    spec = sm["spec"]
    (ep,) = spec["endpoints"]
    relabel = _keep_selector("service", spec["selector"]["matchLabels"])
    relabel += [
        {
            "action": "keep",
            "source_labels": ["__meta_kubernetes_endpoint_port_name"],
            "regex": ep["port"],
        },
        _replace("__meta_kubernetes_namespace", "namespace"),
        _replace("__meta_kubernetes_service_name", "service"),
        _replace("__meta_kubernetes_pod_name", "pod"),
        _replace("__meta_kubernetes_pod_container_name", "container"),
        _replace("__meta_kubernetes_service_name", "job"),
        {"target_label": "endpoint", "replacement": ep["port"]},
    ]
    return {
        "job_name": f"serviceMonitor/{sm['metadata']['namespace']}/{sm['metadata']['name']}/0",
        "honor_labels": bool(ep.get("honorLabels", False)),
        "metrics_path": ep.get("path", "/metrics"),
        "scrape_interval": "1s",
        "scrape_timeout": "1s",
        "static_configs": targets,
        "relabel_configs": relabel,
    }


def short_for(rules: dict[str, Any]) -> dict[str, Any]:
    """A copy of the chart's rules with every `for:` cut to 2s (minutes of waiting are
    covered by the promtool unit tests), in its own group, so the live faults make alerts
    fire within the test's time. The unmodified rules are loaded too."""
    short = copy.deepcopy(rules)
    for group in short["groups"]:
        group["name"] = SHORT_GROUP
        for rule in group["rules"]:
            rule["for"] = "2s"
    return short


class Prometheus:
    def __init__(self, url: str, process: subprocess.Popen[bytes], log: Path) -> None:
        self.url = url
        self.process = process
        self.log = log

    def get(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}{path}?{query}", timeout=10) as r:
            body = json.load(r)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    def rules(self, group: str) -> dict[str, dict[str, Any]]:
        groups = self.get("/api/v1/rules")["groups"]
        (found,) = [g for g in groups if g["name"] == group]
        return {r["name"]: r for r in found["rules"]}

    def alerts(self, alert: str, group: str = SHORT_GROUP) -> list[dict[str, Any]]:
        """The active (pending or firing) alerts of one rule, with their labels and state."""
        alerts: list[dict[str, Any]] = self.rules(group)[alert]["alerts"]
        return alerts

    def wait(self, what: str, probe: Callable[[], T | None], timeout: float = 20.0) -> T:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log.read_text()[-2000:]}")
            last = probe()
            if last:
                return last
            time.sleep(0.25)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last: {last})")

    def wait_firing(self, alert: str, labels: dict[str, str], timeout: float = 30.0) -> None:
        def probe() -> list[dict[str, Any]]:
            return [
                a
                for a in self.alerts(alert)
                if a["state"] == "firing" and labels.items() <= a["labels"].items()
            ]

        self.wait(f"{alert} {labels} firing", probe, timeout)

    def wait_inactive(self, alert: str, timeout: float = 30.0) -> None:
        self.wait(
            f"{alert} inactive",
            lambda: self.rules(SHORT_GROUP)[alert]["state"] == "inactive",
            timeout,
        )


class Writer(threading.Thread):
    """Appends a small entry every 20 ms, so the rate panels have something to show."""

    def __init__(self, endpoints: list[str]) -> None:
        super().__init__(daemon=True)
        self.client = Client(endpoints, timeout=2.0)
        self.stop = threading.Event()
        self.appended = 0

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.client.append([b"x" * 64, b"y" * 64])
                self.appended += 2
            except RlogError:
                pass
            self.stop.wait(0.02)

    def close(self) -> None:
        self.stop.set()
        self.join(timeout=10)
        self.client.close()


@dataclass
class Stack:
    cluster: DevCluster
    prom: Prometheus
    writer: Writer
    update_revision: Path
    rules: dict[str, Any]
    started: float  # unix time the replicas started (the dashboard picture's range start)

    def pod(self, i: int) -> str:
        return f"{LOG}-{i}"


@pytest.fixture(scope="module")
def stack(tools: Tools, chart: Chart, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("monitoring-live")
    body = {
        "metadata": {"name": LOG, "namespace": NAMESPACE, "uid": UID, "generation": 1},
        "spec": {"replicas": 3, "storage": {"size": "1Gi"}},
    }
    sts = specs.statefulset(body, specs.OperatorConfig())
    template = sts["spec"]["template"]
    (container,) = template["spec"]["containers"]
    pod_labels = template["metadata"]["labels"]
    port_names = {p["containerPort"]: p["name"] for p in container["ports"]}
    metrics_port_name = port_names[specs.OperatorConfig().metrics_port]

    cluster = DevCluster(3, tmp / "log", metrics=True, log_id=UID)
    started = time.time()
    processes: list[subprocess.Popen[bytes]] = []
    writer: Writer | None = None
    try:
        cluster.start()
        writer = Writer(cluster.endpoints)
        writer.start()

        replica_targets = [
            {
                "targets": [f"{cluster.host_of(i)}:{cluster.metrics_ports[i]}"],
                "labels": {
                    "__meta_kubernetes_namespace": NAMESPACE,
                    "__meta_kubernetes_pod_name": f"{LOG}-{i}",
                    "__meta_kubernetes_pod_container_name": container["name"],
                    "__meta_kubernetes_pod_container_port_name": metrics_port_name,
                    **{
                        f"__meta_kubernetes_pod_label_{_sanitize(k)}": v
                        for k, v in pod_labels.items()
                    },
                    **{
                        f"__meta_kubernetes_pod_labelpresent_{_sanitize(k)}": "true"
                        for k in pod_labels
                    },
                },
            }
            for i in range(3)
        ]
        observer_port = free_port()
        update_revision = tmp / "update-revision"
        update_revision.write_text("rev-1\n")
        observer = [
            sys.executable, str(HERE / "operator_observer.py"),
            "--port", str(observer_port),
            "--namespace", NAMESPACE,
            "--name", LOG,
            "--uid", UID,
            "--endpoints", cluster.endpoint,
            "--update-revision-file", str(update_revision),
        ]  # fmt: skip
        with open(tmp / "observer.log", "wb") as log:
            processes.append(subprocess.Popen(observer, stdout=log, stderr=subprocess.STDOUT))
        service = chart.service
        operator_targets = [
            {
                "targets": [f"127.0.0.1:{observer_port}"],
                "labels": {
                    "__meta_kubernetes_namespace": RELEASE_NAMESPACE,
                    "__meta_kubernetes_service_name": service["metadata"]["name"],
                    "__meta_kubernetes_pod_name": "rlog-rlog-operator-6d4cf56db9-x7k2p",
                    "__meta_kubernetes_pod_container_name": "operator",
                    "__meta_kubernetes_endpoint_port_name": service["spec"]["ports"][0]["name"],
                    **{
                        f"__meta_kubernetes_service_label_{_sanitize(k)}": v
                        for k, v in service["metadata"]["labels"].items()
                    },
                    **{
                        f"__meta_kubernetes_service_labelpresent_{_sanitize(k)}": "true"
                        for k in service["metadata"]["labels"]
                    },
                },
            }
        ]
        rules = chart.rule["spec"]
        (tmp / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
        (tmp / "rules-short-for.yaml").write_text(yaml.safe_dump(short_for(rules), sort_keys=False))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yaml", "rules-short-for.yaml"],
            "scrape_configs": [
                pod_monitor_job(chart.pod_monitor, replica_targets),
                service_monitor_job(chart.service_monitor, operator_targets),
            ],
        }
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        port = free_port()
        prom_log = tmp / "prometheus.log"
        with open(prom_log, "wb") as log:
            processes.append(
                subprocess.Popen(
                    [
                        tools.prometheus,
                        f"--config.file={tmp / 'prometheus.yml'}",
                        f"--storage.tsdb.path={tmp / 'data'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                        "--log.level=warn",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=tmp,
                )
            )
        prom = Prometheus(f"http://127.0.0.1:{port}", processes[-1], prom_log)
        prom.wait("prometheus ready", lambda: _ready(prom), timeout=30)
        prom.wait(
            "4 targets up",
            lambda: len(prom.query("up == 1")) == 4 or None,
            timeout=30,
        )
        # make dashboard-png: a longer healthy stretch under the write load before the
        # tests (and their faults), so the picture in docs/ shows more than a few seconds
        time.sleep(float(os.environ.get("RLOG_DASHBOARD_WARMUP", "0")))
        yield Stack(cluster, prom, writer, update_revision, rules, started)
    finally:
        if writer is not None:
            writer.close()
        for process in reversed(processes):
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        cluster.stop()


def _ready(prom: Prometheus) -> bool:
    try:
        with urllib.request.urlopen(f"{prom.url}/-/ready", timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def test_targets_get_the_labels_the_alerts_and_dashboard_use(stack: Stack, chart: Chart) -> None:
    meta = chart.pod_monitor["metadata"]
    job = f"{meta['namespace']}/{meta['name']}"
    up = {r["metric"]["pod"]: r["metric"] for r in stack.prom.query(f'up{{job="{job}"}}')}
    assert set(up) == {stack.pod(i) for i in range(3)}
    for labels in up.values():
        assert labels["namespace"] == NAMESPACE
        assert labels["app_kubernetes_io_instance"] == LOG, labels
        assert labels["endpoint"] == "metrics"
    # the operator's metrics keep the log's namespace (honorLabels), not the operator's
    phase = stack.prom.query("rlog_operator_log_phase")
    assert phase and {r["metric"]["namespace"] for r in phase} == {NAMESPACE}
    assert {r["metric"]["name"] for r in phase} == {LOG}
    assert not stack.prom.query("rlog_operator_log_phase{exported_namespace!=''}")


def test_rules_load_and_evaluate_ok(stack: Stack) -> None:
    names = {r["alert"] for g in stack.rules["groups"] for r in g["rules"]}
    for group in ("rlog", SHORT_GROUP):

        def evaluated(g: str = group) -> dict[str, dict[str, Any]] | None:
            found = stack.prom.rules(g)
            return found if all(x["health"] != "unknown" for x in found.values()) else None

        rules = stack.prom.wait(f"every rule of {group} evaluated", evaluated)
        assert set(rules) == names
        for name, rule in rules.items():
            assert rule["health"] == "ok", (name, rule.get("lastError"))
            assert rule["type"] == "alerting"
    original = stack.prom.rules("rlog")
    assert original["RlogReplicaNotVoting"]["duration"] == 600


def _panel_exprs(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p["targets"]]


def _substitute(expr: str, values: dict[str, str]) -> str:
    out = dashboard_png.substitute(expr, values)  # as the dashboard picture does
    assert "$" not in out, f"unknown template variable in {expr}"
    return out


# Panels no live metric feeds here: rlog_operator_errors_total only appears once an operator
# handler fails, rlog_operator_replica_storage_condition once a replica has storage trouble
# or a failed restore. Checked by promtool instead (the `dashboard operator panels` test in
# alerts_test.yaml evaluates the same expression on synthetic series).
PROMTOOL_ONLY = {
    "sum by (handler) (rate(rlog_operator_errors_total[5m]))",
    'rlog_operator_replica_storage_condition{namespace=~"$namespace", name=~"$log"}',
}


def test_dashboard_variables_and_panels_return_data(stack: Stack, chart: Chart) -> None:
    board = chart.dashboard
    prom = stack.prom
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert set(variables) == {"datasource", "namespace", "log"}
    # the variables' own queries: label_values(metric{selector}, label)
    for name, value in (("namespace", NAMESPACE), ("log", LOG)):
        m = re.fullmatch(r"label_values\((.*), (\w+)\)", variables[name]["query"])
        assert m, variables[name]["query"]
        series = _substitute(m.group(1), {"namespace": NAMESPACE})
        found = prom.get("/api/v1/label/" + m.group(2) + "/values", **{"match[]": series})
        assert found == [value], (name, found)

    # each panel query, with the test's namespace and log, and with All (.*)
    for title, expr in _panel_exprs(board):
        if expr in PROMTOOL_ONLY:
            continue
        for values in ({"namespace": NAMESPACE, "log": LOG}, {"namespace": ".*", "log": ".*"}):
            query = _substitute(expr, values)

            def answered(q: str = query) -> list[dict[str, Any]]:
                return [r for r in prom.query(q) if not math.isnan(float(r["value"][1]))]

            result = prom.wait(f"panel {title!r}: {query}", answered, timeout=30)
            assert result, (title, query)
    assert stack.writer.appended > 0
    # the appends panel shows the leader appending
    leader = stack.cluster.wait_for_leader(timeout=30)
    rates = {
        r["metric"]["pod"]: float(r["value"][1])
        for r in prom.query(
            _substitute(
                next(e for t, e in _panel_exprs(board) if "rlog_appends_total" in e),
                {"namespace": NAMESPACE, "log": LOG},
            )
        )
    }
    assert rates[stack.pod(leader)] > 0, rates
    # and a filter on another log shows nothing (the $log variable really filters)
    for title, expr in _panel_exprs(board):
        if "$log" in expr:
            other = _substitute(expr, {"namespace": NAMESPACE, "log": "other"})
            assert not prom.query(other), title
    for expr in PROMTOOL_ONLY:  # as promtool evaluates it: every variable All (.*)
        everything = _substitute(expr, {"namespace": ".*", "log": ".*"})
        assert everything in (HERE / "alerts_test.yaml").read_text(), expr


def _png_size(path: Path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_dashboard_picture_marks_broken_panels(stack: Stack, chart: Chart, tmp_path: Path) -> None:
    """The picture's panel errors are real: a copy of the dashboard with four panels broken
    the ways Grafana shows as a panel error or "No data" fails exactly those four, each
    with its reason, on the real Prometheus."""
    # First every panel of the real dashboard must show data: a rate over [5m] needs two
    # scrapes, which a loaded machine may not have made yet seconds after the stack started.
    variables = dashboard_png.saved_variables(chart.dashboard)

    deadline = time.monotonic() + 120
    while True:
        drawn = dashboard_png.query_panels(
            chart.dashboard, stack.prom.url, stack.started, time.time(), variables
        )
        failing = [(p.title, p.error) for p in drawn if p.error]
        if not failing:
            break
        assert time.monotonic() < deadline, f"panels of the real dashboard failing: {failing}"
        time.sleep(1)
    board = copy.deepcopy(chart.dashboard)
    panels = board["panels"]
    panels[0]["targets"][0]["expr"] += " + on() group_left() $nosuchvariable"
    panels[1]["targets"][0]["expr"] = 'rlog_no_such_metric{namespace=~"$namespace"}'
    panels[2]["datasource"] = {"type": "prometheus", "uid": "some-other-prometheus"}
    panels[3]["type"] = "piechart"
    drawn = dashboard_png.render(
        board, stack.prom.url, stack.started, time.time(), tmp_path / "broken.png"
    )
    errors = {p.title: p.error for p in drawn if p.error}
    assert set(errors) == {p["title"] for p in panels[:4]}, errors
    assert "parse error" in errors[panels[0]["title"]], errors
    assert errors[panels[1]["title"]] == "No data"
    assert "some-other-prometheus" in errors[panels[2]["title"]]
    assert "piechart" in errors[panels[3]["title"]]
    assert _png_size(tmp_path / "broken.png")[0] > 1000


def test_healthy_log_has_no_alert(stack: Stack) -> None:
    time.sleep(3)  # a few evaluations with every target up (for: 2s in the short group)
    for group in ("rlog", SHORT_GROUP):
        for name, rule in stack.prom.rules(group).items():
            assert rule["state"] == "inactive", (group, name, rule["alerts"])


def test_real_faults_fire_the_alerts(stack: Stack) -> None:
    cluster, prom = stack.cluster, stack.prom
    stack.writer.close()
    log_labels = {"namespace": NAMESPACE, "name": LOG}

    # a rolling update that makes no progress (the StatefulSet has a new revision, no pod
    # is replaced: nothing runs the operator's rolling replacement here)
    stack.update_revision.write_text("rev-2\n")
    prom.wait_firing("RlogRollingUpdateStuck", {**log_labels, "phase": "RollingUpdate"})
    stack.update_revision.write_text("rev-1\n")
    prom.wait_inactive("RlogRollingUpdateStuck")

    # SIGKILL the leader and one more replica: one VOTING replica left, no leader, no quorum
    leader = cluster.wait_for_leader(timeout=30)
    other = (leader + 1) % 3
    cluster.kill(leader)
    cluster.kill(other)
    instance = {"namespace": NAMESPACE, "app_kubernetes_io_instance": LOG}
    prom.wait_firing("RlogNoLeader", instance)
    prom.wait_firing("RlogNoQuorum", log_labels)
    # the chart's own rules (for: 5m / 2m) have them pending
    for alert in ("RlogNoLeader", "RlogNoQuorum"):

        def pending(a: str = alert) -> list[dict[str, Any]]:
            return [x for x in prom.alerts(a, group="rlog") if x["state"] == "pending"]

        prom.wait(f"{alert} pending in the chart's rules", pending)
    assert prom.query(f'up{{pod="{stack.pod(leader)}"}} == 0')

    # the second replica comes back with an empty volume: with one VOTING peer (no quorum)
    # it cannot recover and stays EMPTY
    cluster.wipe(other)
    cluster.start_replica(other)
    prom.wait_firing("RlogReplicaNotVoting", {**instance, "pod": stack.pod(other)})
    firing = [a for a in prom.alerts("RlogReplicaNotVoting") if a["state"] == "firing"]
    assert {a["labels"]["pod"] for a in firing} == {stack.pod(other)}
    assert "not been VOTING" in firing[0]["annotations"]["summary"]

    # the leader's replica restarts: quorum, a leader, and the wiped replica recovers
    cluster.start_replica(leader)
    cluster.wait_for_leader(timeout=30)
    cluster.wait_for(
        lambda sts: all(s is not None and s.status == pb.VOTING for s in sts),
        timeout=30,
        what="every replica VOTING",
    )
    for alert in ("RlogNoLeader", "RlogNoQuorum", "RlogReplicaNotVoting"):
        prom.wait_inactive(alert)

    # total data loss: every volume wiped, every replica comes back EMPTY
    for i in range(3):
        cluster.wipe(i)
    for i in range(3):
        cluster.start_replica(i)
    prom.wait_firing("RlogDataLoss", {**log_labels, "phase": "DataLoss"})
    prom.wait_firing("RlogNoQuorum", log_labels)
    phase = prom.query(f'rlog_operator_log_phase{{namespace="{NAMESPACE}", name="{LOG}"}} == 1')
    assert [r["metric"]["phase"] for r in phase] == ["DataLoss"]


def test_dashboard_picture_has_no_panel_error(stack: Stack, chart: Chart, tmp_path: Path) -> None:
    """The chart's dashboard drawn from the real Prometheus over the whole module (the write
    load, then the real faults above): no panel shows an error or "No data". With
    RLOG_DASHBOARD_PNG set (make dashboard-png), the picture is written there too."""
    out = Path(os.environ.get("RLOG_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    note = (
        "A 3-replica log under a small write load, then real faults: a stuck rolling update, "
        "SIGKILL of the leader and one more replica, a wiped volume, total data loss."
    )
    drawn = dashboard_png.render(
        chart.dashboard, stack.prom.url, stack.started, time.time(), out, note
    )
    assert [p.title for p in drawn] == [p["title"] for p in chart.dashboard["panels"]]
    assert not [(p.title, p.error) for p in drawn if p.error]
    for panel in drawn:
        assert all(s.name for s in panel.series), (panel.title, panel.series)
    width, height = _png_size(out)
    assert width >= 1600 and height >= 1600, (width, height)
