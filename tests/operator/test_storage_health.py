"""Disk trouble as the operator reports it (rlog_operator.storage_health): the
StorageDegraded condition and the Events of each replica's storage condition, corrupt
records and crash loops, on hand-built facts; what a pod's statuses say (observed.pod_info);
how the health is kept between observations (facts.gather); one Event per change over
successive observations (status.compute_status); the operator's series of it (metrics)."""

from helpers import LATER, NAMES, NOW, cr, facts, pod, rs
from prometheus_client import REGISTRY

from rlog_operator import metrics, observed
from rlog_operator import status as st
from rlog_operator import storage_health as sh
from rlog_operator.facts import ReplicaHealth, gather

HEALTHY = dict.fromkeys(NAMES, ReplicaHealth())
LOST = ReplicaHealth("storage-lost", "segment 3 is missing: set aside in damaged-20260101T000000Z")
REFUSING = ReplicaHealth("refusing", "the data dir belongs to log 99")


def with_health(was=None, **now):
    """Facts whose replicas' health is `now` (by pod name) and was `was`."""
    return facts(health={**HEALTHY, **now}, was_health={**HEALTHY, **(was or {})})


def events(f):
    return [(c.type, c.reason, c.message) for c in sh.changes(f)]


# ---- the StorageDegraded condition ------------------------------------------------------------


def test_storage_degraded_is_false_while_all_are_healthy():
    assert st.storage_degraded_condition(facts()) == st.Condition(
        "StorageDegraded", False, "AllHealthy", "every replica reports healthy storage"
    )


def test_storage_degraded_names_each_replica_and_takes_the_worst_reason():
    one = st.storage_degraded_condition(with_health(**{"orders-1": LOST}))
    assert one == st.Condition(
        "StorageDegraded",
        True,
        "StorageLost",
        "orders-1 found its storage lost or damaged: it set the files aside, rejoined EMPTY "
        "and recovers from its peers: segment 3 is missing: set aside in damaged-20260101T000000Z",
    )
    two = st.storage_degraded_condition(with_health(**{"orders-1": LOST, "orders-2": REFUSING}))
    assert two.value and two.reason == "StorageRefused"
    assert two.message.startswith("orders-1 found its storage lost")
    assert "; orders-2 refuses to vote on its storage" in two.message
    assert two.message.endswith(": the data dir belongs to log 99")


def test_every_kind_has_its_reason():
    for kind, reason in [
        ("corrupt-repaired", "CorruptRecordRepaired"),
        ("storage-lost", "StorageLost"),
        ("refusing", "StorageRefused"),
        ("disk-failing", "DiskFailing"),
        ("disk-full", "DiskFull"),
        ("restore-failed", "RestoreFailed"),
        ("fault", "StorageFault"),
        ("a-kind-from-a-newer-replica", "StorageFault"),
    ]:
        value, got, _ = sh.degraded(with_health(**{"orders-0": ReplicaHealth(kind)}))
        assert value and got == reason, kind


def test_crash_loops_are_not_storage_trouble():
    f = with_health(**{"orders-2": ReplicaHealth(crash_loop="boom (exit code 1)")})
    assert sh.degraded(f)[0] is False


# ---- Events -----------------------------------------------------------------------------------


def test_a_warning_when_a_condition_appears_and_none_while_it_stays():
    assert events(with_health(**{"orders-1": LOST})) == [
        ("Warning", "StorageLost", sh.describe("orders-1", LOST))
    ]
    assert events(with_health(was={"orders-1": LOST}, **{"orders-1": LOST})) == []
    # a change from one kind to another is a new Warning
    failing = ReplicaHealth("disk-failing", "fsync: EIO")
    assert events(with_health(was={"orders-1": LOST}, **{"orders-1": failing})) == [
        (
            "Warning",
            "DiskFailing",
            "orders-1 fails to write its disk (EIO/EROFS): it left the quorum: fsync: EIO",
        )
    ]


def test_a_normal_event_when_it_clears():
    assert events(with_health(was={"orders-1": LOST})) == [
        ("Normal", "StorageHealthy", "orders-1 reports healthy storage again (was: StorageLost)")
    ]


