"""Shared helpers of the monitoring tests (tool installs, chart rendering)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
CHART = ROOT / "helm" / "rlog-operator"
PROMETHEUS_SH = ROOT / "e2e" / "monitoring" / "prometheus.sh"
CLUSTER_LIB = ROOT / "e2e" / "cluster" / "lib.sh"
INSTALL_TIMEOUT = 3600.0

# every monitoring object on, as in a cluster with the Prometheus Operator
ALL_ON = [
    "--set", "prometheusRule.enabled=true",
    "--set", "metrics.serviceMonitor.enabled=true",
    "--set", "metrics.podMonitor.enabled=true",
]  # fmt: skip
RELEASE = "rlog"
RELEASE_NAMESPACE = "rlog-system"  # where the operator (and its metrics Service) runs


@dataclass
class Tools:
    prometheus: str = ""
    promtool: str = ""
    helm: str = ""
    error: str = ""


TOOLS = Tools()


def _go() -> str:
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else ""
    )
    if not go:
        raise RuntimeError("Go is needed to build helm (not on PATH, not /usr/local/go/bin/go)")
    return go


def _find_or_build_helm() -> str:
    """helm from PATH, else the cluster scripts' cached build, else build that same pinned
    version into the same cache dir (as e2e/cluster/build-tools.sh does)."""
    found = shutil.which("helm")
    if found:
        return found
    match = re.search(r"HELM_VERSION=\$\{HELM_VERSION:-(v[0-9.]+)\}", CLUSTER_LIB.read_text())
    if not match:
        raise RuntimeError(f"cannot find HELM_VERSION in {CLUSTER_LIB}")
    version = os.environ.get("HELM_VERSION", match.group(1))
    cache = Path(os.environ.get("RLOG_CLUSTER_CACHE", Path.home() / ".cache" / "rlog-cluster"))
    bindir = cache / f"helm-{version}" / "bin"
    if (bindir / "helm").exists():
        return str(bindir / "helm")
    bindir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, GOBIN=str(bindir), CGO_ENABLED="0", GOTOOLCHAIN="local")
    env.setdefault("GOFLAGS", "-buildvcs=false")
    ldflags = f"-s -w -X helm.sh/helm/v3/internal/version.version={version}"
    done = subprocess.run(
        [_go(), "install", "-trimpath", "-ldflags", ldflags, f"helm.sh/helm/v3/cmd/helm@{version}"],
        capture_output=True,
        text=True,
        env=env,
        timeout=INSTALL_TIMEOUT,
        cwd=str(cache),
    )
    if done.returncode != 0:
        raise RuntimeError(f"building helm {version} failed:\n{done.stderr[-3000:]}")
    return str(bindir / "helm")


def install() -> None:
    try:
        done = subprocess.run(
            [str(PROMETHEUS_SH)], capture_output=True, text=True, timeout=INSTALL_TIMEOUT
        )
        if done.returncode != 0:
            raise RuntimeError(f"{PROMETHEUS_SH} failed:\n{done.stderr[-3000:]}")
        bindir = Path(done.stdout.strip().splitlines()[-1])
        TOOLS.prometheus = str(bindir / "prometheus")
        TOOLS.promtool = str(bindir / "promtool")
        TOOLS.helm = _find_or_build_helm()
    except (OSError, RuntimeError, subprocess.TimeoutExpired, IndexError) as e:
        TOOLS.error = f"{type(e).__name__}: {e}"


def render(helm: str, *args: str) -> list[dict[str, Any]]:
    out = subprocess.run(
        [helm, "template", RELEASE, str(CHART), "--namespace", RELEASE_NAMESPACE, *ALL_ON, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@dataclass
class Chart:
    rule: dict[str, Any]  # the PrometheusRule
    pod_monitor: dict[str, Any]
    service_monitor: dict[str, Any]
    service: dict[str, Any]  # the operator's metrics Service
    dashboard: dict[str, Any]  # the Grafana dashboard JSON from the ConfigMap


def write_rules(chart: Chart, path: Path) -> Path:
    """The PrometheusRule's spec is a Prometheus rule file ({groups: [...]})."""
    path.write_text(yaml.safe_dump(chart.rule["spec"], sort_keys=False))
    return path
