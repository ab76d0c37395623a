"""kopf handlers of the rlog operator: thin I/O around the pure modules.

* create/update/resume: apply `specs.desired_objects` (create, or patch what exists), each
  object adopted by the ReplicatedLog (`kopf.adopt(..., strict=True)`), refusing a change of
  `spec.replicas` that slipped past the CRD's CEL rule (condition + PermanentError).
* kopf indexes of the replicas' pods, claims and StatefulSets (watched with a server-side
  label selector) and of existing PersistentVolume names: no list calls in the loop.
* a 1 s timer per ReplicatedLog: read the log's pods and claims from the indexes, ask every
  replica its Status through the headless Service's DNS names (short timeouts,
  concurrently, over one kept channel per replica), then `rolling.next_step` and
  `status.compute_status` (the facts of the observation, the status, its Events and the
  `permits.decide` decision); patch the status fields that changed, emit Events,
  grant/revoke initialization permits (the CR's uid is the log id) and perform the one
  rolling action (deletes with UID preconditions; step-down of the leader); mend the
  owned objects (children.py: create again what was deleted, delete what the spec dropped)
  from kopf indexes of the operator's labelled Services, budgets, policies and Deployments.

Operator settings (startup): one acting operator. The chart runs two pods; only the holder of
a Lease runs kopf (rlog_operator.election, lease.py; main.py stands by before kopf starts)
and kopf runs `--standalone` (no peering objects). Should two ever act at once (a holder cut
off from the API server for longer than its renew deadline is already exiting), every
destructive action is a delete with a UID precondition decided from current observations and
`rolling.next_step` never takes a log below quorum, so a stale twin cannot do harm.

The Kubernetes client is the synchronous `kubernetes` package, run in threads
(`asyncio.to_thread`) so kopf's event loop never blocks.
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import logging
import os
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from rlog_operator import (
    archive_http,
    children,
    kube,
    metrics,
    netpol,
    observed,
    pki,
    pki_secrets,
    replica_calls,
    rolling,
    specs,
)
from rlog_operator import constants as c
from rlog_operator import status as st
from rlog_operator import storage as sg

# Fresh status: `status.replicas` follows a replica's state and positions within about a
# second. A tick asks each replica Status over a kept channel (cheap for the replica: a
# local read) and writes only the status fields that changed (`status.status_patch`): an
# idle log costs the API server nothing, a log under load one status patch a second.
TIMER_INTERVAL = 1.0

# The owned objects children.py re-creates when deleted carry the operator's managed-by label.
OWNED_LABELS = {c.LABEL_MANAGED_BY: c.MANAGED_BY}
OWNED_SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGED_BY}"

Logger = logging.Logger | logging.LoggerAdapter[Any]

CONFIG = specs.OperatorConfig.from_env(os.environ)


# ---- startup --------------------------------------------------------------------------------


@kopf.on.startup()
def configure(*, settings: kopf.OperatorSettings, logger: Logger, **_: Any) -> None:
    # Watches: the server ends a watch after server_timeout (kopf re-lists and re-watches), the
    # client gives up a bit later, so a silently dead connection is noticed within ~1.5 min.
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    settings.watching.connect_timeout = 10
    # kopf's own requests (patches, finalizers, events): a minute, not its default five, so a
    # silently dead connection delays a deletion's finalizer removal that long at most.
    settings.networking.request_timeout = 60
    settings.networking.connect_timeout = 10
    # Only Normal events and up become Kubernetes Events (kopf's debug chatter stays in logs).
    settings.posting.level = logging.INFO
    # A single active operator (module docs): standalone, no peering.
    settings.peering.standalone = True
    # No watching of CRDs and namespaces (least privilege: the chart grants neither): kopf
    # finds the ReplicatedLog resource once at startup through discovery, and takes the
    # watched namespaces as given. A CRD installed after the operator needs a restart.
    settings.scanning.disabled = True
    # Retry a failed handler after a short, bounded delay.
    settings.execution.max_workers = 8
    settings.persistence.finalizer = f"{c.GROUP}/operator"
    # Watch only the replicas' pods, claims and StatefulSets (server-side label selector),
    # not every pod of the cluster; PersistentVolumes carry no labels of ours.
    for resource in ("pods", "persistentvolumeclaims", "statefulsets"):
        settings.watching.label_selectors[resource] = observed.REPLICA_SELECTOR
    # ... and only the owned objects children.py re-creates when deleted (labelled by us).
    for group, plural in children.WATCHED.values():
        key = (group, plural) if group else plural
        settings.watching.label_selectors[key] = OWNED_SELECTOR
    kube.load_kube_config()
    port = int(os.environ.get("RLOG_OPERATOR_METRICS_PORT", "8080"))
    if port:
        metrics.serve(port)
        logger.info("operator metrics on :%d/metrics", port)


# ---- applying the desired objects -----------------------------------------------------------


def _desired(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every object the log owns, in the order to create it (the policy first)."""
    return [*netpol.for_log(body, CONFIG), *specs.desired_objects(body, CONFIG)]