def test_corrupt_records_rising_is_one_event_per_rise():
    one = ReplicaHealth("corrupt-repaired", "corrupt record at position 7", 1)
    assert events(with_health(**{"orders-0": one})) == [
        (
            "Warning",
            "CorruptRecordRepaired",
            "orders-0 found a corrupt record (dropped, repaired from its peers; 1 since it "
            "started): corrupt record at position 7",
        )
    ]
    three = ReplicaHealth("corrupt-repaired", "corrupt record at position 9", 3)
    assert events(with_health(was={"orders-0": one}, **{"orders-0": three})) == [
        (
            "Warning",
            "CorruptRecordRepaired",
            "orders-0 found 2 corrupt records (dropped, repaired from its peers; 3 since it "
            "started): corrupt record at position 9",
        )
    ]
    assert events(with_health(was={"orders-0": three}, **{"orders-0": three})) == []


def test_a_lower_count_is_a_restart_and_all_of_it_is_new():
    before = ReplicaHealth("corrupt-repaired", "", 5)
    restarted = ReplicaHealth("corrupt-repaired", "", 1)
    assert [
        e[1] for e in events(with_health(was={"orders-0": before}, **{"orders-0": restarted}))
    ] == ["CorruptRecordRepaired"]
    assert events(with_health(was={"orders-0": before}, **{"orders-0": ReplicaHealth()})) == [
        (
            "Normal",
            "StorageHealthy",
            "orders-0 reports healthy storage again (was: CorruptRecordRepaired)",
        )
    ]


def test_a_crash_loop_is_reported_once():
    looping = ReplicaHealth(crash_loop="rlog: error: segment 3 is missing (exit code 2)")
    assert events(with_health(**{"orders-2": looping})) == [
        (
            "Warning",
            "ReplicaCrashLooping",
            "orders-2 crash-loops: rlog: error: segment 3 is missing (exit code 2)",
        )
    ]
    assert events(with_health(was={"orders-2": looping}, **{"orders-2": looping})) == []


# ---- what a pod's statuses say ----------------------------------------------------------------


def pod_object(init=None, containers=None):
    return {
        "metadata": {"name": "orders-1", "uid": "u1"},
        "status": {
            "phase": "Pending",
            "initContainerStatuses": init or [],
            "containerStatuses": containers or [],
        },
    }


def test_a_failed_restore_init_container():
    failed = {
        "name": "restore",
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {
            "terminated": {
                "exitCode": 1,
                "message": "restoring...\nrlog: error: restore incomplete: s3 GET failed\n",
            }
        },
    }
    info = observed.pod_info(pod_object(init=[failed]))
    assert info["restoreFailed"] == "rlog: error: restore incomplete: s3 GET failed (exit code 1)"
    assert info["crashLoop"] == ""
    # terminated with an error, before the kubelet starts it again
    ended = {"name": "restore", "state": {"terminated": {"exitCode": 2, "reason": "Error"}}}
    assert observed.pod_info(pod_object(init=[ended]))["restoreFailed"] == "Error (exit code 2)"
    # done, running, or a first start: not failed
    for state in (
        {"terminated": {"exitCode": 0}},
        {"running": {}},
        {"waiting": {"reason": "PodInitializing"}},
    ):
        assert (
            observed.pod_info(pod_object(init=[{"name": "restore", "state": state}]))[
                "restoreFailed"
            ]
            == ""
        )


def test_a_crash_looping_replica_container():
    looping = {
        "name": "replica",
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 2, "message": "rlog: error: data dir: no"}},
    }
    info = observed.pod_info(pod_object(containers=[looping]))
    assert info["crashLoop"] == "rlog: error: data dir: no (exit code 2)"
    assert info["stuck"] == "CrashLoopBackOff"
    other = {**looping, "name": "sidecar"}
    assert observed.pod_info(pod_object(containers=[other]))["crashLoop"] == ""


# ---- the health kept between observations -----------------------------------------------------


def test_health_comes_from_the_answer_and_is_kept_while_there_is_none():
    previous = {"replicas": [{"name": "orders-1", "storage": "storage-lost", "storageFault": "x"}]}
    statuses = {
        "orders-0": rs(0, storage_condition="disk-full", storage_fault="disk full: 1 MiB"),
        "orders-1": None,
        "orders-2": rs(2),
    }
    f = gather(cr(), [pod(i) for i in range(3)], statuses, "", previous)
    assert f.health["orders-0"] == ReplicaHealth("disk-full", "disk full: 1 MiB")
    assert f.health["orders-1"] == ReplicaHealth("storage-lost", "x")
    assert f.health["orders-2"] == ReplicaHealth()
    assert f.was_health["orders-1"] == f.health["orders-1"]


