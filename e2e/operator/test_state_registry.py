"""examples/worker_registry.py (the state layer used as the Mesos Registrar uses it) against a
ReplicatedLog on Kubernetes: the example runs in a pod of the cluster (the replica image has
rlog installed), its processes admitting and removing workers concurrently through all three
replicas, while the log's leader pod is killed without grace. The example checks its own
result; the test reads the registry again with `rlog state get` inside a replica pod and
compares it with what the example's arguments say it must hold.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterator

import pytest
from e2elib import wait_until
from oplib import Log, client_pod, created_log

NAME = "registry-log"
EXAMPLE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "examples",
    "worker_registry.py",
)
PROCESSES, WORKERS, REMOVE = 4, 600, 100  # long enough (seconds) for the kill to land mid-run


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME, settle=True) as log:
        yield log


def _example_pod(log: Log, pod: str, *args: str) -> dict:
    """The example in a pod of the replica image, as the operator's client identity (a log
    is mutual TLS by default: oplib.client_pod), dialling every replica so that it can fail
    over."""
    return client_pod(
        log,
        pod,
        ["python3", "-u", "/example/worker_registry.py"],
        ["--endpoints", ",".join(log.peers), *args],
        mounts=[{"name": "example", "mountPath": "/example"}],
        volumes=[{"name": "example", "configMap": {"name": "registry-example"}}],
    )


def _run_example(log: Log, pod: str, *args: str, during: object = None) -> str:
    """Run the example to completion; `during()` is called once its pod runs. Returns its
    output; fails with it if the example failed."""
    log.k.apply(json.dumps(_example_pod(log, pod, *args)))
    try:
        wait_until(
            f"{pod} to start",
            lambda: log.k.json("get", "pod", pod)["status"].get("phase") != "Pending",
            120,
        )
        if callable(during):
            during()

        def finished() -> str | None:
            phase = log.k.json("get", "pod", pod)["status"].get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        phase = wait_until(f"{pod} to finish", finished, 300, 1)
        out = log.k("logs", pod, timeout=60)
        print(out)
        assert phase == "Succeeded", f"the example failed:\n{out}"
        return out
    finally:
        log.k.run("delete", "pod", pod, "--wait=false", check=False)


def _registry(log: Log, pod: str) -> set[str]:
    out = log.rlog(pod, "state", "get", "registry", "--endpoint", log.service, "--json")
    return set(json.loads(base64.b64decode(json.loads(out)["value"])))


def test_registry_example_keeps_every_change_through_a_leader_kill(log: Log) -> None:
    log.k(
        "create", "configmap", "registry-example", f"--from-file=worker_registry.py={EXAMPLE}"
    )  # fmt: skip
    leader = log.wait_settled_leader().split(".")[0]  # an endpoint: its pod's name
    uid = log.pod_uids()[leader]
    killed_at: list[float] = []
    phase_at_kill: list[str] = []

    def kill_leader() -> None:
        time.sleep(1.0)  # the processes have recovered the state and are batching changes
        log.k("delete", "pod", leader, "--grace-period=0", "--force", "--wait=false")
        killed_at.append(time.monotonic())
        phase_at_kill.append(log.k.json("get", "pod", "registry-ops")["status"]["phase"])

    t0 = time.monotonic()
    out = _run_example(
        log, "registry-ops",
        "--processes", str(PROCESSES), "--workers", str(WORKERS), "--remove", str(REMOVE),
        during=kill_leader,
    )  # fmt: skip
    took = time.monotonic() - t0
    print(f"example took {took:.1f}s; leader {leader} killed at {killed_at[0] - t0:.1f}s")
    assert "registry holds exactly the workers admitted and not removed" in out, out
    # The kill must have hit the example mid-run, or this test shows nothing about failover.
    assert phase_at_kill == ["Running"], f"the example finished before the kill: {phase_at_kill}"

    expected = {f"p{i}-worker-{j}" for i in range(PROCESSES) for j in range(REMOVE, WORKERS)}
    # Read back independently, from a replica that was not killed, as the CLI does.
    reader = next(p for p in log.pods if p != leader)
    assert _registry(log, reader) == expected

    # Compare-and-set mode on top, once the killed replica is back: versions from the
    # first run, refused stores decided again; the registry then holds both runs' workers
    # (same names: the second run admits and removes the same ones, so it is unchanged).
    wait_until(
        "the killed leader's replica to be back",
        lambda: log.pod_uids().get(leader, uid) != uid and log.all_voting(),
        300,
        2,
    )
    out = _run_example(
        log, "registry-cas",
        "--processes", "3", "--workers", "20", "--remove", "5", "--cas", "--strict",
    )  # fmt: skip
    assert "registry holds exactly" in out, out
    expected |= {f"p{i}-worker-{j}" for i in range(3) for j in range(5, 20)}
    expected -= {f"p{i}-worker-{j}" for i in range(3) for j in range(5)}
    assert _registry(log, reader) == expected
