"""A highly available operator (two pods, one Lease), on a real Kubernetes (conftest.py).

1. Exactly one operator pod holds the Lease and acts; the other stands by.
2. A rollout under a continuous writer; once the first replica is replaced and the queue
   is stored, the Lease holder is killed without grace (as a node failure would): the
   standby takes the Lease over (within the lease duration) and finishes the rollout from
   the stored queue, replacing no pod twice; no acknowledged append is lost.

For the lead to run (make e2e-local); prints the takeover time and the writer's counts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2elib import Kubectl, wait_until
from oplib import Log, Writer, check_acknowledged, created_log, watch_pods

# Day-two operations: `make e2e-extended` runs them alone; `make test` with the rest.
pytestmark = pytest.mark.extended

NAME = "ha-log"
LEASE = "rlog-operator-rlog-operator"  # <release>-rlog-operator (conftest's release)


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME) as log:
        yield log


def _holder(op: Kubectl) -> tuple[str, int]:
    lease = op.json("get", "lease", LEASE)
    spec = lease.get("spec") or {}
    return str(spec.get("holderIdentity") or ""), int(spec.get("leaseTransitions") or 0)


def _operator_pods(op: Kubectl) -> list[str]:
    pods = op.json("get", "pods", "-l", "app.kubernetes.io/name=rlog-operator")
    return [
        p["metadata"]["name"]
        for p in pods["items"]
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") == "Running"
    ]


def test_one_operator_pod_holds_the_lease_and_acts(log: Log, operator: str) -> None:
    op = Kubectl(operator)
    wait_until("two operator pods running", lambda: len(_operator_pods(op)) == 2, 180, 2)
    holder, _ = _holder(op)
    pods = _operator_pods(op)
    assert holder in pods, (holder, pods)
    (standby,) = [p for p in pods if p != holder]
    standby_log = op("logs", standby)
    assert "standing by for the Lease" in standby_log, standby_log[-2000:]
    assert "rolling:" not in standby_log and "Handler" not in standby_log, standby_log[-2000:]
    assert "holding the Lease" in op("logs", holder)


def test_killing_the_lease_holder_mid_rollout_hands_over(log: Log, operator: str) -> None:
    op = Kubectl(operator)
    holder, transitions = _holder(op)
    before_uids = log.pod_uids()
    revision_before = log.update_revision()
    writer = Writer(log, "ha", "acting operator pod killed (HA)")
    writer.start()
    log.k(
        "patch", "replicatedlog", NAME, "--type=merge", "-p",
        '{"spec":{"resources":{"requests":{"cpu":"15m","memory":"64Mi"}}}}',
    )  # fmt: skip
    killed: dict[str, float] = {}

    def done() -> bool:
        if not killed:
            replaced = [p for p, uid in log.pod_uids().items() if before_uids.get(p) != uid]
            queue = (log.status().get("rollingUpdate") or {}).get("queue") or []
            if replaced and queue:
                op("delete", "pod", holder, "--grace-period=0", "--force", "--wait=false")
                killed["at"] = time.monotonic()
                print(f"Lease holder {holder} killed: replaced {replaced}, queue {queue}")
        elif "took_over" not in killed:
            new_holder, _ = _holder(op)
            if new_holder and new_holder != holder:
                killed["took_over"] = time.monotonic() - killed["at"]
                print(f"{new_holder} took the Lease over after {killed['took_over']:.1f}s")
        return log.rolled_out(revision_before)

    incarnations = watch_pods(log, done, 900)
    report = writer.stop()
    assert killed, "the rollout finished before the holder could be killed"
    new_holder, new_transitions = _holder(op)
    assert new_holder != holder and new_transitions > transitions, (new_holder, new_transitions)
    after_uids = log.pod_uids()
    for pod in log.pods:  # every pod replaced exactly once: nothing done twice
        uids = [u for _, p, u in incarnations if p == pod]
        assert uids == [before_uids[pod], after_uids[pod]], (pod, incarnations)
    check_acknowledged(log, report)
    print(
        f"takeover {killed.get('took_over', float('nan')):.1f}s; {len(report.acks)} appends "
        f"acknowledged, {len(report.errors)} failed"
    )
