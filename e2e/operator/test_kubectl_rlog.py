"""`kubectl rlog` against a real log (conftest.py installs the operator): every command,
and its errors. Runs the plugin as kubectl does (`kubectl rlog ...` when `kubectl-rlog`
is on the PATH, else the same module with this Python). For the lead to run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2elib import wait_until
from oplib import Log, created_log, plugin

# Day-two operations: `make e2e-extended` runs them alone; `make test` with the rest.
pytestmark = pytest.mark.extended

NAME = "plugin-log"


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME, settle=True) as log:
        yield log


def test_status_lists_every_replica(log: Log, namespace: str) -> None:
    table = plugin(namespace, "status", NAME).stdout
    print(table)
    assert table.startswith(f"{NAME}: Ready")
    for pod in log.pods:
        row = next(line for line in table.splitlines() if line.startswith(pod))
        assert row.split()[1] == "VOTING", row


def test_pause_and_resume(log: Log, namespace: str) -> None:
    plugin(namespace, "pause", NAME)
    wait_until("status.paused", lambda: log.status().get("paused") is True, 60, 1)
    assert "PAUSED" in plugin(namespace, "status", NAME).stdout
    columns = log.k("get", "replicatedlog", NAME)
    assert "true" in columns.splitlines()[1], columns
    plugin(namespace, "resume", NAME)
    wait_until("status.paused false", lambda: log.status().get("paused") is False, 60, 1)


def test_step_down_moves_the_leader(log: Log, namespace: str) -> None:
    before = str(log.status().get("leader") or "")
    plugin(namespace, "step-down", NAME)
    wait_until(
        "another leader",
        lambda: (log.status().get("leader") or before) != before and log.all_voting(),
        120,
        1,
    )
    annotations = log.body()["metadata"].get("annotations") or {}
    assert "rlog.io/step-down" not in annotations, annotations


def test_replace_volume_of_a_follower(log: Log, namespace: str) -> None:
    leader = str(log.status().get("leader") or "")
    victim = next(p for p in reversed(log.pods) if p != leader)
    claim_uid = log.k.json("get", "pvc", f"data-{victim}")["metadata"]["uid"]
    plugin(namespace, "replace-volume", NAME, victim.rsplit("-", 1)[1])

    def fresh() -> bool:
        got = log.k.run("get", "pvc", f"data-{victim}", "-o", "json", check=False)
        import json

        return (
            got.returncode == 0
            and json.loads(got.stdout)["metadata"]["uid"] != claim_uid
            and log.all_voting()
        )

    wait_until(f"{victim} VOTING on a fresh claim", fresh, 300, 2)


def test_errors_are_one_line(log: Log, namespace: str) -> None:
    out = plugin(namespace, "status", "no-such-log", check=False)
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        == f"kubectl rlog: no ReplicatedLog 'no-such-log' in namespace {namespace}"
    )
    out = plugin(namespace, "replace-volume", NAME, "7", check=False)
    assert out.returncode == 1 and "out of range" in out.stderr, out.stderr
    out = plugin(namespace, "reinitialize", NAME, check=False)
    assert out.returncode == 1 and "not DataLoss" in out.stderr, out.stderr


def test_shell_completion_offers_the_logs_of_the_namespace(log: Log, namespace: str) -> None:
    """kubectl's own completion (`kubectl __complete`, what a shell's TAB runs) finds
    `kubectl_complete-rlog` on the PATH and offers this namespace's logs; the same module
    with this Python where the plugin is not installed."""
    if shutil.which("kubectl-rlog") and shutil.which("kubectl_complete-rlog"):
        cmd = ["kubectl", "__complete", "rlog", "status", "-n", namespace, "plug"]
    else:
        cmd = [sys.executable, "-m", "rlog_operator.plugin.completion"]
        cmd += ["status", "-n", namespace, "plug"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert NAME in lines, out.stdout
    assert lines[-1] == ":4", out.stdout  # no file names


def test_the_list_json_and_all_namespaces(log: Log, namespace: str) -> None:
    listed = plugin(namespace, "status").stdout.splitlines()
    row = next(line.split() for line in listed if NAME in line.split())
    assert row[:3] == [namespace, NAME, "Ready"], listed
    everywhere = subprocess.run(
        [sys.executable, "-m", "rlog_operator.plugin", "status", "-A"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert everywhere.returncode == 0, everywhere.stderr
    assert any(line.split()[:2] == [namespace, NAME] for line in everywhere.stdout.splitlines())
    document = json.loads(plugin(namespace, "status", NAME, "-o", "json").stdout)
    assert document["name"] == NAME and document["namespace"] == namespace
    assert document["status"]["phase"] == "Ready"
    assert [r["name"] for r in document["status"]["replicas"]] == log.pods
    listing = json.loads(plugin(namespace, "status", "-o", "json").stdout)
    assert NAME in [item["name"] for item in listing["items"]]


def test_version_names_the_replicas_build_and_the_operators(log: Log, namespace: str) -> None:
    document = json.loads(plugin(namespace, "version", "-o", "json").stdout)
    images = document["logs"][f"{namespace}/{NAME}"]
    assert sum(images.values()) == len(log.pods), images
    assert all("rlog-replica" in image for image in images), images
    assert document["operator"], document  # the e2e suite's operator pods
    assert all(
        any("rlog-operator" in image for image in pod_images)
        for pod_images in document["operator"].values()
    ), document["operator"]
    text = plugin(namespace, "version").stdout
    assert text.startswith("kubectl-rlog ") and f"replicas of {namespace}/{NAME}:" in text


def test_logs_prefix_each_replicas_lines(log: Log, namespace: str) -> None:
    lines = plugin(namespace, "logs", NAME, "--tail", "50").stdout.splitlines()
    for pod in log.pods:
        mine = [line for line in lines if line.startswith(f"[{pod}] ")]
        assert mine, f"no line of {pod}"
        assert len(mine) <= 50
    assert all(line.startswith("[") for line in lines)


def test_report_bundles_what_support_asks_for(log: Log, namespace: str, tmp_path: Path) -> None:
    path = tmp_path / "report.tar.gz"
    said = plugin(namespace, "report", NAME, "-f", str(path)).stdout
    assert said.startswith(f"{path}: ")
    with tarfile.open(path) as bundle:
        names = {member.name.split("/", 1)[1] for member in bundle.getmembers()}
        status = json.loads(_member(bundle, f"{NAME}-report/status.json"))
        objects = _member(bundle, f"{NAME}-report/objects.yaml")
    assert {"README.txt", "log.yaml", "status.txt", "events.yaml", "version.txt"} <= names
    assert {f"logs/{pod}.log" for pod in log.pods} <= names
    assert any(name.startswith("operator/") for name in names), names
    assert status["status"]["phase"] == "Ready"
    assert objects.startswith("statefulsets:") and f"name: {NAME}" in objects
    assert "managedFields" not in objects


def _member(bundle: tarfile.TarFile, name: str) -> str:
    found = bundle.extractfile(name)
    assert found is not None, name
    return found.read().decode()
