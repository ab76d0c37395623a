"""The small functions the status is composed of, each on hand-built Facts: the phase, one
condition setter each, the Events of transitions, the annotations to remove, the replica
items."""

from helpers import LATER, NAMES, NOW, UID, facts, pod, rs

from rlog_operator import status as st

DATA_LOSS_HOLD = (
    "every replica is EMPTY in a log that was initialized: suspected data loss; "
    f"set the annotation rlog.io/reinitialize={UID} to start an empty log"
)
NEW_LOG = dict(
    initialized=False,
    was_initialized=False,
    voting=(),
    quorum=False,
    leader="",
    states=dict.fromkeys(NAMES, "EMPTY"),
    recovering=NAMES,
)
LOST = dict(
    voting=(),
    quorum=False,
    leader="",
    data_loss=True,
    states=dict.fromkeys(NAMES, "EMPTY"),
    recovering=NAMES,
)


# ---- phase ------------------------------------------------------------------------------------


def test_phase_failed_comes_first():
    assert st.phase(facts(error="boom", data_loss=True)) == st.Phase("Failed", "boom")
    assert st.phase(facts(refused="no change")) == st.Phase("Failed", "no change")
    failed = st.phase(facts(foreign=("orders-1",)))
    assert failed.name == "Failed" and "orders-1 belong to another log" in failed.message


def test_phase_data_loss_says_how_to_reinitialize():
    assert st.phase(facts(**LOST)) == st.Phase("DataLoss", DATA_LOSS_HOLD)
    acked = facts(**LOST, annotations={"rlog.io/reinitialize": UID})
    assert st.phase(acked) == st.Phase(
        "DataLoss", "re-initialization acknowledged by rlog.io/reinitialize"
    )


def test_phase_pending_until_a_replica_answers():
    f = facts(**{**NEW_LOG, "reached": (), "pods": {"orders-0": pod(0)}})
    assert st.phase(f) == st.Phase("Pending", "waiting for the replicas (1/3 pods)")


def test_phase_initializing():
    assert st.phase(facts(**NEW_LOG)) == st.Phase("Initializing", "initializing: 3 EMPTY")
    waiting = st.phase(facts(**NEW_LOG, auto_initialize=False))
    assert waiting == st.Phase(
        "Initializing",
        f"spec.autoInitialize is false: set the annotation rlog.io/initialize={UID} "
        "to initialize the log",
    )


def test_phase_degraded_without_quorum():
    f = facts(voting=("orders-0",), quorum=False, leader="")
    assert st.phase(f) == st.Phase(
        "Degraded", "no VOTING quorum (1/3 VOTING, need 2): the log cannot serve"
    )


def test_phase_rolling_update():
    f = facts(rolling=True, outdated=("orders-2",))
    assert st.phase(f) == st.Phase("RollingUpdate", "2/3 replicas on the update revision")
    f = facts(rolling=True, rolling_message="replacing orders-1")
    assert st.phase(f) == st.Phase("RollingUpdate", "replacing orders-1")


def test_phase_degraded_recovering_not_ready_ready():
    assert st.phase(facts(down=("orders-2",), recovering=("orders-1",))) == st.Phase(
        "Degraded", "unreachable: orders-2"
    )
    assert st.phase(facts(recovering=("orders-1",))) == st.Phase(
        "Recovering", "catching up: orders-1"
    )
    assert st.phase(facts(ready=("orders-0",))) == st.Phase(
        "Degraded", "not ready: orders-1, orders-2"
    )
    assert st.phase(facts()) == st.Phase("Ready", "3/3 replicas VOTING, leader orders-0")


# ---- conditions -------------------------------------------------------------------------------


def test_the_setters_are_the_condition_types_in_order():
    assert [setter(facts()).type for setter in st.CONDITIONS] == list(st.CONDITION_TYPES)


def test_ready_condition():
    assert st.ready_condition(facts()) == st.Condition(
        "Ready", True, "QuorumVoting", "3/3 replicas VOTING (quorum 2)"
    )
    no_quorum = st.ready_condition(facts(voting=("orders-0",), quorum=False))
    assert no_quorum == st.Condition("Ready", False, "NoQuorum", "1/3 replicas VOTING (quorum 2)")
    assert st.ready_condition(facts(**NEW_LOG)).reason == "NotInitialized"
    # a quorum of a re-initialized log does not serve while data loss is still held
    held = st.ready_condition(facts(data_loss=True))
    assert held.value is False and held.reason == "NoQuorum"


