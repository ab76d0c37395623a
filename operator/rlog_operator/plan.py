"""What the observe timer does on one tick: a pure function of what the tick gathered.

A tick observes the log, writes its status, and then acts. `decide` says how it acts, in
this order:

1. The initialization permits of `permits.decide` are granted and revoked, on every tick:
   also while a replicas change is refused (grants are withheld then, revocations go out);
   a paused log's decision holds none.
2. Nothing more while the log is paused (rlog.io/paused) or a replicas change is refused.
3. The owned objects are mended (children.py).
4. Then ONE action, the first that applies:
   * the step-down the user asked for with rlog.io/step-down, once the log has a leader;
     should the call fail, the tick goes on with the action it would have taken without
     the request (`AskedStepDown.otherwise`), and the next tick asks again;
   * the rolling replacement's step (rolling.next_step), when it has one: a changed queue
     is stored first and the step taken on the next tick, since the queue must be stored
     before the delete and kopf patches the status only after the handler returns;
   * the storage step (storage.next_step), only while the rolling replacement has nothing
     to do (not while it waits);
   * nothing.

The actions themselves (the I/O) are actions.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rlog_operator import constants as c
from rlog_operator import rolling
from rlog_operator import storage as sg
from rlog_operator.facts import Facts
from rlog_operator.observed import step_down_requested
from rlog_operator.permits import PermitDecision


@dataclass(frozen=True)
class Idle:
    """Nothing to do on this tick, and why."""

    why: str


@dataclass(frozen=True)
class StoreQueue:
    """Store the rolling queue of `step` (status.rollingUpdate) and take the step next tick."""

    step: rolling.Action

    @property
    def why(self) -> str:
        return f"the rolling queue is stored before {self.step.kind} {self.step.pod}"


@dataclass(frozen=True)
class Roll:
    """Take the rolling replacement's step: a step-down, a pod or a claim and pod deleted."""

    step: rolling.Action

    @property
    def why(self) -> str:
        return self.step.reason


@dataclass(frozen=True)
class ChangeStorage:
    """Take the storage step (a StatefulSet created again or replaced, a claim expanded, a
    pod asked for a new volume). A refused shrink comes here too: the action only logs it."""

    step: sg.Step

    @property
    def why(self) -> str:
        return self.step.reason


# what the operator's own rules (rolling.py, storage.py) ask of the tick
Work = Idle | StoreQueue | Roll | ChangeStorage


@dataclass(frozen=True)
class AskedStepDown:
    """Ask the leader to step down, as rlog.io/step-down requests; if the call fails, do
    `otherwise`."""

    leader: str
    otherwise: Work

    @property
    def why(self) -> str:
        return f"{c.ANNOTATION_STEP_DOWN} asks the leader {self.leader} to step down"


Action = AskedStepDown | Work


@dataclass(frozen=True)
class Plan:
    """What the tick does, in order: the permits, the mending of the owned objects (when
    `mend`), then the one action."""

    permit: PermitDecision
    mend: bool
    action: Action

    @property
    def why(self) -> str:
        return self.action.why


def decide(
    facts: Facts,
    *,
    paused: bool,
    permit: PermitDecision,
    rolling_step: rolling.Action,
    stored_queue: Sequence[Mapping[str, Any]],
    storage_step: sg.Step,
) -> Plan:
    """This tick's plan (see the module docs for the order).

    `facts` are the observation's (refused, leader, annotations); `paused` the log's
    rlog.io/paused annotation; `permit` the permit decision of the status
    (status.compute_status); `rolling_step` what rolling.next_step decided; `stored_queue`
    the rolling queue stored in the status before this tick; `storage_step` what
    storage.next_step decided (Step("none") while paused or refused)."""
    if paused:
        return Plan(permit, False, Idle(f"paused ({c.ANNOTATION_PAUSED}): observing only"))
    if facts.refused:
        return Plan(permit, False, Idle(facts.refused))
    work = _work(rolling_step, stored_queue, storage_step)
    asked = step_down_requested(facts.annotations, facts.leader)
    if asked:
        return Plan(permit, True, AskedStepDown(asked, otherwise=work))
    return Plan(permit, True, work)


def _work(
    step: rolling.Action, stored_queue: Sequence[Mapping[str, Any]], storage_step: sg.Step
) -> Work:
    """The rolling step if it has one, else the storage step, else nothing."""
    if step.kind == "wait":
        return Idle(f"the rolling replacement waits: {step.reason}")
    if step.kind == "none":
        if storage_step.kind == "wait":
            return Idle(f"the storage step waits: {storage_step.reason}")
        if storage_step.kind == "none":
            return Idle("nothing to replace, no storage step")
        return ChangeStorage(storage_step)
    if step.queue != list(stored_queue):
        return StoreQueue(step)
    return Roll(step)
