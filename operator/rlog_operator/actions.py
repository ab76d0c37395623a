"""The I/O of an observe tick: its status reported, then its plan (plan.py) carried out.

`report` writes what the tick observed (the status fields that changed, the annotations to
remove, the Events of the transitions, the metrics) before anything is done: a restart
resumes from the stored status and rolling queue. `carry_out` then does what `plan.decide`
chose, in its order: the permit calls, the mending of the owned objects (children.py), and
the one action: a requested step-down (and, should it fail, what the tick would have done
otherwise), storing the rolling queue, the rolling step (step-down, deletes with UID
preconditions) or the storage step. Failed permit and step-down calls are logged and retried
by the next tick; a failed rolling or storage step is a kopf.TemporaryError.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import Any

import kopf
from kubernetes.client.exceptions import ApiException

from rlog_operator import (
    children,
    kube,
    metrics,
    observed,
    pki_secrets,
    plan,
    replica_calls,
    rolling,
    specs,
)
from rlog_operator import constants as c
from rlog_operator import status as st
from rlog_operator import storage as sg


def report(
    body: kopf.Body, patch: kopf.Patch, previous: dict[str, Any], result: st.StatusResult
) -> None:
    """Persist the status (and the rolling queue) before acting: a restart resumes from it.
    Only what changed is written (an unchanged tick writes nothing)."""
    for key, value in st.status_patch(previous, result.status).items():
        patch.status[key] = value
    for key in result.remove_annotations:
        patch.metadata.annotations[key] = None
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    metrics.observe_status(specs.namespace_of(body), specs.name_of(body), result.status)


async def carry_out(
    chosen: plan.Plan,
    body: kopf.Body,
    patch: kopf.Patch,
    config: specs.OperatorConfig,
    *,
    sts: observed.StatefulSetRecord | None,
    owned: Callable[[], Collection[children.Child]],
    logger: kopf.Logger,
) -> None:
    """Do what the tick's plan says, in its order. `sts` is the log's StatefulSet as
    observed (None before it exists); `owned` reads the owned objects that exist now."""
    # permits.decide: grants are withheld while a replicas change is refused
    permit = chosen.permit
    uid = specs.uid_of(body)
    for name in permit.grant:
        await _permit(body, "grant", name, uid, config, logger)
    for name in permit.revoke:
        await _permit(body, "revoke", name, uid, config, logger)
    if not (permit.grant or permit.revoke):
        logger.debug("initialization permits: nothing to do: %s", permit.reason())
    if chosen.mend:
        await _mend_children(body, config, sts is not None, owned(), logger)
    await _take(chosen.action, body, patch, config, sts, logger)


async def _take(
    action: plan.Action,
    body: kopf.Body,
    patch: kopf.Patch,
    config: specs.OperatorConfig,
    sts: observed.StatefulSetRecord | None,
    logger: kopf.Logger,
) -> None:
    """The one action of the tick."""
    if isinstance(action, plan.AskedStepDown):
        if await _asked_step_down(body, action.leader, patch, config, logger):
            return
        action = action.otherwise  # the call failed: the tick goes on without it
    namespace = specs.namespace_of(body)
    if isinstance(action, plan.ChangeStorage):
        await _change_storage(body, action.step, sts, namespace, config, logger)
    elif isinstance(action, plan.StoreQueue):
        # The queue must be stored before the delete; kopf patches after the handler, so
        # write it now and act on the next tick.
        patch.status["rollingUpdate"] = action.step.as_status()
    elif isinstance(action, plan.Roll):
        await _roll(body, action.step, namespace, config, logger)


async def _permit(
    body: kopf.Body, what: str, pod: str, uid: str, config: specs.OperatorConfig, logger: Any
) -> None:
    try:
        await replica_calls.replica_call(
            replica_calls.endpoint(body, pod, config), what, uid, pki_secrets.credentials(body)
        )
        logger.info("%s initialization permit: %s", what, pod)
    except Exception as e:  # the next tick retries
        metrics.ERRORS.labels(handler=f"permit-{what}").inc()
        logger.warning("%s permit of %s failed: %s", what, pod, e)


async def _mend_children(
    body: kopf.Body,
    config: specs.OperatorConfig,
    built: bool,
    present: Collection[children.Child],
    logger: Any,
) -> None:
    """Create again the owned objects someone deleted, and delete those the spec no longer
    asks for (children.py); each with an Event."""
    namespace = specs.namespace_of(body)
    decision = children.decide(
        children.desired(body, config),
        present,
        specs.uid_of(body),
        built=built,
        paused=specs.paused(body),
        deleting=bool((body.get("metadata") or {}).get("deletionTimestamp")),
    )
    for wanted in decision.recreate:
        obj = dict(wanted)
        kopf.adopt(obj, owner=body, strict=True)
        kind, name = obj["kind"], obj["metadata"]["name"]
        try:
            # created; or patched if it exists without our label (which the patch restores)
            what = await asyncio.to_thread(kube.apply_one, obj)
        except ApiException as e:  # the next tick tries again
            metrics.ERRORS.labels(handler="children").inc()
            logger.warning("creating %s %s again: HTTP %s %s", kind, name, e.status, e.reason)
            continue
        metrics.CHILDREN_MENDED.labels(kind=kind, action="recreate").inc()
        if what == "created":
            message = f"{kind} {name} was deleted: created it again"
        else:
            message = f"{kind} {name} had lost the operator's labels: restored them"
        kopf.warn(body, reason="RecreatedChild", message=message)
        logger.info(message)
    for child in decision.remove:
        try:
            await asyncio.to_thread(kube.delete_child, child, namespace)
        except ApiException as e:
            metrics.ERRORS.labels(handler="children").inc()
            logger.warning("deleting %s %s: HTTP %s %s", child.kind, child.name, e.status, e.reason)
            continue
        metrics.CHILDREN_MENDED.labels(kind=child.kind, action="delete").inc()
        message = f"{child.kind} {child.name} is no longer in the spec: deleted it"
        kopf.info(body, reason="DeletedChild", message=message)
        logger.info(message)


async def _asked_step_down(
    body: kopf.Body, leader: str, patch: kopf.Patch, config: specs.OperatorConfig, logger: Any
) -> bool:
    """The step-down rlog.io/step-down asks for; whether the leader was asked."""
    try:
        await replica_calls.replica_call(
            replica_calls.endpoint(body, leader, config),
            "step-down",
            credentials=pki_secrets.credentials(body),
        )
    except Exception as e:  # the next tick retries
        logger.warning("step-down of %s failed: %s", leader, e)
        return False
    patch.metadata.annotations[c.ANNOTATION_STEP_DOWN] = None
    kopf.info(body, reason="StepDown", message=f"asked {leader} to step down (requested)")
    return True


async def _roll(
    body: kopf.Body,
    action: rolling.Action,
    namespace: str,
    config: specs.OperatorConfig,
    logger: Any,
) -> None:
    metrics.ROLLING_ACTIONS.labels(action=action.kind).inc()
    try:
        if action.kind == "step-down":
            await replica_calls.replica_call(
                replica_calls.endpoint(body, action.pod, config),
                "step-down",
                credentials=pki_secrets.credentials(body),
            )
            kopf.info(body, reason="StepDown", message=f"asked {action.pod} to step down")
        elif action.kind == "delete-pod":
            await asyncio.to_thread(kube.delete_pod, action.pod, namespace, action.uid)
            kopf.info(body, reason="ReplacingPod", message=f"deleted {action.pod}: {action.reason}")
        elif action.kind == "delete-pvc-and-pod":
            await asyncio.to_thread(kube.delete_pvc, action.pvc, namespace, action.pvc_uid)
            await asyncio.to_thread(kube.delete_pod, action.pod, namespace, action.uid)
            kopf.warn(
                body,
                reason="ReplacingVolume",
                message=f"deleted claim {action.pvc} and pod {action.pod}: {action.reason}",
            )
    except ApiException as e:
        metrics.ERRORS.labels(handler="rolling").inc()
        raise kube.temporary(e, f"{action.kind} {action.pod}") from e
    except Exception as e:
        metrics.ERRORS.labels(handler="rolling").inc()
        raise kopf.TemporaryError(f"{action.kind} {action.pod}: {e}", delay=5) from e
    logger.info("rolling: %s %s (%s)", action.kind, action.pod, action.reason)


# ---- storage expansion and migration (storage.py decides) -------------------------------------


def _statefulset(body: kopf.Body, config: specs.OperatorConfig) -> dict[str, Any]:
    """The StatefulSet the spec describes, owned by the log."""
    desired = specs.statefulset(body, config)
    kopf.adopt(desired, owner=body, strict=True)
    return desired


async def _change_storage(
    body: kopf.Body,
    step: sg.Step,
    sts: observed.StatefulSetRecord | None,
    namespace: str,
    config: specs.OperatorConfig,
    logger: Any,
) -> None:
    try:
        if step.kind == "create-statefulset":
            # created (it is gone); a patch only if it came back meanwhile
            await asyncio.to_thread(kube.apply_one, _statefulset(body, config))
            kopf.info(body, reason="StorageTemplate", message=step.reason)
        elif step.kind == "recreate-statefulset" and sts is not None:
            uid = str(sts.get("uid") or "")
            await asyncio.to_thread(kube.recreate_statefulset, _statefulset(body, config), uid)
            kopf.info(body, reason="StorageTemplate", message=step.reason)
        elif step.kind == "expand":
            await asyncio.to_thread(kube.expand_claim, step.claim, namespace, step.size)
            kopf.info(body, reason="ExpandingVolume", message=step.reason)
        elif step.kind == "migrate":
            await asyncio.to_thread(kube.ask_new_volume, step.pod, namespace)
            kopf.info(body, reason="MigratingVolume", message=step.reason)
    except ApiException as e:
        metrics.ERRORS.labels(handler="storage").inc()
        raise kube.temporary(e, f"storage {step.kind} {step.pod or step.claim}") from e
    logger.info("storage: %s (%s)", step.kind, step.reason)