def test_initialized_condition():
    assert st.initialized_condition(facts()) == st.Condition(
        "Initialized", True, "Initialized", "a replica has been VOTING"
    )
    assert st.initialized_condition(facts(**NEW_LOG)) == st.Condition(
        "Initialized", False, "Initializing", "a new log (spec.autoInitialize)"
    )
    waiting = st.initialized_condition(facts(**NEW_LOG, auto_initialize=False))
    assert waiting.value is False and waiting.reason == "AwaitingInitializeAnnotation"
    assert f"rlog.io/initialize={UID}" in waiting.message


def test_degraded_condition():
    assert st.degraded_condition(facts()) == st.Condition(
        "Degraded", False, "AllVoting", "not VOTING: none"
    )
    one_down = st.degraded_condition(facts(voting=("orders-0", "orders-1")))
    assert one_down == st.Condition("Degraded", True, "ReplicasNotVoting", "not VOTING: orders-2")
    no_quorum = st.degraded_condition(facts(voting=("orders-0",), quorum=False))
    assert no_quorum == st.Condition("Degraded", True, "NoQuorum", "not VOTING: orders-1, orders-2")
    # a log not yet initialized is not degraded
    assert st.degraded_condition(facts(**NEW_LOG)).value is False


def test_recovering_condition():
    assert st.recovering_condition(facts(recovering=("orders-1",))) == st.Condition(
        "Recovering", True, "CatchingUp", "catching up: orders-1"
    )
    assert st.recovering_condition(facts()) == st.Condition(
        "Recovering", False, "NoneRecovering", "catching up: none"
    )
    # EMPTY replicas of a new log are initializing, not recovering
    assert st.recovering_condition(facts(**NEW_LOG)).value is False


def test_rolling_update_condition_carries_the_phase_message():
    rolling = st.rolling_update_condition(facts(rolling=True, rolling_message="replacing orders-1"))
    assert rolling == st.Condition("RollingUpdate", True, "PodsOutdated", "replacing orders-1")
    degraded = st.rolling_update_condition(facts(rolling=True, voting=("orders-0",), quorum=False))
    assert degraded.message.startswith("no VOTING quorum")
    assert st.rolling_update_condition(facts()) == st.Condition(
        "RollingUpdate", False, "UpToDate", "every replica runs the update revision"
    )


def test_data_loss_condition():
    assert st.data_loss_condition(facts(**LOST)) == st.Condition(
        "DataLoss", True, "AllReplicasEmpty", DATA_LOSS_HOLD
    )
    assert st.data_loss_condition(facts()) == st.Condition(
        "DataLoss", False, "NoDataLoss", "no suspected data loss"
    )


def test_a_condition_keeps_its_transition_time_until_it_flips():
    before = [st.condition("Ready", True, "QuorumVoting", "", [], NOW, 1)]
    kept = st.Condition("Ready", True, "QuorumVoting", "x").as_status(before, LATER, 2)
    assert kept["lastTransitionTime"] == NOW and kept["observedGeneration"] == 2
    flipped = st.Condition("Ready", False, "NoQuorum", "x").as_status(before, LATER, 2)
    assert flipped["lastTransitionTime"] == LATER and flipped["status"] == "False"


# ---- events -----------------------------------------------------------------------------------


def reasons(events):
    return [e.reason for e in events]


STEADY = {
    "initialized": True,
    "quorum": True,
    "leader": "orders-0",
    "phase": "Ready",
    "replicas": [{"name": name, "status": "VOTING"} for name in NAMES],
}


def test_no_events_when_nothing_changes():
    assert st.events(STEADY, facts(was_initialized=True)) == []


def test_initialized_event_once():
    first = st.events({}, facts(was_initialized=False))
    assert st.Event("Normal", "Initialized", "the log is initialized: 3 VOTING") in first
    assert "Initialized" not in reasons(st.events(STEADY, facts()))


def test_data_loss_and_reinitialized_events():
    empty = [{"name": name, "status": "EMPTY"} for name in NAMES]
    lost = {**STEADY, "quorum": False, "leader": "", "replicas": empty}
    assert st.events(lost, facts(**LOST)) == [st.Event("Warning", "DataLoss", DATA_LOSS_HOLD)]
    assert st.events(lost, facts(**LOST, was_data_loss=True)) == []  # no repeat
    back = st.events(lost, facts(was_data_loss=True))
    assert st.Event("Normal", "Reinitialized", "the log serves again: 3 VOTING") in back


def test_quorum_lost_and_restored():
    down = facts(voting=("orders-0",), quorum=False, leader="")
    (event,) = st.events(STEADY, down)
    assert event == st.Event("Warning", "QuorumLost", st.phase(down).message)
    no_quorum = {**STEADY, "quorum": False, "leader": ""}
    assert st.Event("Normal", "QuorumRestored", "3/3 replicas VOTING") in st.events(
        no_quorum, facts()
    )
    # a status that never said "quorum" (the first one) restores nothing
    first = {k: v for k, v in no_quorum.items() if k != "quorum"}
    assert "QuorumRestored" not in reasons(st.events(first, facts()))
    # a quorum lost to a suspected data loss is reported as DataLoss only
    assert reasons(st.events(STEADY, facts(**LOST))) == ["DataLoss"] + ["ReplicaEmpty"] * 3


