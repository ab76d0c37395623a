"""What the observe timer does on a tick (rlog_operator.plan), one rule per test: every branch
of the order, and which action wins over which."""

from helpers import facts

from rlog_operator import plan
from rlog_operator.permits import PermitDecision
from rlog_operator.plan import AskedStepDown, ChangeStorage, Idle, Plan, Roll, StoreQueue
from rlog_operator.rolling import Action
from rlog_operator.storage import Step

ASKED = {"rlog.io/step-down": "true"}
QUEUED = [{"pod": "orders-2", "uid": "uid-2", "action": "restart", "revision": "r"}]

NOTHING = Action("none")
WAITING = Action("wait", pod="orders-1", reason="replacing orders-1: orders-2 is catching up")
DELETE = Action("delete-pod", pod="orders-2", uid="uid-2", reason="replacing orders-2")
DELETE_QUEUED = Action(
    "delete-pod", pod="orders-2", uid="uid-2", reason="replacing orders-2", queue=QUEUED
)
STEP_DOWN = Action(
    "step-down",
    pod="orders-0",
    uid="uid-0",
    reason="asking the leader orders-0 to step down before replacing it",
)
VOLUME = Action(
    "delete-pvc-and-pod",
    pod="orders-1",
    uid="uid-1",
    pvc="data-orders-1",
    pvc_uid="pvc-1",
    reason="replacing the volume of orders-1",
    queue=QUEUED,
)

IDLE_STORAGE = Step("none")
EXPAND = Step("expand", "expanding data-orders-0 to 2Gi", pod="orders-0", claim="data-orders-0")
STORAGE_WAITS = Step("wait", "looking up whether the StorageClass can expand")

GRANT = PermitDecision(True, "a new log (spec.autoInitialize)", grant=("orders-1",))
NO_PERMIT = PermitDecision(False, "the log is initialized")


def decide(
    f=None,
    *,
    paused=False,
    permit=NO_PERMIT,
    rolling_step=NOTHING,
    stored_queue=(),
    storage_step=IDLE_STORAGE,
):
    return plan.decide(
        f if f is not None else facts(),
        paused=paused,
        permit=permit,
        rolling_step=rolling_step,
        stored_queue=stored_queue,
        storage_step=storage_step,
    )


# ---- nothing to do ----------------------------------------------------------------------------


def test_a_healthy_log_mends_and_does_nothing_else():
    assert decide() == Plan(NO_PERMIT, True, Idle("nothing to replace, no storage step"))


# ---- paused or refused: the permits, and nothing more -----------------------------------------


def test_a_paused_log_only_observes():
    paused = PermitDecision(False, "reconciliation is paused (rlog.io/paused)")
    chosen = decide(paused=True, permit=paused, rolling_step=DELETE, storage_step=EXPAND)
    assert chosen == Plan(paused, False, Idle("paused (rlog.io/paused): observing only"))


def test_a_refused_replicas_change_still_carries_out_the_permits_and_nothing_more():
    refusal = "spec.replicas cannot change (3 -> 5): ..."
    revoke = PermitDecision(False, "the log is initialized", revoke=("orders-2",))
    chosen = decide(facts(refused=refusal), permit=revoke, rolling_step=DELETE)
    assert chosen == Plan(revoke, False, Idle(refusal))


def test_pause_and_refusal_both_stop_a_requested_step_down():
    asked = facts(annotations=ASKED)
    assert decide(asked, paused=True).action == Idle("paused (rlog.io/paused): observing only")
    assert decide(facts(annotations=ASKED, refused="no")).action == Idle("no")
    assert not decide(asked, paused=True).mend


def test_the_permits_go_with_every_plan():
    for chosen in (
        decide(permit=GRANT),
        decide(permit=GRANT, rolling_step=DELETE),
        decide(facts(annotations=ASKED), permit=GRANT),
        decide(permit=GRANT, paused=True),
    ):
        assert chosen.permit == GRANT


# ---- a requested step-down goes first -----------------------------------------------------------


def test_a_requested_step_down_asks_the_leader():
    chosen = decide(facts(annotations=ASKED))
    assert chosen == Plan(
        NO_PERMIT,
        True,
        AskedStepDown("orders-0", otherwise=Idle("nothing to replace, no storage step")),
    )
    assert chosen.why == "rlog.io/step-down asks the leader orders-0 to step down"


