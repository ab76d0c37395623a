"""kopf registrations of the rlog operator: each handler gathers and delegates.

* startup (`configure`): kopf's settings, the kube config, the metrics endpoint.
* create/update/resume (`reconcile`): apply.py applies the desired objects, refusing a change
  of `spec.replicas` or of the TLS mode that slipped past the CRD's CEL rules.
* kopf indexes of the replicas' pods, claims and StatefulSets (watched with a server-side
  label selector), of existing PersistentVolume names, of the nodes (node_loss.py: a replica
  on a lost node), and of the operator's labelled Services, budgets, policies and
  Deployments (children.py): no list calls in the loop.
* a 1 s timer per ReplicatedLog (`observe`): read the log's pods and claims from the
  indexes, ask every replica its Status (replica_calls.py: through the headless Service's
  DNS names, short timeouts, concurrently, over one kept channel per replica), decide with
  the pure modules (`rolling.next_step`, `status.compute_status`: the facts of the
  observation, the status, its Events and the `permits.decide` decision; `storage.next_step`)
  and `plan.decide` what the tick does; actions.py reports the status and carries the plan
  out (permits, mending the owned objects, then the one action).
* delete: forget the log's metrics and kept channels.

Operator settings (startup): one acting operator. The chart runs two pods; only the holder of
a Lease runs kopf (rlog_operator.election, lease.py; main.py stands by before kopf starts)
and kopf runs `--standalone` (no peering objects). Should two ever act at once (a holder cut
off from the API server for longer than its renew deadline is already exiting), every
destructive action is a delete with a UID precondition decided from current observations and
`rolling.next_step` never takes a log below quorum, so a stale twin cannot do harm.

The Kubernetes client is the synchronous `kubernetes` package (kube.py), run in threads
(`asyncio.to_thread`) so kopf's event loop never blocks.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
from collections.abc import Mapping
from typing import Any, cast

import kopf
from kubernetes.client.exceptions import ApiException

from rlog_operator import (
    actions,
    apply,
    archive_http,
    children,
    kube,
    metrics,
    node_loss,
    observed,
    pki,
    pki_secrets,
    plan,
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

CONFIG = specs.OperatorConfig.from_env(os.environ)


# ---- startup --------------------------------------------------------------------------------


@kopf.on.startup()
def configure(*, settings: kopf.OperatorSettings, logger: kopf.Logger, **_: Any) -> None:
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
    # A deleted log keeps its finalizer until its observe tick has ended; kopf looks again
    # every cancellation_polling seconds (its default: 60), so a deletion that met a tick
    # mid-way took a minute more (three e2e teardowns of 60 s in one run). A tick ends within
    # its RPCs' timeouts; looking every second costs one patch a second while it does.
    settings.background.cancellation_polling = 1.0
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


@kopf.on.create(c.GROUP, c.VERSION, c.PLURAL)
@kopf.on.update(c.GROUP, c.VERSION, c.PLURAL)
@kopf.on.resume(c.GROUP, c.VERSION, c.PLURAL)
async def reconcile(
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    body = snapshot(body)  # see snapshot(): a handler's body is live while timers run
    metrics.RECONCILES.labels(handler="apply").inc()
    await apply.apply_objects(body, patch, CONFIG, logger)


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


def _owned_children(indexes: Mapping[str, Any], key: observed.LogKey) -> set[children.Child]:
    """The log's owned objects that exist now, from the indexes of their kinds."""
    return {child for name in _OWNED_INDEXES for child in indexes[name].get(key, [])}


@kopf.index("persistentvolumes")
def persistent_volumes(
    name: str | None, body: kopf.Body, **_: Any
) -> dict[str, observed.VolumeInfo]:
    """The existing volumes (a Bound claim whose volume is missing has lost it), each with
    the node it is pinned to (a pod that cannot reach a Ready node keeps its volume)."""
    return {name: observed.volume_info(body)} if name else {}


@kopf.index("nodes")
def cluster_nodes(name: str | None, body: kopf.Body, **_: Any) -> dict[str, observed.NodeInfo]:
    """The nodes' readiness and taints: a replica whose node is not Ready or gone is on a lost
    node (node_loss.py). Read only: the operator never deletes or taints a node."""
    return {name: observed.node_info(body)} if name else {}


# ---- one version of the log per handler ------------------------------------------------------


def snapshot(body: kopf.Body) -> kopf.Body:
    """A copy of `body` that later watch events do not change.

    While a timer runs for an object, kopf hands every handler of that object the live body,
    replaced in place by each watch event. A handler must decide from one version of the
    object: a spec change landing during an await once made one observe tick list five
    replicas (the new spec) next to the refusal of that change (the old one)."""
    return kopf.Body(cast(kopf.RawBody, copy.deepcopy(dict(body))))


# ---- the observe timer ------------------------------------------------------------------------