def _temporary(e: ApiException, what: str) -> kopf.TemporaryError:
    return kopf.TemporaryError(f"{what}: HTTP {e.status} {e.reason}", delay=10)


@kopf.on.create(c.GROUP, c.VERSION, c.PLURAL)
@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL)
@kopf.on.resume(c.GROUP, c.VERSION, c.PLURAL)
async def reconcile(
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: Logger,
    **_: Any,
) -> None:
    body = snapshot(body)  # see snapshot(): a handler's body is live while timers run
    metrics.RECONCILES.labels(handler="apply").inc()
    if specs.paused(body):
        # Nothing is applied while paused; removing the annotation is an update, which
        # applies everything changed meanwhile.
        patch.status["paused"] = True
        kopf.info(body, reason="Paused", message=f"{c.ANNOTATION_PAUSED}: nothing applied")
        return
    objects = _desired(body)
    sts_name = specs.statefulset_name(body)
    namespace = specs.namespace_of(body)
    try:
        existing = await asyncio.to_thread(kube.read_statefulset, sts_name, namespace)
    except ApiException as e:
        metrics.ERRORS.labels(handler="apply").inc()
        raise _temporary(e, f"reading StatefulSet {sts_name}") from e
    wanted = specs.replicas_of(body)
    if existing is not None:
        have = int((existing.get("spec") or {}).get("replicas") or 0)
        message = observed.replicas_changed(have, wanted)
        if message:
            now = _now()
            previous = list((body.get("status") or {}).get("conditions") or [])
            patch.status["conditions"] = _with_condition(
                previous,
                st.condition(
                    "Ready", False, "ReplicasChanged", message, previous, now, _generation(body)
                ),
            )
            patch.status["phase"] = "Failed"
            patch.status["message"] = message
            kopf.warn(body, reason="ReplicasChanged", message=message)
            metrics.ERRORS.labels(handler="apply").inc()
            raise kopf.PermanentError(message)
    if existing is not None:
        # volumeClaimTemplates are immutable: keep the built one (the observe timer replaces
        # the StatefulSet when spec.storage changed, see storage.py)
        built_claims = (existing.get("spec") or {}).get("volumeClaimTemplates")
        for obj in objects:
            if obj["kind"] == "StatefulSet" and built_claims:
                obj["spec"]["volumeClaimTemplates"] = built_claims
    try:  # the Secrets first: the pods mount them
        await pki_secrets.ensure_pki(body, CONFIG, logger)
    except ApiException as e:
        metrics.ERRORS.labels(handler="apply").inc()
        raise _temporary(e, "writing the log's certificates") from e
    except pki_secrets.SecretRaced as raced:
        # Another operator pod wrote it (an HA hand-over): the next pass plans with it.
        raise kopf.TemporaryError(f"Secret {raced} was created meanwhile", delay=2) from None
    for obj in objects:
        kopf.adopt(obj, owner=body, strict=True)
        try:
            what = await asyncio.to_thread(kube.apply_one, obj)
        except ApiException as e:
            metrics.ERRORS.labels(handler="apply").inc()
            if e.status in (400, 403, 422):
                message = f"{obj['kind']} {obj['metadata']['name']}: {e.reason}: {e.body}"
                kopf.warn(body, reason="ApplyFailed", message=message[:1000])
                raise kopf.PermanentError(message) from e
            raise _temporary(e, f"applying {obj['kind']} {obj['metadata']['name']}") from e
        logger.info("%s %s %s", what, obj["kind"], obj["metadata"]["name"])


