"""The chart's PrometheusRule, checked by a real promtool: it parses and every alert passes
unit tests on synthetic series (alerts_test.yaml): fires when it should, not before its
`for:` runs out, and stays silent on a healthy log."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml
from monlib import HERE, Chart, Tools, render, write_rules

ALERTS = {
    "RlogNoQuorum",
    "RlogNoLeader",
    "RlogReplicaNotVoting",
    "RlogDataLoss",
    "RlogRollingUpdateStuck",
    "RlogDiskFull",
    "RlogArchiveLag",
    "RlogCorruptRecordRepaired",
    "RlogStorageLost",
    "RlogStorageRefused",
    "RlogDiskFailing",
    "RlogRestoreFailed",
    "RlogReplicaCrashLooping",
    "RlogReplicaNodeLost",
    "RlogOperatorAbsent",
}
UNIT_TESTS = HERE / "alerts_test.yaml"


def _promtool(tools: Tools, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tools.promtool, *args], capture_output=True, text=True, timeout=60, cwd=cwd
    )


def test_the_rendered_rules_are_the_expected_alerts(chart: Chart) -> None:
    rules = [r for g in chart.rule["spec"]["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == ALERTS
    by_name = {r["alert"]: r for r in rules}
    assert by_name["RlogReplicaNotVoting"]["for"] == "10m"
    assert by_name["RlogNoLeader"]["for"] == "5m"
    assert by_name["RlogRollingUpdateStuck"]["for"] == "30m"
    assert by_name["RlogDiskFull"]["for"] == "1m"
    assert by_name["RlogArchiveLag"]["for"] == "5m"
    assert by_name["RlogReplicaCrashLooping"]["for"] == "5m"
    assert by_name["RlogReplicaNodeLost"]["for"] == "5m"
    assert by_name["RlogStorageRefused"]["for"] == by_name["RlogDiskFailing"]["for"] == "1m"
    assert by_name["RlogOperatorAbsent"]["for"] == "10m"
    # Grafana/Helm templating was escaped: Prometheus sees its own {{ $labels.x }}
    for rule in rules:
        if rule["alert"] != "RlogOperatorAbsent":  # of no log: no labels to name
            assert "{{ $labels." in rule["annotations"]["summary"], rule["alert"]


def test_every_alert_links_its_runbook_section(chart: Chart) -> None:
    """runbook_url is the chart's base and the alert's section in docs/runbooks.md, and
    that section exists (GitHub's anchor: the heading in lower case)."""
    runbooks = (HERE.parents[1] / "docs" / "runbooks.md").read_text()
    anchors = {line[3:].strip().lower() for line in runbooks.splitlines() if line.startswith("## ")}
    for group in chart.rule["spec"]["groups"]:
        for rule in group["rules"]:
            url = rule["annotations"]["runbook_url"]
            base, _, anchor = url.partition("#")
            assert base == "docs/runbooks.md", url
            assert anchor == rule["alert"].lower() and anchor in anchors, (url, sorted(anchors))


def test_the_operator_absent_alert_needs_the_service_monitor(tools: Tools) -> None:
    """Without the ServiceMonitor Prometheus never sees the operator: the alert is not
    rendered (it would always fire)."""
    rendered = render(tools.helm, "--set", "metrics.serviceMonitor.enabled=false")
    rule = next(d for d in rendered if d["kind"] == "PrometheusRule")
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert "RlogOperatorAbsent" not in names and "RlogNoQuorum" in names


def test_promtool_check_rules(tools: Tools, chart: Chart, tmp_path: Path) -> None:
    rules = write_rules(chart, tmp_path / "rules.yaml")
    done = _promtool(tools, "check", "rules", str(rules), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout + done.stderr


def test_promtool_check_rules_rejects_a_broken_rule(tools: Tools, tmp_path: Path) -> None:
    """The check above can fail: a rule with a bad expression is refused."""
    bad = {"groups": [{"name": "x", "rules": [{"alert": "A", "expr": "sum by (x) (up"}]}]}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    done = _promtool(tools, "check", "rules", "bad.yaml", cwd=tmp_path)
    assert done.returncode != 0


def test_every_alert_has_a_firing_and_a_silent_unit_test() -> None:
    spec = yaml.safe_load(UNIT_TESTS.read_text())
    cases = [c for t in spec["tests"] for c in t.get("alert_rule_test", [])]
    fires = {c["alertname"] for c in cases if c["exp_alerts"]}
    silent = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert fires == ALERTS, f"no firing case for {ALERTS - fires}"
    assert silent == ALERTS, f"no silent case for {ALERTS - silent}"


def test_promtool_test_rules(tools: Tools, chart: Chart, tmp_path: Path) -> None:
    write_rules(chart, tmp_path / "rules.yaml")
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    done = _promtool(tools, "test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_promtool_test_rules_catches_a_wrong_expectation(
    tools: Tools, chart: Chart, tmp_path: Path
) -> None:
    """The unit tests can fail: RlogNoLeader expected one evaluation before its 5m `for`
    runs out is reported as a failure."""
    write_rules(chart, tmp_path / "rules.yaml")
    spec = yaml.safe_load(UNIT_TESTS.read_text())
    (test,) = [t for t in spec["tests"] if t["name"] == "no leader"]
    early = next(c for c in test["alert_rule_test"] if c["eval_time"] == "6m")
    firing = next(c for c in test["alert_rule_test"] if c["exp_alerts"])
    early["exp_alerts"] = firing["exp_alerts"]
    spec["tests"] = [test]
    (tmp_path / "wrong_test.yaml").write_text(yaml.safe_dump(spec))
    done = _promtool(tools, "test", "rules", "wrong_test.yaml", cwd=tmp_path)
    assert done.returncode != 0
    assert "RlogNoLeader" in done.stdout + done.stderr
