"""Rolling replacement and total data loss, on a real Kubernetes (see conftest.py).

Tests run in file order and share one ReplicatedLog:
1. a resources change rolls the replicas one pod at a time, the leader last, under a
   continuous writer: no acknowledged append lost, never fewer than a quorum VOTING (the
   writer pod samples every replica's status twice a second throughout);
2. an image change rolls again, and the operator pod is killed mid-rollout: its successor
   resumes from the queue kept in status and finishes, replacing no pod twice;
3. the PersistentVolume under a follower's claim vanishes: a fresh claim, back VOTING;
   the leader's pod is killed without grace under a writer: nothing acknowledged is lost;
4. every PVC and pod deleted after initialization: DataLoss, no re-initialization (every
   replica stays EMPTY) until `rlog.io/reinitialize=<uid>`, then Ready again.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from e2elib import Kubectl, delete_and_wait, wait_until
from oplib import REPLICA_IMAGE, Log, Writer, check_acknowledged, created_log, watch_pods

NAME = "roll-log"
QUORUM = 2


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME, settle=True) as log:  # the tests start from its leader
        yield log


def _roll_under_writer(
    log: Log, tag: str, patch: str, operator_ns: str | None = None
) -> tuple[list[tuple[float, str, str]], str]:
    """Apply `patch` under a continuous writer, wait for the rollout to finish, check
    the writer's acknowledgements and samples; returns the pod incarnations seen and the
    leader at the start. With `operator_ns`, the operator pod is deleted once the first
    replica is on the new revision."""
    before_uids = log.pod_uids()
    revision_before = log.update_revision()
    leader = str(log.status().get("leader") or "")
    assert leader in log.pods, log.status()
    what = "rolling restart" + (", acting operator pod killed" if operator_ns else "")
    writer = Writer(log, tag, f"{what} ({tag})")
    writer.start()
    t0 = time.monotonic()
    log.k("patch", "replicatedlog", NAME, "--type=merge", "-p", patch)

    operator = Kubectl(operator_ns) if operator_ns else None
    restarted: dict[str, str] = {}

    def done() -> bool:
        if operator is not None and not restarted:
            replaced = [p for p, uid in log.pod_uids().items() if before_uids.get(p) != uid]
            queue = (log.status().get("rollingUpdate") or {}).get("queue") or []
            if replaced and queue:
                op = operator.json("get", "pods", "-l", "app.kubernetes.io/name=rlog-operator")
                # the acting one: the Lease holder (two pods with leader election)
                lease = operator.json("get", "lease", "rlog-operator-rlog-operator")
                holder = (lease.get("spec") or {}).get("holderIdentity")
                old = next(p["metadata"] for p in op["items"] if p["metadata"]["name"] == holder)
                operator("delete", "pod", old["name"], "--wait=true", timeout=120)
                restarted.update(pod=old["uid"], queue=str(queue), replaced=",".join(replaced))
                print(f"operator pod deleted mid-rollout: replaced {replaced}, queue {queue}")
        return log.rolled_out(revision_before)

    incarnations = watch_pods(log, done, 600)
    print(f"rolled out in {time.monotonic() - t0:.1f}s")
    report = writer.stop()

    if operator is not None:
        assert restarted, "the rollout finished before the operator could be restarted"
        op = operator.json("get", "pods", "-l", "app.kubernetes.io/name=rlog-operator")
        assert restarted["pod"] not in [p["metadata"]["uid"] for p in op["items"]], op

    # every pod replaced exactly once
    after_uids = log.pod_uids()
    for pod in log.pods:
        assert after_uids[pod] != before_uids[pod], (pod, before_uids, after_uids)
        uids = [u for _, p, u in incarnations if p == pod]
        assert uids == [before_uids[pod], after_uids[pod]], (pod, incarnations)

    # never below a quorum of VOTING replicas, and the rollout did take replicas away
    counts = report.voting_counts()
    assert counts, "the writer took no status sample"
    below = [
        (t, states, report.why.get(t))
        for t, states in report.samples
        if list(states.values()).count("VOTING") < QUORUM
    ]
    kinds: dict[str, int] = {}
    for why in report.why.values():
        for pod, details in why.items():
            key = f"{pod}: {details[:300]}"
            kinds[key] = kinds.get(key, 0) + 1
    print("status errors seen by the sampler:", json.dumps(kinds, indent=1))
    if report.sample_errors:
        print(f"{len(report.sample_errors)} samples lost:", report.sample_errors[:3])
    if below:  # what Kubernetes and the operator did around then, for the failure report
        first, last = below[0][0] - 10, below[-1][0] + 3
        for t, states in report.samples:
            if first <= t <= last:
                print(
                    time.strftime("%H:%M:%S", time.gmtime(t)),
                    f"{t % 1:.2f}",
                    states,
                    report.why.get(t) or "",
                )
        events = log.k.json("get", "events", "--sort-by=.lastTimestamp")
        for e in events["items"]:
            obj = e.get("involvedObject") or {}
            print(
                e.get("lastTimestamp"),
                obj.get("kind"),
                obj.get("name"),
                e.get("reason"),
                (e.get("message") or "")[:160],
            )
    assert not below, (
        f"fewer than {QUORUM} VOTING in {len(below)} of {len(counts)} samples: {below[:10]}"
    )
    assert min(counts) < log.replicas, "no sample saw a replica being replaced"

    check_acknowledged(log, report)
    print(
        f"{len(report.acks)} appends acknowledged, {len(report.errors)} failed (retried with "
        f"new values), {len(report.samples)} status samples, min VOTING {min(counts)}"
    )
    return incarnations, leader


def _replacement_order(incarnations: list[tuple[float, str, str]], pods: list[str]) -> list[str]:
    new = [(t, p) for t, p, _ in incarnations if t > incarnations[len(pods) - 1][0]]
    return [p for _, p in sorted(new)]


def test_resources_change_rolls_one_pod_at_a_time_under_a_writer(log: Log) -> None:
    patch = '{"spec":{"resources":{"requests":{"cpu":"20m","memory":"64Mi"}}}}'
    incarnations, leader = _roll_under_writer(log, "res", patch)
    order = _replacement_order(incarnations, log.pods)
    print(f"replacement order {order}, leader at the start {leader}")
    assert sorted(order) == sorted(log.pods), order
    assert order[-1] == leader, f"the leader {leader} was not replaced last: {order}"
    sts = log.k.json("get", "statefulset", NAME)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["requests"]["cpu"] == "20m", container


def test_image_change_resumes_after_an_operator_restart(log: Log, operator: str) -> None:
    # The same image under another name ("rlog/..." for "docker.io/rlog/..."): a real change
    # of the pod template that needs no second image, so it runs on kind as well.
    image = REPLICA_IMAGE.removeprefix("docker.io/")
    assert image != REPLICA_IMAGE, "set E2E_REPLICA_IMAGE to a docker.io/ image for this test"
    _roll_under_writer(log, "img", f'{{"spec":{{"image":"{image}"}}}}', operator_ns=operator)
    sts = log.k.json("get", "statefulset", NAME)
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == image


def test_a_vanished_persistent_volume_gets_a_fresh_claim(log: Log) -> None:
    """The volume under a follower's claim disappears (as a cloud disk deleted out of band
    would): the operator gives that replica a fresh claim and it recovers by protocol."""
    leader = str(log.status().get("leader") or "")
    victim = next(p for p in reversed(log.pods) if p != leader)
    claim = log.k.json("get", "pvc", f"data-{victim}")
    volume = claim["spec"]["volumeName"]
    log.rlog(log.pods[0], "append", "--endpoint", log.service, "before-volume-loss")
    before = log.entries(leader)
    writer = Writer(log, "pv", f"the volume under {victim} deleted")
    writer.start()
    t0 = time.monotonic()
    # A Bound volume's deletion waits on the pv-protection finalizer (which its controller
    # re-adds if removed beforehand): delete, then drop the finalizer.
    log.k("delete", "pv", volume, "--wait=false")
    log.k("patch", "pv", volume, "--type=merge", "-p", '{"metadata":{"finalizers":null}}')

    def fresh_claim_voting() -> bool:
        got = log.k.run("get", "pvc", f"data-{victim}", "-o", "json", check=False)
        if got.returncode != 0:
            return False
        uid = json.loads(got.stdout)["metadata"]["uid"]
        return uid != claim["metadata"]["uid"] and log.all_voting()

    wait_until(f"{victim} VOTING on a fresh claim", fresh_claim_voting, 300, 2)
    print(f"{victim} back VOTING on a fresh claim after {time.monotonic() - t0:.1f}s")
    events = log.k(
        "get", "events", "--field-selector", f"involvedObject.name={NAME},reason=ReplacingVolume"
    )
    assert f"data-{victim}" in events, events
    wait_until(
        f"{victim} to hold every entry",
        lambda: log.entries(victim)[: len(before)] == before,
        120,
        2,
    )
    report = writer.stop()
    check_acknowledged(log, report)  # every replica, the new one too, agrees on every ack
    print(f"{len(report.acks)} appends acknowledged, {len(report.errors)} failed calls")


def test_the_leader_pod_killed_under_a_writer_loses_no_acknowledged_append(log: Log) -> None:
    """The leader's pod deleted without grace (as a node failure would): another replica
    leads, the pod comes back and catches up; every acknowledged append is everywhere."""
    leader = log.wait_settled_leader().split(".")[0]  # an endpoint: its pod's name
    uid = log.pod_uids()[leader]
    writer = Writer(log, "kill", f"the leader pod {leader} killed, no grace")
    writer.start()
    t0 = time.monotonic()
    log.k("delete", "pod", leader, "--grace-period=0", "--force", "--wait=false")

    def back() -> bool:
        # the new pod's own replica says VOTING (the status of the log may lag a tick)
        if log.pod_uids().get(leader, uid) == uid:
            return False
        try:
            own = log.replica_status(leader)
        except AssertionError:  # its container is not answering yet
            return False
        return own.get("status") == "VOTING" and log.all_voting()

    wait_until(f"{leader} recreated, VOTING again", back, 300, 1)
    took = time.monotonic() - t0
    time.sleep(3)  # and written to for a while with it back
    report = writer.stop()
    check_acknowledged(log, report)
    print(
        f"leader {leader} killed: all VOTING again after {took:.1f}s (leader now "
        f"{log.status().get('leader')}); {len(report.acks)} acknowledged, "
        f"{len(report.errors)} failed calls"
    )


def test_every_volume_lost_is_data_loss_until_the_reinitialize_annotation(log: Log) -> None:
    assert log.status().get("initialized") is True
    uid = log.body()["metadata"]["uid"]
    for pod in log.pods:
        log.k("delete", "pvc", f"data-{pod}", "--wait=false")
    delete_and_wait(log.k, "pod", *log.pods)
    t0 = time.monotonic()

    def data_loss() -> bool:
        st = log.status()
        reps = st.get("replicas") or []
        return (
            st.get("phase") == "DataLoss"
            and log.condition("DataLoss").get("status") == "True"
            and len(reps) == log.replicas
            and all(r.get("status") == "EMPTY" for r in reps)
        )

    wait_until("phase DataLoss with every replica EMPTY", data_loss, 300, 2)
    print(f"DataLoss after {time.monotonic() - t0:.1f}s")
    events = log.k(
        "get", "events", "--field-selector", f"involvedObject.name={NAME},reason=DataLoss"
    )
    assert "Warning" in events, events

    # nothing happens on its own: no permit, no initialization
    deadline = time.monotonic() + 25
    while time.monotonic() < deadline:
        st = log.status()
        assert st.get("phase") == "DataLoss", st
        assert st.get("initialized") is True, st  # sticky
        assert all(r.get("status") == "EMPTY" for r in st.get("replicas") or []), st
        time.sleep(3)
    for pod in log.pods:
        s = log.replica_status(pod)
        assert s.get("status") == "EMPTY", (pod, s)

    # a wrong uid is ignored
    log.k("annotate", "replicatedlog", NAME, "rlog.io/reinitialize=not-this-log")
    time.sleep(12)
    assert log.status().get("phase") == "DataLoss", log.status()

    t1 = time.monotonic()
    log.k("annotate", "--overwrite", "replicatedlog", NAME, f"rlog.io/reinitialize={uid}")
    log.wait_ready("Ready again after rlog.io/reinitialize")
    print(f"Ready {time.monotonic() - t1:.1f}s after the annotation")
    assert log.condition("DataLoss").get("status") == "False", log.status()
    wait_until(
        "the one-shot annotation to be removed",
        lambda: "rlog.io/reinitialize" not in (log.body()["metadata"].get("annotations") or {}),
        60,
        2,
    )
    # a usable log again
    log.rlog(log.pods[0], "append", "--endpoint", log.service, "after-reinit")
    assert [v for _, v in log.entries(log.pods[1], log.service, stale=False)] == ["after-reinit"]
