"""Fixtures of the operator e2e suite: the rlog-operator chart, packaged as `make release`
ships it, installed once per session into its own namespace with the locally built images
(IfNotPresent), uninstalled afterwards.

Environment:
  E2E_OPERATOR_IMAGE   operator image repository:tag (default docker.io/rlog/rlog-operator:dev)
  E2E_REPLICA_IMAGE    replica image repository:tag (default docker.io/rlog/rlog-replica:dev)
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import asdict

import pytest
from e2elib import Kubectl, wait_until

CHART_SOURCE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "helm",
    "rlog-operator",
)
OPERATOR_IMAGE = os.environ.get("E2E_OPERATOR_IMAGE", "docker.io/rlog/rlog-operator:dev")
REPLICA_IMAGE = os.environ.get("E2E_REPLICA_IMAGE", "docker.io/rlog/rlog-replica:dev")


def packaged_chart(directory: str) -> str:
    """The chart as a user gets it, `helm package`d into `directory` (what `make release`
    ships): the suite installs that, not the source tree, so a file the package leaves out
    (the CRD, the dashboard, a template) fails the suite. Returns the .tgz's path."""
    out = _helm("package", CHART_SOURCE, "-d", directory).stdout
    # "Successfully packaged chart and saved it to: <path>"
    path = out.strip().rsplit(": ", 1)[-1]
    if not path.endswith(".tgz") or not os.path.isfile(path):
        raise AssertionError(f"helm package wrote no chart archive: {out!r}")
    return path


@pytest.fixture(scope="session")
def chart(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The packaged chart (`packaged_chart`), once per session (per worker)."""
    return packaged_chart(str(tmp_path_factory.mktemp("chart")))


def _helm(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    p = subprocess.run(["helm", *args], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed ({p.returncode}): {p.stderr}")
    return p


@pytest.fixture(scope="session")
def operator(cluster: Kubectl, namespace: str, chart: str) -> Iterator[str]:
    """Install the packaged chart into a fresh namespace, serving only the test namespace
    (so another operator on the cluster, e.g. `make demo`'s, never touches the tests' logs);
    yields the operator's namespace."""
    if shutil.which("helm") is None:
        pytest.fail("helm is not on the PATH (make cluster-up puts it in /usr/local/bin)")
    ns = f"rlog-op-{uuid.uuid4().hex[:6]}"
    release = "rlog-operator"
    op_repo, op_tag = OPERATOR_IMAGE.rsplit(":", 1)
    rep_repo, rep_tag = REPLICA_IMAGE.rsplit(":", 1)
    _helm(
        "install", release, chart, "-n", ns, "--create-namespace",
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


# `make e2e-operator` runs two workers, a test file at a time (--dist loadfile: a module's
# fixtures, a log that takes half a minute to settle, are built once). Each worker has its
# own session namespace and operator (session fixtures are per worker); the chart names its
# cluster-wide objects after the operator's namespace, so the installs do not meet. What
# the workers share is the cluster's one ReplicatedLog CRD: `crd_held`. (Not --dist
# loadgroup: with pytest 9.2, xdist 3.8's groups are silently ignored, it renames nodes
# through an attribute pytest no longer reads.)
CRD_LOCK = os.path.join(tempfile.gettempdir(), "rlog-e2e-crd.lock")


@pytest.fixture
def crd_held() -> Iterator[None]:
    """The cluster's ReplicatedLog CRD, held for the test against the suite's other worker
    (and any other run of the suite on this machine): a test that replaces it with a copy
    without its rules, or applies the repository's again, must not meet another doing so."""
    with open(CRD_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


# What each disruption cost the continuous writer, as the reports bring it to the process
# that prints the summary (under xdist the writers ran in the workers)
_DISRUPTIONS: list[dict] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "teardown":  # its properties hold everything the test recorded
        _DISRUPTIONS.extend(v for k, v in report.user_properties if k == "disruption")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """What each disruption cost the continuous writer (the failed-call count per
    disruption), from every Writer of the run."""
    if not _DISRUPTIONS:
        return
    terminalreporter.section("continuous writer per disruption")
    terminalreporter.write_line(
        f"{'test':<62} {'disruption':<40} {'acked':>6} {'failed':>6} {'s':>6}"
    )
    for d in _DISRUPTIONS:
        terminalreporter.write_line(
            f"{d['test'][:62]:<62} {d['what'][:40]:<40} {d['acknowledged']:>6} "
            f"{d['failed_calls']:>6} {d['seconds']:>6.0f}"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed test prints the cluster's state as it was at the failure (before the
    fixtures' teardown deletes it): the pods, logs and events that say why a wait ran out.
    After the teardown, the writers' disruptions of the test go into its report."""
    if call.when == "teardown":
        from oplib import DISRUPTIONS

        item.user_properties.extend(("disruption", asdict(d)) for d in DISRUPTIONS)
        DISRUPTIONS.clear()
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
