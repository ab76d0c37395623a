"""The operator's entry point and handler registration, without a cluster."""

from __future__ import annotations

import subprocess
import sys

from prometheus_client import REGISTRY


def test_help_works_without_a_cluster() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "from rlog_operator.main import main; main(['--help'])"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    assert "rlog-operator" in out.stdout


def test_importing_main_is_cheap() -> None:
    code = "import sys, rlog_operator.main; print('kopf' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "False", out.stderr


def test_handlers_register_for_replicatedlogs() -> None:
    import kopf

    from rlog_operator import handlers

    registry = kopf.get_default_registry()
    names = {h.id for h in registry._changing.get_all_handlers()}
    assert any("reconcile" in n for n in names)
    timers = list(registry._spawning.get_all_handlers())
    assert any("observe" in t.id for t in timers)
    assert handlers.TIMER_INTERVAL == 1.0  # fresh status (docs/operator.md)


def test_metrics_count_replicas_by_status() -> None:
    from rlog_operator import metrics

    status = {
        "phase": "Degraded",
        "replicas": [{"status": "VOTING"}, {"status": "VOTING"}, {"status": None}],
    }
    metrics.observe_status("ns", "log", status)

    def value(st: str) -> float | None:
        return REGISTRY.get_sample_value(
            "rlog_operator_replicas", {"namespace": "ns", "name": "log", "status": st}
        )

    assert value("VOTING") == 2
    assert value("Unknown") == 1
    phase = {"namespace": "ns", "name": "log", "phase": "Degraded"}
    assert REGISTRY.get_sample_value("rlog_operator_log_phase", phase) == 1

    metrics.forget("ns", "log")  # the log was deleted: no series left to alert on
    assert value("VOTING") is None and value("Unknown") is None
    assert REGISTRY.get_sample_value("rlog_operator_log_phase", phase) is None
    metrics.forget("ns", "log")  # twice is harmless


def test_lease_and_liveness_arguments() -> None:
    from rlog_operator import main

    args = main.parse_args(["--lease", "rlog-op", "--liveness", "http://0.0.0.0:8181/healthz"])
    assert args.lease == "rlog-op"
    assert main.liveness_port(args.liveness) == 8181


def test_the_operator_says_its_build_in_a_metric() -> None:
    import platform

    from rlog import __version__
    from rlog_operator import metrics

    assert metrics.BUILD is not None
    labels = {
        "component": "operator",
        "version": __version__,
        "peer_protocol": "1",
        "python": platform.python_version(),
    }
    assert REGISTRY.get_sample_value("rlog_build_info", labels) == 1.0
    assert REGISTRY.get_sample_value("process_cpu_seconds_total") is not None


def test_a_log_format_the_operator_does_not_know_is_refused_by_name() -> None:
    code = "from rlog_operator.main import main; main([])"
    env = {"RLOG_LOG_FORMAT": "xml", "PATH": ""}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env=env
    )
    assert out.returncode == 1
    assert "log format 'xml' is not one of text, json" in out.stderr
    assert "Traceback" not in out.stderr
