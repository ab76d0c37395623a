"""A drain of the leader's pod under a continuous writer, on a real Kubernetes
(conftest.py). For the lead to run; prints the writer's failed-call count.

The leader's pod is evicted (the Eviction API, as `kubectl drain` does: the PDB allows one
replica down): the kubelet sends SIGTERM, the replica steps down and serves until another
replica leads (`--drain-timeout`, specs.py), then exits; the StatefulSet brings the pod
back on its volume. The writer (oplib.Writer: the client Service and every peer, exactly-
once sessions) should see no failed append; every acknowledged one is kept.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from e2elib import wait_until
from oplib import Log, Writer, check_acknowledged, created_log

# Day-two operations: `make e2e-extended` runs them alone; `make test` with the rest.
pytestmark = pytest.mark.extended

NAME = "drain-log"


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME, settle=True) as log:
        yield log


def test_evicting_the_leader_costs_no_failed_append(log: Log) -> None:
    leader = str(log.status().get("leader") or "")
    assert leader in log.pods, log.status()
    uid = log.pod_uids()[leader]
    writer = Writer(log, "drain", "node drain (leader evicted)")
    writer.start()
    eviction = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": leader, "namespace": log.k.namespace},
    }
    t0 = time.monotonic()
    log.k(
        "create", "--raw", f"/api/v1/namespaces/{log.k.namespace}/pods/{leader}/eviction",
        "-f", "-", input=json.dumps(eviction),
    )  # fmt: skip
    wait_until(
        f"{leader} back (a new pod) and every replica VOTING",
        lambda: log.pod_uids().get(leader) not in (None, uid) and log.all_voting(),
        300,
        2,
    )
    print(f"{leader} evicted and back VOTING after {time.monotonic() - t0:.1f}s")
    time.sleep(5)
    report = writer.stop()
    new_leader = str(log.status().get("leader") or "")
    print(
        f"leader {leader} -> {new_leader}; {len(report.acks)} appends acknowledged, "
        f"{len(report.errors)} failed: {report.errors[:5]}"
    )
    check_acknowledged(log, report)
    assert not report.errors, report.errors[:10]
