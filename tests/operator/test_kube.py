"""`rlog_operator.kube`: every request the operator makes has a deadline, against a real
socket that accepts and never answers (an API server connection that died silently)."""

from __future__ import annotations

import re
import socket
import threading
import time
from pathlib import Path

import pytest
import urllib3
from kubernetes import client as k8s

from rlog_operator import kube

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "rlog_operator"


def silent_server() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # the kernel completes handshakes; nothing ever reads or answers
    return server


def test_a_request_to_a_server_that_never_answers_times_out(monkeypatch):
    monkeypatch.setattr(kube, "REQUEST_TIMEOUT", (1.0, 1.0))
    with silent_server() as server:
        configuration = k8s.Configuration()
        configuration.host = f"http://127.0.0.1:{server.getsockname()[1]}"
        configuration.retries = False
        api = k8s.CoreV1Api(kube.TimedApiClient(configuration))
        started = time.monotonic()
        with pytest.raises(urllib3.exceptions.ReadTimeoutError):
            api.read_namespaced_pod("any", "default")
        assert time.monotonic() - started < 10


def test_an_untimed_client_would_still_be_waiting():
    """The reason for the module: the library's own client has no deadline by default."""
    with silent_server() as server:
        configuration = k8s.Configuration()
        configuration.host = f"http://127.0.0.1:{server.getsockname()[1]}"
        configuration.retries = False
        api = k8s.CoreV1Api(k8s.ApiClient(configuration))
        outcome: list[object] = []
        worker = threading.Thread(target=lambda: outcome.append(_call(api)), daemon=True)
        worker.start()
        worker.join(3.0)
        assert worker.is_alive() and not outcome  # still blocked after 3 s


def _call(api: k8s.CoreV1Api) -> object:
    try:
        return api.read_namespaced_pod("any", "default")
    except Exception as exc:  # the test only needs to know it returned
        return exc


def test_the_operator_builds_no_api_object_of_its_own():
    """Every API object in the operator's modules comes from `kube` (the CLI plugin,
    `rlog_operator.plugin`, runs interactively and is not held to this)."""
    pattern = re.compile(r"k8s\.\w+Api\(|k8s\.ApiClient\(|client\.\w+Api\(")
    offenders = [
        f"{path.name}:{number}"
        for path in sorted(OPERATOR.glob("*.py"))
        if path.name != "kube.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