def test_leader_elected():
    assert st.events(STEADY, facts(leader="orders-2")) == [
        st.Event("Normal", "LeaderElected", "orders-2 leads the log (was orders-0)")
    ]
    (event,) = [e for e in st.events({}, facts()) if e.reason == "LeaderElected"]
    assert event.message == "orders-0 leads the log (was none)"


def test_replica_empty_and_recovered():
    states = {**dict.fromkeys(NAMES, "VOTING"), "orders-1": "EMPTY"}
    (event,) = st.events(STEADY, facts(states=states))
    assert event == st.Event(
        "Warning",
        "ReplicaEmpty",
        "orders-1 came back EMPTY (its volume was lost or replaced): "
        "it recovers from the VOTING replicas",
    )
    catching_up = {
        **STEADY,
        "replicas": [
            {"name": "orders-0", "status": "VOTING"},
            {"name": "orders-1", "status": "RECOVERING"},
            {"name": "orders-2", "status": "EMPTY"},
        ],
    }
    assert st.events(catching_up, facts()) == [
        st.Event("Normal", "ReplicaRecovered", "orders-1 caught up and is VOTING"),
        st.Event("Normal", "ReplicaRecovered", "orders-2 caught up and is VOTING"),
    ]
    # the first VOTING replicas of a new log have not recovered anything
    first = {**catching_up, "initialized": False}
    assert "ReplicaRecovered" not in reasons(st.events(first, facts(was_initialized=False)))


def test_rolling_update_started_and_completed():
    (started,) = st.events(STEADY, facts(rolling=True, outdated=("orders-1", "orders-2")))
    assert started == st.Event(
        "Normal", "RollingUpdateStarted", "replacing orders-1, orders-2 one at a time"
    )
    rolling = {**STEADY, "conditions": [{"type": "RollingUpdate", "status": "True"}]}
    assert st.events(rolling, facts(rolling=True)) == []
    assert st.events(rolling, facts()) == [
        st.Event("Normal", "RollingUpdateCompleted", "every replica runs the update revision")
    ]


def test_failed_event_once():
    assert st.events(STEADY, facts(error="boom")) == [st.Event("Warning", "Failed", "boom")]
    assert st.events({**STEADY, "phase": "Failed"}, facts(error="boom")) == []


# ---- annotations ------------------------------------------------------------------------------


def test_the_reinitialize_ack_is_removed_once_the_log_serves_again():
    ack = {"rlog.io/reinitialize": UID}
    assert st.annotations_to_remove(facts(was_data_loss=True, annotations=ack)) == [
        "rlog.io/reinitialize"
    ]
    assert st.annotations_to_remove(facts(**LOST, was_data_loss=True, annotations=ack)) == []
    assert st.annotations_to_remove(facts(was_data_loss=True)) == []
    assert st.annotations_to_remove(facts(annotations={"rlog.io/initialize": UID})) == []


# ---- replica items ----------------------------------------------------------------------------


def test_replica_item_of_an_answering_replica():
    replicas = {**facts().replicas, "orders-1": rs(1, "RECOVERING", catchup_end=50, reason="x")}
    item = st.replica_item(facts(replicas=replicas), "orders-1")
    assert item == {
        "name": "orders-1",
        "status": "RECOVERING",
        "ready": True,
        "revision": "orders-7c9a",
        "updated": True,
        "role": "follower",
        "begin": 0,
        "end": 100,
        "learned": 100,
        "catchup": "0/50",
        "reason": "x",
    }


def test_replica_item_says_why_a_replica_does_not_answer():
    def reason(pod_or_none):
        pods = {**facts().pods}
        if pod_or_none is None:
            del pods["orders-2"]
        else:
            pods["orders-2"] = pod_or_none
        replicas = {**facts().replicas, "orders-2": None}
        return st.replica_item(facts(pods=pods, replicas=replicas), "orders-2")["reason"]

    assert reason(None) == "no pod"
    assert reason(pod(2, terminating=True)) == "pod terminating"
    assert reason(pod(2, stuck="CrashLoopBackOff")) == "pod CrashLoopBackOff"
    assert reason(pod(2, unschedulable="0/3 nodes")) == "unschedulable: 0/3 nodes"
    assert reason(pod(2, phase="Pending")) == "unreachable (pod Pending)"
