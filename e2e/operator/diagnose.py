"""What the cluster looked like when a test failed: printed with the failure, because the
test's namespace is gone by the time anyone reads the log (kind runs, CI). Each command is
bounded and its failure is reported, never raised: a diagnosis must not hide the failure."""

from __future__ import annotations

import json
import subprocess

COMMAND_TIMEOUT = 20  # seconds per kubectl call
LOG_LINES = 40  # of each replica that is not ready, and of the operator
READY_LOG_LINES = 25  # of each ready replica: who led, stepped down, reloaded, failed
EVENT_LINES = 40


def _kubectl(*args: str) -> str:
    try:
        p = subprocess.run(
            ["kubectl", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        return f"(kubectl {' '.join(args)}: no answer in {COMMAND_TIMEOUT}s)\n"
    if p.returncode != 0:
        return f"(kubectl {' '.join(args)} failed ({p.returncode}): {p.stderr.strip()[:300]})\n"
    return p.stdout


# Lines an operator writes every second whatever happens: left out so its tail says something.
ROUTINE = ("Timer 'observe' succeeded", "GET /healthz")


def _tail(text: str, lines: int) -> str:
    kept = [line for line in text.splitlines() if not any(r in line for r in ROUTINE)][-lines:]
    return "\n".join(kept) + ("\n" if kept else "")


def _pods_by_readiness(namespace: str) -> tuple[list[str], list[str]]:
    """Replica pods of the namespace that are Running with every container ready, and the
    pods (any) that are not."""
    try:
        items = json.loads(_kubectl("-n", namespace, "get", "pods", "-o", "json"))["items"]
    except (ValueError, KeyError):
        return [], []
    ready, unready = [], []
    for pod in items:
        status = pod.get("status") or {}
        containers = status.get("containerStatuses") or []
        if status.get("phase") != "Running" or not all(c.get("ready") for c in containers):
            unready.append(pod["metadata"]["name"])
        elif any(c.get("name") == "replica" for c in containers):
            ready.append(pod["metadata"]["name"])
    return ready, unready


def cluster_state(namespace: str, operator_namespace: str | None) -> str:
    """Pods, ReplicatedLogs, recent events and the logs of what is not ready, as text."""
    parts = [
        ("pods", _kubectl("-n", namespace, "get", "pods", "-o", "wide")),
        ("replicatedlogs", _kubectl("-n", namespace, "get", "replicatedlogs", "-o", "wide")),
        ("persistent volume claims", _kubectl("-n", namespace, "get", "pvc")),
        (
            f"last {EVENT_LINES} events",
            _tail(
                _kubectl("-n", namespace, "get", "events", "--sort-by=.lastTimestamp"),
                EVENT_LINES,
            ),
        ),
    ]
    ready, unready = _pods_by_readiness(namespace)
    for pod in unready[:6]:
        parts.append(
            (
                f"{pod}: describe (tail)",
                _tail(_kubectl("-n", namespace, "describe", "pod", pod), 25),
            )
        )
        for previous in (False, True):
            args = ["-n", namespace, "logs", pod, "-c", "replica", f"--tail={LOG_LINES}"]
            parts.append(
                (
                    f"{pod}: replica log{' (previous container)' if previous else ''}",
                    _kubectl(*args, *(["--previous"] if previous else [])),
                )
            )
    # Ready replicas too: a test can fail on what they did while ready (a leadership lost
    # during a certificate rotation answered a forwarded append NOT_LEADER on a kind run).
    for pod in ready[:6]:
        args = ["-n", namespace, "logs", pod, "-c", "replica", f"--tail={READY_LOG_LINES}"]
        parts.append((f"{pod}: replica log (ready)", _kubectl(*args)))
    if operator_namespace:
        parts.append(
            (
                "operator log",
                _tail(
                    _kubectl(
                        "-n", operator_namespace, "logs",
                        "-l", "app.kubernetes.io/name=rlog-operator",
                        "--all-containers", "--prefix", f"--tail={20 * LOG_LINES}",
                    ),
                    LOG_LINES,
                ),
            )
        )  # fmt: skip
    return "".join(f"--- {title}\n{text}" for title, text in parts)
