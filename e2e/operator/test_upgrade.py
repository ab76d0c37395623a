"""Upgrading the operator under a live log (conftest.py installs the chart). For the lead.

The repository's CRD is applied again (server-side, as docs/upgrades.md says) and the
release upgraded with a changed operator pod template (its resources): both operator pods
are replaced through the Lease hand-over while a writer appends without pause. No replica
pod restarts, the StatefulSet's pod template does not change, the log stays Ready with a
VOTING quorum in every sample, and every acknowledged append is kept.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import pytest
from e2elib import Kubectl, wait_until
from oplib import Log, Writer, check_acknowledged, created_log

# Day-two operations: `make e2e-extended` runs them alone; `make test` with the rest.
pytestmark = pytest.mark.extended

NAME = "upgrade-log"
RELEASE = "rlog-operator"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CRD = os.path.join(ROOT, "crds", "replicatedlog.yaml")
QUORUM = 2


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME, settle=True) as log:
        yield log


def _operator_uids(op: Kubectl) -> set[str]:
    pods = op.json("get", "pods", "-l", "app.kubernetes.io/name=rlog-operator")
    return {p["metadata"]["uid"] for p in pods["items"]}


def test_chart_upgrade_restarts_no_replica(
    log: Log, operator: str, cluster: Kubectl, crd_held: None, chart: str
) -> None:
    op = Kubectl(operator)
    replica_uids = log.pod_uids()
    sts = log.k.json("get", "statefulset", NAME)
    operator_uids = _operator_uids(op)
    writer = Writer(log, "upgrade", "chart upgrade under a live log")
    writer.start()
    t0 = time.monotonic()
    cluster("apply", "--server-side", "--force-conflicts", "-f", CRD, namespaced=False)
    out = subprocess.run(
        ["helm", "upgrade", RELEASE, chart, "-n", operator, "--reuse-values",
         "--set", "resources.requests.cpu=60m", "--wait", "--timeout", "300s"],
        capture_output=True, text=True, timeout=360,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr

    def replaced() -> bool:
        uids = _operator_uids(op)
        return len(uids) == 2 and not uids & operator_uids

    wait_until("both operator pods replaced", replaced, 300, 2)
    lease = op.json("get", "lease", f"{RELEASE}-rlog-operator")
    holder = (lease.get("spec") or {}).get("holderIdentity")
    print(f"operator upgraded in {time.monotonic() - t0:.1f}s; the Lease holder is {holder}")
    # let the new holder observe a while: it must find nothing to do
    time.sleep(20)
    report = writer.stop()

    assert log.pod_uids() == replica_uids, "a replica pod was restarted by the upgrade"
    after = log.k.json("get", "statefulset", NAME)
    assert after["metadata"]["uid"] == sts["metadata"]["uid"]
    assert after["spec"]["template"] == sts["spec"]["template"]
    assert log.all_voting()
    below = [s for _, s in report.samples if list(s.values()).count("VOTING") < QUORUM]
    assert not below, below[:5]
    check_acknowledged(log, report)
    print(
        f"{len(report.acks)} appends acknowledged, {len(report.errors)} failed during the upgrade"
    )
