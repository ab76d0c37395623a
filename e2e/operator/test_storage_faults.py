"""Disk trouble the operator shows (docs/operator.md, "Storage trouble"), on a real
Kubernetes (see conftest.py).

A follower's volume loses a segment file while its pod is down: the replica finds the loss
on open, sets the damaged files aside, rejoins EMPTY and catches up from the quorum, and
comes back VOTING by itself, with no human and no crash loop. The operator records it: a
StorageLost Warning Event naming the replica (once), and its status item says what the
replica reported; every entry acknowledged before the loss is on the replica again.

How the file is lost safely: the segment is unlinked from inside the replica container, and
the pod is deleted at once with a 1-second grace period (the StatefulSet makes the new pod
only after the kubelet has stopped the old container, so no two processes share the volume).
No writer runs while it happens, so the running process cannot cut a new segment in the
window; what it still writes to the unlinked file is lost with it, as it would be on a bad
volume snapshot.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from e2elib import wait_until
from oplib import Log, created_log

NAME = "disk-log"
ENTRIES = 300

# Run in the replica container: the data dir's segment files, oldest first.
LIST_SEGMENTS = (
    "import glob, json; print(json.dumps(sorted(glob.glob('/data/log/**/*.seg', recursive=True))))"
)


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME, settle=True) as log:
        yield log


def _events(log: Log, reason: str, pod: str) -> list[dict[str, Any]]:
    """The ReplicatedLog's Events with `reason` that name `pod`."""
    found = log.k.json(
        "get", "events", "--field-selector",
        f"involvedObject.kind=ReplicatedLog,involvedObject.name={NAME},reason={reason}",
    )  # fmt: skip
    return [e for e in found["items"] if pod in str(e.get("message") or "")]


def _segments(log: Log, pod: str) -> list[str]:
    out = log.k("exec", pod, "-c", "replica", "--", "python3", "-c", LIST_SEGMENTS, timeout=60)
    return list(json.loads(out))


def _item(log: Log, pod: str) -> dict[str, Any]:
    return next(i for i in log.status().get("replicas") or [] if i.get("name") == pod)


def test_a_follower_that_loses_a_segment_file_comes_back_voting_by_itself(log: Log) -> None:
    leader = str(log.status().get("leader") or "")
    follower = next(p for p in log.pods if p != leader)
    values = [f"disk-{i}" for i in range(ENTRIES)]
    log.append(values)
    expected = log.entries(leader)
    assert [v for _, v in expected][-ENTRIES:] == values
    wait_until(
        f"{follower} learned every entry",
        lambda: log.replica_status(follower)["learned"] >= expected[-1][0],
        timeout=60,
    )
    segments = _segments(log, follower)
    assert segments, f"{follower} has no segment file"
    # a middle segment when there are several, else the only one (the newest segment then
    # no longer reaches the end its metadata recorded: the same loss, found on open)
    lost = segments[len(segments) // 2]
    uid = log.k.json("get", "pod", follower)["metadata"]["uid"]
    t0 = time.monotonic()
    log.k(
        "exec", follower, "-c", "replica", "--", "python3", "-c",
        f"import os; os.unlink({lost!r})",
        timeout=60,
    )  # fmt: skip
    log.k("delete", "pod", follower, "--grace-period=1", "--wait=true", timeout=120)
    print(f"{follower}: {lost} deleted (of {len(segments)} segments), pod deleted")

    # the operator records the loss: a Warning Event naming the replica
    (event,) = wait_until(
        f"a StorageLost Event for {follower}",
        lambda: _events(log, "StorageLost", follower),
        timeout=180,
    )
    assert event["type"] == "Warning", event
    print(f"Event: {event['message']}")
    print(f"StorageDegraded: {log.condition('StorageDegraded')}")

    # it comes back VOTING by itself: a new pod of the same claim, never crash-looping
    def voting_again() -> bool:
        pod = log.k.json("get", "pod", follower)
        item = _item(log, follower)
        assert not item.get("crashLoop"), item  # the loss is handled, not a crash loop
        return pod["metadata"]["uid"] != uid and item.get("status") == "VOTING"

    wait_until(f"{follower} VOTING again", voting_again, timeout=600, interval=2)
    print(f"{follower} VOTING again after {time.monotonic() - t0:.1f}s")
    restarts = sum(
        int(c.get("restartCount") or 0)
        for c in log.k.json("get", "pod", follower)["status"].get("containerStatuses") or []
    )
    assert restarts == 0, f"{follower}'s new pod restarted {restarts} times"

    # everything acknowledged before the loss is on the replica again
    wait_until(
        f"{follower} holds every entry again",
        lambda: log.replica_status(follower)["learned"] >= expected[-1][0],
        timeout=300,
    )
    assert log.entries(follower)[: len(expected)] == expected
    assert len(_events(log, "StorageLost", follower)) == 1, "one Event per change"
    print(f"at the end: {_item(log, follower)}, {log.condition('StorageDegraded')}")