@kopf.timer(c.GROUP, c.VERSION, c.PLURAL, interval=TIMER_INTERVAL, initial_delay=2.0)
async def observe(
    *,
    body: kopf.Body,
    patch: kopf.Patch,
    logger: kopf.Logger,
    **indexes: Any,  # kopf passes every index by its name
) -> None:
    """One tick: gather (the indexes, the PKI, every replica's Status), decide (rolling,
    status, storage, then `plan.decide`), report the status (actions.report), observe the
    archive, and carry the plan out (actions.carry_out)."""
    body = snapshot(body)
    metrics.RECONCILES.labels(handler="observe").inc()
    key = (specs.namespace_of(body), specs.name_of(body))
    pods, pvcs, sts = _observe(
        body,
        indexes["replica_pods"],
        indexes["replica_claims"],
        indexes["replica_statefulsets"],
        indexes["persistent_volumes"],
        indexes["cluster_nodes"],
    )
    update_revision = sts["updateRevision"] if sts else ""
    # While a refused change stands in the spec: observe the log as built, take no action.
    view, refused = observed.built_view(body, sts["replicas"] if sts else 0)
    built = body if view is body else kopf.Body(cast(kopf.RawBody, view))

    try:  # renewals; and the operator's own credentials after a restart
        await pki_secrets.ensure_pki(built, CONFIG, logger)
    except ApiException as e:
        metrics.ERRORS.labels(handler="pki").inc()
        logger.warning("the log's certificates: HTTP %s %s", e.status, e.reason)
    except pki_secrets.SecretRaced as raced:
        logger.info("Secret %s was created meanwhile: planned again next tick", raced)
    names = [specs.pod_name(view, i) for i in range(specs.replicas_of(view))]
    statuses = await replica_calls.ask_statuses(view, names, pki_secrets.credentials(view), CONFIG)

    previous = dict(body.get("status") or {})
    tls = pki.tls_status(view)
    if previous.get("tls") != tls:
        patch.status["tls"] = tls
    queue = list((previous.get("rollingUpdate") or {}).get("queue") or [])
    now = st.now()
    paused = specs.paused(body)
    if paused:  # observe only: the stored rolling queue stays as it is
        message = str((previous.get("rollingUpdate") or {}).get("message") or "")
        rolling_step = rolling.Action("none", queue=queue, reason=message)
    else:
        rolling_step = rolling.next_step(
            view, pods, statuses, update_revision, queue, pvcs, now=now
        )
    result = st.compute_status(
        view,
        pods,
        statuses,
        update_revision,
        previous,
        now,
        rolling_update=rolling_step.as_status(),
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

    actions.report(body, patch, previous, result)
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    if (body.get("spec") or {}).get("backup") or annotations.get(c.ANNOTATION_BACKUP):
        await archive_http.observe_archive(
            body, previous, statuses, result.status, now, patch, logger
        )

    chosen = plan.decide(
        result.facts,
        paused=paused,
        permit=result.permit,
        rolling_step=rolling_step,
        stored_queue=queue,
        storage_step=storage_step,
    )
    await actions.carry_out(
        chosen,
        built,
        patch,
        CONFIG,
        sts=sts,
        owned=lambda: _owned_children(indexes, key),
        logger=logger,
    )


def _observe(
    body: Mapping[str, Any],
    pods_index: kopf.Index[observed.LogKey, observed.PodInfo],
    claims_index: kopf.Index[observed.LogKey, observed.PvcInfo],
    statefulsets_index: kopf.Index[observed.LogKey, observed.StatefulSetRecord],
    volumes_index: kopf.Index[str, observed.VolumeInfo],
    nodes_index: kopf.Index[str, observed.NodeInfo],
) -> tuple[list[observed.PodInfo], dict[str, observed.PvcInfo], observed.StatefulSetRecord | None]:
    """The log's pods (each on a lost node marked), its claims (by name, each whose volume's
    node is Ready marked) and its StatefulSet (None before it exists)."""
    key = (specs.namespace_of(body), specs.name_of(body))
    pods = list(pods_index.get(key, []))
    nodes = node_loss.known_nodes(nodes_index)
    pods = node_loss.mark(pods, nodes)
    # An empty volume index means "not known" (a cluster with Bound claims has volumes):
    # never conclude that every volume is gone from an index that saw none.
    claims = observed.claims_by_name(
        claims_index.get(key, []), volumes_index if len(volumes_index) else None
    )
    claims = node_loss.mark_volume_nodes(claims, nodes)
    sts = next(iter(statefulsets_index.get(key, [])), None)
    return pods, claims, sts


async def _storage_step(
    body: kopf.Body,
    pods: list[observed.PodInfo],
    pvcs: dict[str, observed.PvcInfo],
    sts: observed.StatefulSetRecord | None,
    statuses: Mapping[str, observed.ReplicaStatus | None],
    status: Mapping[str, Any],
    queue: list[Any],
) -> sg.Step:
    """The storage step (storage.next_step), with whether the deciding class can expand."""
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


# ---- delete -----------------------------------------------------------------------------------


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
