"""Storage expansion and migration on a real Kubernetes (conftest.py). The local cluster's
StorageClass (local-path) cannot expand volumes, so growth migrates each replica to a fresh
claim, like a class change. For the lead to run; prints times and the writer's counts.

Tests run in file order on one log:
1. a smaller size is refused (status.migration Refused, nothing changes), then set back;
2. a larger size under a continuous writer: the claim template is replaced without
   restarting a pod, then each replica migrates once (EMPTY -> catch-up -> VOTING), never
   below a VOTING quorum; every acknowledged append kept;
3. another StorageClass (same provisioner): every claim moves to it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from e2elib import Kubectl, wait_until
from oplib import Log, Writer, check_acknowledged, created_log, watch_pods

# Day-two operations: `make e2e-extended` runs them alone; `make test` with the rest.
pytestmark = pytest.mark.extended

NAME = "storage-log"
OTHER_CLASS = "rlog-e2e-other"
QUORUM = 2


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME) as log:
        yield log


def _migration(log: Log) -> dict:
    return log.status().get("migration") or {}


def _claims(log: Log) -> dict[str, tuple[str, str]]:
    claims = log.k.json("get", "pvc", "-l", f"app.kubernetes.io/instance={NAME}")
    return {
        c["metadata"]["name"]: (
            c["spec"]["resources"]["requests"]["storage"],
            c["spec"].get("storageClassName") or "",
        )
        for c in claims["items"]
        if not c["metadata"].get("deletionTimestamp")
    }


def _migrate_under_writer(log: Log, tag: str, patch: str, wanted: tuple[str, str | None]) -> None:
    before = log.pod_uids()
    sts_uid = log.k.json("get", "statefulset", NAME)["metadata"]["uid"]
    writer = Writer(log, tag, f"storage migration, one replica at a time ({tag})")
    writer.start()
    t0 = time.monotonic()
    log.k("patch", "replicatedlog", NAME, "--type=merge", "-p", patch)

    def template_replaced() -> bool:
        got = log.k.run("get", "statefulset", NAME, "-o", "json", check=False)
        return got.returncode == 0 and json.loads(got.stdout)["metadata"]["uid"] != sts_uid

    wait_until("the StatefulSet recreated with the new claim template", template_replaced, 120, 1)
    print(f"claim template replaced after {time.monotonic() - t0:.1f}s")

    def migrated() -> bool:
        claims = _claims(log)
        size, cls = wanted
        return (
            len(claims) == log.replicas
            and all(s == size and (cls is None or c == cls) for s, c in claims.values())
            and _migration(log).get("phase") == "Idle"
            and log.all_voting()
        )

    incarnations = watch_pods(log, migrated, 1200)
    print(f"migrated in {time.monotonic() - t0:.1f}s: {_migration(log)}")
    report = writer.stop()
    after = log.pod_uids()
    for pod in log.pods:  # each replica moved exactly once
        uids = [u for _, p, u in incarnations if p == pod]
        assert uids == [before[pod], after[pod]], (pod, incarnations)
    # A status call that timed out says nothing (on a saturated host the writer pod's calls
    # did, 7 Dec); a replica that answered otherwise, refused or has no pod is not VOTING.
    below = [
        s
        for _, s in report.samples
        if sum(v in ("VOTING", "error:DEADLINE_EXCEEDED") for v in s.values()) < QUORUM
    ]
    assert not below, f"fewer than {QUORUM} VOTING: {below[:5]}"
    check_acknowledged(log, report)
    print(f"{len(report.acks)} appends acknowledged, {len(report.errors)} failed")


def test_a_smaller_size_is_refused(log: Log) -> None:
    claims = _claims(log)
    log.k(
        "patch", "replicatedlog", NAME, "--type=merge", "-p", '{"spec":{"storage":{"size":"32Mi"}}}'
    )
    wait_until("migration Refused", lambda: _migration(log).get("phase") == "Refused", 60, 1)
    assert "cannot shrink" in _migration(log).get("message", "")
    events = log.k(
        "get",
        "events",
        "--field-selector",
        f"involvedObject.name={NAME},reason=StorageShrinkRefused",
    )
    assert "Warning" in events, events
    assert _claims(log) == claims
    template = log.k.json("get", "statefulset", NAME)["spec"]["volumeClaimTemplates"][0]
    assert template["spec"]["resources"]["requests"]["storage"] == "64Mi"
    log.k(
        "patch", "replicatedlog", NAME, "--type=merge", "-p", '{"spec":{"storage":{"size":"64Mi"}}}'
    )
    wait_until("migration Idle", lambda: _migration(log).get("phase") == "Idle", 60, 1)


# A hang bound, as watch_pods' own 1,200 s: on a saturated host (the unit suite beside)
# a replacement pod's exec readiness probe timed out for 3 minutes (CI, 7 Dec).
@pytest.mark.timeout(1500)
def test_growing_migrates_each_replica_once_under_a_writer(log: Log) -> None:
    _migrate_under_writer(log, "grow", '{"spec":{"storage":{"size":"96Mi"}}}', ("96Mi", None))


# A hang bound, as watch_pods' own 1,200 s: on a saturated host (the unit suite beside)
# a replacement pod's exec readiness probe timed out for 3 minutes (CI, 7 Dec).
@pytest.mark.timeout(1500)
def test_another_storage_class_moves_every_claim(log: Log, cluster: Kubectl) -> None:
    cluster.apply(
        f"""
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {OTHER_CLASS}
provisioner: rancher.io/local-path
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
"""
    )
    try:
        patch = f'{{"spec":{{"storage":{{"storageClassName":"{OTHER_CLASS}"}}}}}}'
        _migrate_under_writer(log, "class", patch, ("96Mi", OTHER_CLASS))
    finally:
        cluster.run("delete", "storageclass", OTHER_CLASS, check=False, namespaced=False)