def _with_condition(
    previous: list[Mapping[str, Any]], new: Mapping[str, Any]
) -> list[Mapping[str, Any]]:
    return [cond for cond in previous if cond.get("type") != new.get("type")] + [new]


def _generation(body: Mapping[str, Any]) -> int:
    return int((body.get("metadata") or {}).get("generation") or 0)


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- observing: indexes kept current by watch streams ---------------------------------------
# The observe timer reads these instead of listing objects every few seconds. kopf fills
# every index before it calls any handler, so a fresh operator never acts on an empty view.


@kopf.index("pods", labels=dict(observed.REPLICA_LABELS))
def replica_pods(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[observed.LogKey, observed.PodInfo]:
    key = observed.log_key(namespace, labels)
    return {key: observed.pod_info(body)} if key else {}


@kopf.index("persistentvolumeclaims", labels=dict(observed.REPLICA_LABELS))
def replica_claims(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[observed.LogKey, observed.PvcInfo]:
    key = observed.log_key(namespace, labels)
    return {key: observed.claim_record(body)} if key else {}


@kopf.index("apps", "v1", "statefulsets", labels=dict(observed.REPLICA_LABELS))
def replica_statefulsets(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[observed.LogKey, observed.StatefulSetRecord]:
    key = observed.log_key(namespace, labels)
    return {key: observed.statefulset_record(body)} if key else {}


def _owned(
    kind: str, namespace: str | None, labels: Mapping[str, str], body: kopf.Body
) -> dict[observed.LogKey, children.Child]:
    key, child = observed.log_key(namespace, labels), children.child_of(kind, body)
    return {key: child} if key and child else {}


@kopf.index("services", labels=OWNED_LABELS)
def owned_services(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[observed.LogKey, children.Child]:
    return _owned("Service", namespace, labels, body)


@kopf.index("policy", "v1", "poddisruptionbudgets", labels=OWNED_LABELS)
def owned_disruption_budgets(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[observed.LogKey, children.Child]:
    return _owned("PodDisruptionBudget", namespace, labels, body)


@kopf.index("networking.k8s.io", "v1", "networkpolicies", labels=OWNED_LABELS)
def owned_network_policies(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[observed.LogKey, children.Child]:
    return _owned("NetworkPolicy", namespace, labels, body)


@kopf.index("apps", "v1", "deployments", labels=OWNED_LABELS)
def owned_deployments(
    namespace: str | None, labels: Mapping[str, str], body: kopf.Body, **_: Any
) -> dict[observed.LogKey, children.Child]:
    return _owned("Deployment", namespace, labels, body)


_OWNED_INDEXES = (
    "owned_services",
    "owned_disruption_budgets",
    "owned_network_policies",
    "owned_deployments",
)


@kopf.index("persistentvolumes")
def persistent_volumes(name: str | None, **_: Any) -> dict[str, bool]:
    """Names of existing volumes: a Bound claim whose volume is missing has lost it."""
    return {name: True} if name else {}


def _observe(
    body: Mapping[str, Any],
    pods_index: kopf.Index[observed.LogKey, observed.PodInfo],
    claims_index: kopf.Index[observed.LogKey, observed.PvcInfo],
    statefulsets_index: kopf.Index[observed.LogKey, observed.StatefulSetRecord],
    volumes_index: kopf.Index[str, bool],
) -> tuple[list[observed.PodInfo], dict[str, observed.PvcInfo], observed.StatefulSetRecord | None]:
    """The log's pods, its claims (by name) and its StatefulSet (None before it exists)."""
    key = (specs.namespace_of(body), specs.name_of(body))
    pods = list(pods_index.get(key, []))
    # An empty volume index means "not known" (a cluster with Bound claims has volumes):
    # never conclude that every volume is gone from an index that saw none.
    claims = observed.claims_by_name(
        claims_index.get(key, []), volumes_index if len(volumes_index) else None
    )
    sts = next(iter(statefulsets_index.get(key, [])), None)
    return pods, claims, sts


# ---- acting ---------------------------------------------------------------------------------


def snapshot(body: kopf.Body) -> kopf.Body:
    """A copy of `body` that later watch events do not change.

    While a timer runs for an object, kopf hands every handler of that object the live body,
    replaced in place by each watch event. A handler must decide from one version of the
    object: a spec change landing during an await once made one observe tick list five
    replicas (the new spec) next to the refusal of that change (the old one)."""
    return kopf.Body(cast(kopf.RawBody, copy.deepcopy(dict(body))))


@kopf.timer(c.GROUP, c.VERSION, c.PLURAL, interval=TIMER_INTERVAL, initial_delay=2.0)
async def observe(
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: Logger,
    **indexes: Any,  # kopf passes every index by its name
) -> None:
    body = snapshot(body)
    metrics.RECONCILES.labels(handler="observe").inc()
    namespace = specs.namespace_of(body)
    uid = specs.uid_of(body)
    pods, pvcs, sts = _observe(
        body,
        indexes["replica_pods"],
        indexes["replica_claims"],
        indexes["replica_statefulsets"],
        indexes["persistent_volumes"],
    )
    update_revision = sts["updateRevision"] if sts else ""
    # A replicas change that got past the CRD (no CEL) is refused by `reconcile`; until it is
    # undone, observe the log as built, report the refusal, and take no action on it.
    refused = observed.replicas_changed(sts["replicas"] if sts else 0, specs.replicas_of(body))
    view: Mapping[str, Any] = observed.as_built(body, sts["replicas"]) if refused and sts else body

    try:  # renewals; and the operator's own credentials after a restart
        await pki_secrets.ensure_pki(body, CONFIG, logger)
    except ApiException as e:
        metrics.ERRORS.labels(handler="pki").inc()
        logger.warning("the log's certificates: HTTP %s %s", e.status, e.reason)
    except pki_secrets.SecretRaced as raced:
        logger.info("Secret %s was created meanwhile: planned again next tick", raced)
    credentials = pki_secrets.credentials(body)
    names = [specs.pod_name(view, i) for i in range(specs.replicas_of(view))]
    answers = await asyncio.gather(
        *(
            replica_calls.replica_status(replica_calls.endpoint(body, n, CONFIG), credentials)
            for n in names
        )
    )
    statuses: dict[str, observed.ReplicaStatus | None] = dict(zip(names, answers, strict=True))

    previous = dict(body.get("status") or {})
    tls = pki.tls_status(body)
    if previous.get("tls") != tls:
        patch.status["tls"] = tls
    queue = list((previous.get("rollingUpdate") or {}).get("queue") or [])
    now = _now()
    paused = specs.paused(body)
    if paused:  # observe only: the stored rolling queue stays as it is
        message = str((previous.get("rollingUpdate") or {}).get("message") or "")
        action = rolling.Action("none", queue=queue, reason=message)
    else:
        action = rolling.next_step(view, pods, statuses, update_revision, queue, pvcs, now=now)
    result = st.compute_status(
        view,
        pods,
        statuses,
        update_revision,
        previous,
        now,
        rolling_update=action.as_status(),
        refused=refused,
        paused=paused,
    )

    storage_step = sg.Step("none")
    if not (paused or refused):
        storage_step = await _storage_step(body, pods, pvcs, sts, statuses, result.status, queue)
        result.status["migration"] = sg.migration_status(
            sg.Storage.of_spec(body), sg.claims_of(body, pvcs), storage_step
        )
        if (
            storage_step.kind == "refuse"
            and (previous.get("migration") or {}).get("phase") != "Refused"
        ):
            kopf.warn(body, reason="StorageShrinkRefused", message=storage_step.reason)

    # Persist the status (and the rolling queue) before acting: a restart resumes from it.
    # Only what changed is written (an unchanged tick writes nothing).
    for key, value in st.status_patch(previous, result.status).items():
        patch.status[key] = value
    for key in result.remove_annotations:
        patch.metadata.annotations[key] = None
    for event in result.events:
        kopf.event(body, type=event.type, reason=event.reason, message=event.message)
    metrics.observe_status(namespace, specs.name_of(body), result.status)
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if (body.get("spec") or {}).get("backup") or annotations.get(c.ANNOTATION_BACKUP):
        await archive_http.observe_archive(
            body, previous, statuses, result.status, now, patch, logger
        )

    # permits.decide: grants are withheld while a replicas change is refused
    permit = result.permit
    for name in permit.grant:
        await _act(body, "grant", name, uid, logger)
    for name in permit.revoke:
        await _act(body, "revoke", name, uid, logger)
    if not (permit.grant or permit.revoke):
        logger.debug("initialization permits: nothing to do: %s", permit.reason())
    if refused or paused:
        return
    await _mend_children(body, sts is not None, indexes, logger)

    asked = observed.step_down_requested(annotations, str(result.status.get("leader") or ""))
    if asked:
        try:
            await replica_calls.replica_call(
                replica_calls.endpoint(body, asked, CONFIG),
                "step-down",
                credentials=pki_secrets.credentials(body),
            )
        except Exception as e:  # the next tick retries
            logger.warning("step-down of %s failed: %s", asked, e)
        else:
            patch.metadata.annotations[c.ANNOTATION_STEP_DOWN] = None
            kopf.info(body, reason="StepDown", message=f"asked {asked} to step down (requested)")
            return

    if action.kind in ("none", "wait"):
        if action.kind == "none" and storage_step.kind not in ("none", "wait"):
            await _storage_act(body, storage_step, sts, namespace, logger)
        return
    if action.queue != queue:
        # The queue must be stored before the delete; kopf patches after the handler, so
        # write it now and act on the next tick.
        patch.status["rollingUpdate"] = action.as_status()
        return
    await _roll(body, action, namespace, logger)


@kopf.on.delete(c.GROUP, c.VERSION, c.PLURAL, optional=True)
async def forget_metrics(*, body: kopf.Body, **_: Any) -> None:
    """A deleted log leaves no series and no kept channel behind (its owned objects go by
    owner references)."""
    body = snapshot(body)
    metrics.forget(specs.namespace_of(body), specs.name_of(body))
    names = [specs.pod_name(body, i) for i in range(specs.replicas_of(body))]
    await replica_calls.forget_status_clients(
        [replica_calls.endpoint(body, n, CONFIG) for n in names]
    )


async def _mend_children(
    body: kopf.Body, built: bool, indexes: Mapping[str, Any], logger: Any
) -> None:
    """Create again the owned objects someone deleted, and delete those the spec no longer
    asks for (children.py); each with an Event."""
    key = (specs.namespace_of(body), specs.name_of(body))
    present = {child for name in _OWNED_INDEXES for child in indexes[name].get(key, [])}
    decision = children.decide(
        _desired(body),
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
            await asyncio.to_thread(kube.delete_child, child, key[0])
        except ApiException as e:
            metrics.ERRORS.labels(handler="children").inc()
            logger.warning("deleting %s %s: HTTP %s %s", child.kind, child.name, e.status, e.reason)
            continue
        metrics.CHILDREN_MENDED.labels(kind=child.kind, action="delete").inc()
        message = f"{child.kind} {child.name} is no longer in the spec: deleted it"
        kopf.info(body, reason="DeletedChild", message=message)
        logger.info(message)


async def _act(body: kopf.Body, what: str, pod: str, uid: str, logger: Any) -> None:
    try:
        await replica_calls.replica_call(
            replica_calls.endpoint(body, pod, CONFIG), what, uid, pki_secrets.credentials(body)
        )
        logger.info("%s initialization permit: %s", what, pod)
    except Exception as e:  # the next tick retries
        metrics.ERRORS.labels(handler=f"permit-{what}").inc()
        logger.warning("%s permit of %s failed: %s", what, pod, e)


async def _roll(body: kopf.Body, action: rolling.Action, namespace: str, logger: Any) -> None:
    metrics.ROLLING_ACTIONS.labels(action=action.kind).inc()
    try:
        if action.kind == "step-down":
            await replica_calls.replica_call(
                replica_calls.endpoint(body, action.pod, CONFIG),
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
        raise _temporary(e, f"{action.kind} {action.pod}") from e
    except Exception as e:
        metrics.ERRORS.labels(handler="rolling").inc()
        raise kopf.TemporaryError(f"{action.kind} {action.pod}: {e}", delay=5) from e
    logger.info("rolling: %s %s (%s)", action.kind, action.pod, action.reason)


# ---- storage expansion and migration (storage.py decides) -------------------------------------


async def _storage_step(
    body: kopf.Body,
    pods: list[observed.PodInfo],
    pvcs: dict[str, observed.PvcInfo],
    sts: observed.StatefulSetRecord | None,
    statuses: Mapping[str, observed.ReplicaStatus | None],
    status: Mapping[str, Any],
    queue: list[Any],
) -> sg.Step:
    wanted = sg.Storage.of_spec(body)
    claims = sg.claims_of(body, pvcs)
    # the class that decides expansion: the spec's, else the one the claims got by default
    cls = wanted.storage_class or next((cl.storage.storage_class for cl in claims), "")
    expandable = await asyncio.to_thread(kube.class_expandable, cls) if cls else False
    return sg.next_step(
        wanted,
        sg.built_of(sts),
        claims,
        states={name: observed.status_name(s) for name, s in statuses.items()},
        leader=str(status.get("leader") or ""),
        expandable=expandable,
        busy=sg.rolling_busy(queue, pods),
    )


def _statefulset(body: kopf.Body) -> dict[str, Any]:
    """The StatefulSet the spec describes, owned by the log."""
    desired = specs.statefulset(body, CONFIG)
    kopf.adopt(desired, owner=body, strict=True)
    return desired


async def _storage_act(
    body: kopf.Body,
    step: sg.Step,
    sts: observed.StatefulSetRecord | None,
    namespace: str,
    logger: Any,
) -> None:
    try:
        if step.kind == "create-statefulset":
            # created (it is gone); a patch only if it came back meanwhile
            await asyncio.to_thread(kube.apply_one, _statefulset(body))
            kopf.info(body, reason="StorageTemplate", message=step.reason)
        elif step.kind == "recreate-statefulset" and sts is not None:
            uid = str(sts.get("uid") or "")
            await asyncio.to_thread(kube.recreate_statefulset, _statefulset(body), uid)
            kopf.info(body, reason="StorageTemplate", message=step.reason)
        elif step.kind == "expand":
            await asyncio.to_thread(kube.expand_claim, step.claim, namespace, step.size)
            kopf.info(body, reason="ExpandingVolume", message=step.reason)
        elif step.kind == "migrate":
            await asyncio.to_thread(kube.ask_new_volume, step.pod, namespace)
            kopf.info(body, reason="MigratingVolume", message=step.reason)
    except ApiException as e:
        metrics.ERRORS.labels(handler="storage").inc()
        raise _temporary(e, f"storage {step.kind} {step.pod or step.claim}") from e
    logger.info("storage: %s (%s)", step.kind, step.reason)
