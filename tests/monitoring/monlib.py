"""Shared helpers of the monitoring tests (tool installs, chart rendering)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from toolchain import ALL_ON, find_or_build_helm, helm_template

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PROMETHEUS_SH = ROOT / "e2e" / "monitoring" / "prometheus.sh"
INSTALL_TIMEOUT = 3600.0

RELEASE = "rlog"
RELEASE_NAMESPACE = "rlog-system"  # where the operator (and its metrics Service) runs


@dataclass
class Tools:
    prometheus: str = ""
    promtool: str = ""
    helm: str = ""
    error: str = ""


TOOLS = Tools()


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
        TOOLS.helm = find_or_build_helm()
    except (OSError, RuntimeError, subprocess.TimeoutExpired, IndexError) as e:
        TOOLS.error = f"{type(e).__name__}: {e}"


def render(helm: str, *args: str) -> list[dict[str, Any]]:
    return helm_template(helm, RELEASE, "--namespace", RELEASE_NAMESPACE, *ALL_ON, *args)


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