def test_a_replica_without_the_storage_condition_field():
    statuses = {
        "orders-0": rs(0, storage_fault="corrupt record at 4", corrupt_records=1),
        "orders-1": rs(1, disk_full=True, storage_fault="disk full"),
        "orders-2": rs(2, storage_fault="fsync failed"),
    }
    f = gather(cr(), [pod(i) for i in range(3)], statuses, "", None)
    assert [f.health[n].storage for n in NAMES] == ["corrupt-repaired", "disk-full", "fault"]


def test_a_failed_restore_or_a_crash_loop_from_the_pod():
    pods = [pod(0), pod(1, restoreFailed="s3 GET failed (exit code 1)"), pod(2, crashLoop="x")]
    f = gather(cr(), pods, {"orders-0": rs(0)}, "", None)
    assert f.health["orders-1"] == ReplicaHealth("restore-failed", "s3 GET failed (exit code 1)")
    assert f.health["orders-2"] == ReplicaHealth(crash_loop="x")


# ---- over successive observations -------------------------------------------------------------


def test_one_event_per_change_over_observations_and_the_status_keeps_it():
    pods = [pod(i) for i in range(3)]
    healthy = {f"orders-{i}": rs(i) for i in range(3)}
    first = st.compute_status(cr(), pods, healthy, "", None, NOW)
    lost = {
        **healthy,
        "orders-2": rs(
            2, "EMPTY", storage_condition="storage-lost", storage_fault="segment 3 missing"
        ),
    }
    second = st.compute_status(cr(), pods, lost, "", first.status, LATER)
    assert [(e.type, e.reason) for e in second.events if "Storage" in e.reason] == [
        ("Warning", "StorageLost")
    ]
    item = second.status["replicas"][2]
    assert (item["storage"], item["storageFault"]) == ("storage-lost", "segment 3 missing")
    (cond,) = [c for c in second.status["conditions"] if c["type"] == "StorageDegraded"]
    assert (cond["status"], cond["reason"]) == ("True", "StorageLost")
    # the pod restarts: no answer, the condition is kept, no second Event
    gone = {**lost, "orders-2": None}
    third = st.compute_status(cr(), pods, gone, "", second.status, LATER)
    assert not [e for e in third.events if "Storage" in e.reason]
    assert third.status["replicas"][2]["storage"] == "storage-lost"
    fourth = st.compute_status(cr(), pods, healthy, "", third.status, LATER)
    assert [(e.type, e.reason) for e in fourth.events if "Storage" in e.reason] == [
        ("Normal", "StorageHealthy")
    ]
    assert "storage" not in fourth.status["replicas"][2]


def test_the_replica_item_says_why_a_pod_fails():
    pods = [
        pod(0),
        pod(1, restoreFailed="s3 GET failed (exit code 1)"),
        pod(2, stuck="CrashLoopBackOff", crashLoop="rlog: error: no (exit code 2)"),
    ]
    r = st.compute_status(cr(), pods, {"orders-0": rs(0)}, "", None, NOW)
    one, two = r.status["replicas"][1:]
    assert one["reason"] == "restore failed: s3 GET failed (exit code 1)"
    assert two["reason"] == "pod CrashLoopBackOff: rlog: error: no (exit code 2)"
    assert two["crashLoop"] == "rlog: error: no (exit code 2)"
    assert {"RestoreFailed", "ReplicaCrashLooping"} <= {e.reason for e in r.events}


# ---- the operator's series --------------------------------------------------------------------


def test_metrics_of_storage_trouble_and_crash_loops():
    def storage(pod_, condition):
        labels = {"namespace": "ns", "name": "sh", "pod": pod_, "condition": condition}
        return REGISTRY.get_sample_value("rlog_operator_replica_storage_condition", labels)

    def crashing(pod_):
        labels = {"namespace": "ns", "name": "sh", "pod": pod_}
        return REGISTRY.get_sample_value("rlog_operator_replica_crash_looping", labels)

    items = [{"name": "sh-0", "storage": "restore-failed"}, {"name": "sh-1", "crashLoop": "x"}]
    metrics.observe_status("ns", "sh", {"replicas": items})
    assert storage("sh-0", "restore-failed") == 1 and crashing("sh-1") == 1
    metrics.observe_status("ns", "sh", {"replicas": [{"name": "sh-0"}, {"name": "sh-1"}]})
    assert storage("sh-0", "restore-failed") is None and crashing("sh-1") == 0
    metrics.observe_status("ns", "sh", {"replicas": items})
    metrics.forget("ns", "sh")
    assert storage("sh-0", "restore-failed") is None and crashing("sh-1") is None
