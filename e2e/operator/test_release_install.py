"""`make release` installs: its images and its packaged chart alone, with the chart's
defaults, make a working log (README.md, "Install on your own cluster").

The release is written by e2e/cluster/release.sh into a temporary dist/, its two image
archives are imported into the local cluster's containerd (as `kind load image-archive`
would on kind), and the chart archive is installed with no image values at all: the pods
must run the tags the chart names by default, the version's SemVer spelling. A log in a
namespace of its own then turns Ready with every replica VOTING, and the release's one-file
`kubectl rlog` (the krew archive) shows it, run by the system's python3 alone."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2elib import Kubectl, wait_until
from oplib import created_log

from rlog import __version__
from rlog.version import semver

# Day-two operations: `make e2e-extended` runs them alone; `make test` with the rest.
pytestmark = pytest.mark.extended

ROOT = Path(__file__).resolve().parents[2]
VERSION = semver(__version__)
CONTAINERD = "/run/rlog-cluster/containerd.sock"  # the local cluster's (e2e/cluster/lib.sh)


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.path.exists(CONTAINERD):
        pytest.skip("imports images into the local cluster's containerd (make cluster-up)")
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        ["bash", str(ROOT / "e2e" / "cluster" / "release.sh")],
        env={**os.environ, "RLOG_DIST": str(out)},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return out


@pytest.fixture(scope="module")
def released_operator(dist: Path) -> Iterator[tuple[str, str]]:
    """The release's operator, installed from its chart archive with the chart's default
    images, serving one namespace; yields (operator namespace, log namespace)."""
    for name in ("rlog-replica", "rlog-operator"):
        archive = dist / f"{name}-image-{VERSION}.tar"
        subprocess.run(
            ["ctr", "-a", CONTAINERD, "-n", "k8s.io", "images", "import", str(archive)],
            check=True, capture_output=True, timeout=600,
        )  # fmt: skip
    suffix = uuid.uuid4().hex[:6]
    operator_ns, log_ns = f"rlog-release-{suffix}", f"release-logs-{suffix}"
    cluster = Kubectl()
    cluster.run("create", "namespace", log_ns, namespaced=False)
    installed = subprocess.run(
        ["helm", "install", "rlog-operator", str(dist / f"rlog-operator-{VERSION}.tgz"),
         "-n", operator_ns, "--create-namespace",
         "--set", f"watchNamespaces={{{log_ns}}}", "--wait", "--timeout", "300s"],
        capture_output=True, text=True, timeout=360,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    try:
        yield operator_ns, log_ns
    finally:
        if os.environ.get("E2E_KEEP_NAMESPACE") != "1":
            subprocess.run(["helm", "uninstall", "rlog-operator", "-n", operator_ns, "--wait"],
                           timeout=180)  # fmt: skip
            for ns in (log_ns, operator_ns):
                cluster.run("delete", "namespace", ns, "--wait=false", check=False,
                            namespaced=False)  # fmt: skip


def bundled_plugin(dist: Path) -> Path:
    """`kubectl-rlog` out of the release's krew archive (e2e/cluster/plugin_bundle.py)."""
    with tarfile.open(dist / f"kubectl-rlog-{VERSION}.tar.gz") as tar:
        tar.extract("kubectl-rlog", dist, filter="data")
    return dist / "kubectl-rlog"


def test_the_release_alone_makes_a_working_log(
    released_operator: tuple[str, str], dist: Path
) -> None:
    operator_ns, log_ns = released_operator
    operator = Kubectl(operator_ns)
    pods = operator.json("get", "pods")["items"]
    assert pods and all(
        c["image"] == f"docker.io/rlog/rlog-operator:{VERSION}"
        for pod in pods
        for c in pod["spec"]["containers"]
    ), [c["image"] for pod in pods for c in pod["spec"]["containers"]]
    with created_log(log_ns, "released") as log:
        images = {
            c["image"]
            for pod in log.k.json("get", "pods", "-l", "app.kubernetes.io/instance=released")[
                "items"
            ]
            for c in pod["spec"]["containers"]
        }
        assert images == {f"docker.io/rlog/rlog-replica:{VERSION}"}, images
        wait_until("every replica VOTING", log.all_voting, 120, 2)
        # the release's one-file plugin (krew's archive) on the system's bare python3
        plugin = bundled_plugin(dist)
        shown = subprocess.run(
            ["/usr/bin/python3", "-I", str(plugin), "-n", log_ns, "status", "released",
             "-o", "json"],
            env={"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/root"),
                 **{k: v for k, v in os.environ.items() if k == "KUBECONFIG"}},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        status = json.loads(shown.stdout)
        assert (status["name"], status["namespace"]) == ("released", log_ns), status
        replicas = status["status"]["replicas"]
        assert [r["status"] for r in replicas] == ["VOTING"] * 3, replicas