def test_a_requested_step_down_waits_for_a_leader():
    assert decide(facts(annotations=ASKED, leader="")).action == Idle(
        "nothing to replace, no storage step"
    )
    assert decide(facts(annotations=ASKED, leader=""), rolling_step=DELETE).action == Roll(DELETE)


def test_a_requested_step_down_wins_over_rolling_and_storage_which_follow_if_it_fails():
    asked = facts(annotations=ASKED)
    assert decide(asked, rolling_step=DELETE).action == AskedStepDown("orders-0", Roll(DELETE))
    assert decide(asked, storage_step=EXPAND).action == AskedStepDown(
        "orders-0", ChangeStorage(EXPAND)
    )
    assert decide(asked, rolling_step=DELETE_QUEUED).action == AskedStepDown(
        "orders-0", StoreQueue(DELETE_QUEUED)
    )
    assert decide(asked, rolling_step=WAITING).action == AskedStepDown(
        "orders-0", Idle(f"the rolling replacement waits: {WAITING.reason}")
    )


def test_an_empty_step_down_annotation_asks_nothing():
    assert decide(facts(annotations={"rlog.io/step-down": ""})).action == Idle(
        "nothing to replace, no storage step"
    )


# ---- the rolling replacement --------------------------------------------------------------------


def test_a_new_queue_is_stored_before_the_step():
    chosen = decide(rolling_step=DELETE_QUEUED, stored_queue=[])
    assert chosen.action == StoreQueue(DELETE_QUEUED)
    assert chosen.why == "the rolling queue is stored before delete-pod orders-2"


def test_the_step_is_taken_once_its_queue_is_stored():
    assert decide(rolling_step=DELETE_QUEUED, stored_queue=QUEUED).action == Roll(DELETE_QUEUED)
    assert decide(rolling_step=VOLUME, stored_queue=QUEUED).action == Roll(VOLUME)
    chosen = decide(rolling_step=DELETE)  # an empty queue, stored as empty
    assert chosen.action == Roll(DELETE) and chosen.why == "replacing orders-2"


def test_the_leader_steps_down_before_its_replacement():
    assert decide(rolling_step=STEP_DOWN).action == Roll(STEP_DOWN)


def test_a_finished_entry_leaving_the_queue_needs_no_store_of_its_own():
    # the status written this tick already carries the shorter queue
    assert decide(rolling_step=NOTHING, stored_queue=QUEUED).action == Idle(
        "nothing to replace, no storage step"
    )
    assert decide(rolling_step=WAITING, stored_queue=QUEUED).action == Idle(
        f"the rolling replacement waits: {WAITING.reason}"
    )


# ---- storage: only while the rolling replacement has nothing to do -----------------------------


def test_a_storage_step_when_nothing_rolls():
    chosen = decide(storage_step=EXPAND)
    assert chosen == Plan(NO_PERMIT, True, ChangeStorage(EXPAND))
    assert chosen.why == "expanding data-orders-0 to 2Gi"
    for kind in ("create-statefulset", "recreate-statefulset", "migrate"):
        step = Step(kind, f"a {kind}")
        assert decide(storage_step=step).action == ChangeStorage(step)


def test_a_refused_shrink_reaches_the_storage_action_which_only_logs_it():
    refuse = Step("refuse", "spec.storage.size cannot shrink (2Gi -> 1Gi): ...")
    assert decide(storage_step=refuse).action == ChangeStorage(refuse)


def test_a_waiting_storage_step_does_nothing():
    assert decide(storage_step=STORAGE_WAITS).action == Idle(
        "the storage step waits: looking up whether the StorageClass can expand"
    )


def test_rolling_wins_over_storage_also_while_it_waits():
    assert decide(rolling_step=DELETE, storage_step=EXPAND).action == Roll(DELETE)
    assert decide(rolling_step=DELETE_QUEUED, storage_step=EXPAND).action == StoreQueue(
        DELETE_QUEUED
    )
    assert decide(rolling_step=WAITING, storage_step=EXPAND).action == Idle(
        f"the rolling replacement waits: {WAITING.reason}"
    )
