"""Tools for the monitoring tests: a real Prometheus and promtool (built from the Go module
proxy by e2e/monitoring/prometheus.sh, cached under ~/.cache/rlog-prometheus) and helm (to
render the chart exactly as `helm install` would).

Nothing is skipped: a missing tool is installed, and if it cannot be, every test here fails
with the installer's message. The installs run once per session in `pytest_collection_finish`
(not in a fixture) so that a cold Prometheus build (minutes on 2 cores) is not cut short by
the per-test timeout.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from monlib import HERE, TOOLS, Chart, Tools, install, render


def pytest_collection_finish(session: pytest.Session) -> None:
    if TOOLS.prometheus or TOOLS.error or session.config.option.collectonly:
        return
    if any(HERE in Path(str(item.path)).parents for item in session.items):
        install()


@pytest.fixture(scope="session")
def tools() -> Tools:
    if not TOOLS.prometheus and not TOOLS.error:  # collection_finish did not run for us
        install()
    if TOOLS.error:
        pytest.fail(f"monitoring tools could not be installed: {TOOLS.error}", pytrace=False)
    return TOOLS


@pytest.fixture(scope="session")
def chart(tools: Tools) -> Chart:
    docs = render(tools.helm)

    def one(kind: str) -> dict[str, Any]:
        found = [d for d in docs if d["kind"] == kind]
        assert len(found) == 1, f"expected one {kind}, the chart renders {len(found)}"
        return found[0]

    config_map = next(
        d for d in docs if d["kind"] == "ConfigMap" and "rlog.json" in d.get("data", {})
    )
    return Chart(
        rule=one("PrometheusRule"),
        pod_monitor=one("PodMonitor"),
        service_monitor=one("ServiceMonitor"),
        service=one("Service"),
        dashboard=json.loads(config_map["data"]["rlog.json"]),
    )
