"""Tools the tests need that are not Python packages: found, or built from the Go module
proxy into the same cache the cluster scripts use (never skipped for want of them)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "rlog-operator"
CLUSTER_LIB = ROOT / "e2e" / "cluster" / "lib.sh"
INSTALL_TIMEOUT = 3600.0

# the chart with every monitoring object on, as in a cluster with the Prometheus Operator
ALL_ON = [
    "--set", "prometheusRule.enabled=true",
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "metrics.podMonitor.enabled=true",
]  # fmt: skip


def _go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else ""
    )
    if not go:
        raise RuntimeError("Go is needed to build helm (not on PATH, not /usr/local/go/bin/go)")
    return go


def _cached_go_build(name: str, version: str, package: str, ldflags: str) -> str:
    """`go install package@version` once into the cluster scripts' cache (the same dir
    e2e/cluster/build-tools.sh uses), then the binary from there."""
    cache = Path(os.environ.get("RLOG_CLUSTER_CACHE", Path.home() / ".cache" / "rlog-cluster"))
    bindir = cache / f"{name}-{version}" / "bin"
    binary = bindir / name
    if binary.exists():
        return str(binary)
    bindir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOBIN=str(bindir), CGO_ENABLED="0", GOTOOLCHAIN="local")
    env.setdefault("GOFLAGS", "-buildvcs=false")
    done = subprocess.run(
        [_go(), "install", "-trimpath", "-ldflags", ldflags, f"{package}@{version}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=INSTALL_TIMEOUT,
        cwd=str(cache),
    )
    if done.returncode != 0:
        raise RuntimeError(f"building {name} {version} failed:\n{done.stderr[-3000:]}")
    return str(binary)


def find_or_build_helm() -> str:
    """helm from PATH, else the cluster scripts' cached build, else build that same pinned
    version into the same cache dir (as e2e/cluster/build-tools.sh does)."""
    found = shutil.which("helm")
    if found:
        return found
    match = re.search(r"HELM_VERSION=\$\{HELM_VERSION:-(v[0-9.]+)\}", CLUSTER_LIB.read_text())
    if not match:
        raise RuntimeError(f"cannot find HELM_VERSION in {CLUSTER_LIB}")
    version = os.environ.get("HELM_VERSION", match.group(1))
    ldflags = f"-s -w -X helm.sh/helm/v3/internal/version.version={version}"
    return _cached_go_build("helm", version, "helm.sh/helm/v3/cmd/helm", ldflags)


# `helm template` renders for Kubernetes v1.20 unless told otherwise, which the chart's
# kubeVersion (>=1.28) refuses: render for the version every test runs on.
KUBE_VERSION = "v1.34.4"


def helm_template(helm: str, release: str, *args: str) -> list[dict[str, Any]]:
    """The chart's objects as `helm template RELEASE` renders them with `args`."""
    out = subprocess.run(
        [helm, "template", release, str(CHART), "--kube-version", KUBE_VERSION, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


KREW_VERSION = "v0.4.3"  # sigs.k8s.io/krew, the kubectl plugin manager


def find_or_build_krew() -> str:
    """krew (tests/operator/test_plugin_bundle.py installs the plugin with it): from PATH,
    else built once from the Go module proxy into the cluster scripts' cache."""
    found = shutil.which("krew") or shutil.which("kubectl-krew")
    if found:
        return found
    return _cached_go_build("krew", KREW_VERSION, "sigs.k8s.io/krew/cmd/krew", "-s -w")
