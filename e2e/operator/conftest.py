"""Fixtures of the operator e2e suite: the rlog-operator chart installed once per session
into its own namespace with the locally built images (IfNotPresent), uninstalled afterwards.

Environment:
  E2E_OPERATOR_IMAGE   operator image repository:tag (default docker.io/rlog/rlog-operator:dev)
  E2E_REPLICA_IMAGE    replica image repository:tag (default docker.io/rlog/rlog-replica:dev)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from e2elib import Kubectl, wait_until

CHART = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "helm",
    "rlog-operator",
)
OPERATOR_IMAGE = os.environ.get("E2E_OPERATOR_IMAGE", "docker.io/rlog/rlog-operator:dev")
REPLICA_IMAGE = os.environ.get("E2E_REPLICA_IMAGE", "docker.io/rlog/rlog-replica:dev")


def _helm(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    p = subprocess.run(["helm", *args], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


@pytest.fixture(scope="session")
def operator(cluster: Kubectl, namespace: str) -> Iterator[str]:
    """Install the chart into a fresh namespace, serving only the test namespace (so another
    operator on the cluster, e.g. `make demo`'s, never touches the tests' logs); yields the
    operator's namespace."""
    if shutil.which("helm") is None:
        pytest.fail("helm is not on the PATH (make cluster-up puts it in /usr/local/bin)")
    ns = f"rlog-op-{uuid.uuid4().hex[:6]}"
    release = "rlog-operator"
    op_repo, op_tag = OPERATOR_IMAGE.rsplit(":", 1)
    rep_repo, rep_tag = REPLICA_IMAGE.rsplit(":", 1)
    _helm(
        "install", release, CHART, "-n", ns, "--create-namespace",
        "--set", f"image.repository={op_repo}", "--set", f"image.tag={op_tag}",
        "--set", "image.pullPolicy=IfNotPresent",
        "--set", f"replicaImage.repository={rep_repo}", "--set", f"replicaImage.tag={rep_tag}",
        "--set", "replicaImage.pullPolicy=IfNotPresent",
        "--set", f"watchNamespaces={{{namespace}}}",
        "--wait", "--timeout", "180s",
    )  # fmt: skip
    k = Kubectl(ns)
    wait_until(
        "the operator deployment to be available",
        lambda: k.run(
            "wait", "deployment", "--all", "--for=condition=Available", "--timeout=5s",
            check=False,
        ).returncode == 0,
        180,
    )  # fmt: skip
    yield ns
    if os.environ.get("E2E_KEEP_NAMESPACE") != "1":
        subprocess.run(["helm", "uninstall", release, "-n", ns, "--wait"], timeout=180)
        cluster.run("delete", "namespace", ns, "--wait=false", check=False, namespaced=False)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What each disruption cost the continuous writer (the failed-call count per
    disruption), from every Writer of the run."""
    from oplib import DISRUPTIONS

    if not DISRUPTIONS:
        return
    terminalreporter.section("continuous writer per disruption")
    terminalreporter.write_line(
        f"{'test':<62} {'disruption':<40} {'acked':>6} {'failed':>6} {'s':>6}"
    )
    for d in DISRUPTIONS:
        terminalreporter.write_line(
            f"{d.test[:62]:<62} {d.what[:40]:<40} {d.acknowledged:>6} {d.failed_calls:>6} "
            f"{d.seconds:>6.0f}"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed test prints the cluster's state as it was at the failure (before the
    fixtures' teardown deletes it): the pods, logs and events that say why a wait ran out."""
    outcome = yield
    report = outcome.get_result()
    if report.when not in ("setup", "call") or not report.failed:
        return
    funcargs = getattr(item, "funcargs", {})
    namespace = funcargs.get("namespace")
    if not isinstance(namespace, str):
        return
    from diagnose import cluster_state

    operator_namespace = funcargs.get("operator")
    report.sections.append(
        (
            "cluster state at the failure",
            cluster_state(
                namespace, operator_namespace if isinstance(operator_namespace, str) else None
            ),
        )
    )
