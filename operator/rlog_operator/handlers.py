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
import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from rlog_operator import (
    archive_specs,
    backups,
    children,
    kube,
    metrics,
    netpol,
    observed,
    pki,
    rolling,
    specs,
)
from rlog_operator import constants as c
from rlog_operator import status as st
from rlog_operator import storage as sg

STATUS_TIMEOUT = 2.0  # seconds per replica Status call
ACTION_TIMEOUT = 5.0  # seconds for a permit or step-down call
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
    load_kube_config()
    port = int(os.environ.get("RLOG_OPERATOR_METRICS_PORT", "8080"))
    if port:
        metrics.serve(port)
        logger.info("operator metrics on :%d/metrics", port)


def load_kube_config() -> None:
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()


# ---- applying the desired objects -----------------------------------------------------------


def _api_for(kind: str) -> tuple[Any, str]:
    """(the API object, the method suffix) of a kind `desired_objects` builds."""
    if kind == "StatefulSet":
        return kube.apps(), "namespaced_stateful_set"
    if kind == "Deployment":  # the archiver of spec.backup
        return kube.apps(), "namespaced_deployment"
    if kind == "Service":
        return kube.core(), "namespaced_service"
    if kind == "PodDisruptionBudget":
        return kube.policy(), "namespaced_pod_disruption_budget"
    if kind == "NetworkPolicy":
        return kube.networking(), "namespaced_network_policy"
    raise kopf.PermanentError(f"the operator cannot apply a {kind}")


def _desired(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every object the log owns, in the order to create it (the policy first)."""
    return [*netpol.for_log(body, CONFIG), *specs.desired_objects(body, CONFIG)]


def _apply_one(obj: Mapping[str, Any]) -> str:
    """Create `obj`, or patch it if it exists; returns "created" or "patched"."""
    api, suffix = _api_for(obj["kind"])
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    try:
        getattr(api, f"create_{suffix}")(namespace, obj)
        return "created"
    except ApiException as e:
        if e.status != 409:
            raise
    getattr(api, f"patch_{suffix}")(name, namespace, obj)
    return "patched"


def _read_or_none(read: Callable[[], Any]) -> dict[str, Any] | None:
    """What `read()` returns, as plain data; None if it does not exist (404)."""
    try:
        found = read()
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    result: dict[str, Any] = kube.api_client().sanitize_for_serialization(found)
    return result


def _read_statefulset(name: str, namespace: str) -> dict[str, Any] | None:
    return _read_or_none(lambda: kube.apps().read_namespaced_stateful_set(name, namespace))


def _read_secret(name: str, namespace: str) -> dict[str, Any] | None:
    return _read_or_none(lambda: kube.core().read_namespaced_secret(name, namespace))


class SecretRaced(Exception):
    """A Secret planned as new was created meanwhile (another handler or operator pod):
    what was planned with it (certificates of a CA) is not written; plan again."""


def _write_secret(obj: Mapping[str, Any], new: bool) -> None:
    """Create the Secret (`new`: it was absent when planned), or replace its data."""
    api = kube.core()
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    if not new:
        api.patch_namespaced_secret(name, namespace, {"data": obj["data"]})
        return
    try:
        api.create_namespaced_secret(namespace, dict(obj))  # type: ignore[arg-type]
    except ApiException as e:
        if e.status == 409:
            raise SecretRaced(name) from None
        raise


# The operator's client credentials per log (namespace, name), from its `-tls-operator`
# Secret; None: the log is plaintext.
_CREDENTIALS: dict[tuple[str, str], Any] = {}
_PKI_LOCKS: dict[tuple[str, str], asyncio.Lock] = {}


def _secrets_of(body: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, bytes]]:
    """The log's PKI Secrets by name (None: absent) and its tokens (`name/key` -> token)."""
    namespace = specs.namespace_of(body)
    names = [
        pki.ca_secret_name(body),
        specs.server_secret_name(body),
        pki.operator_secret_name(body),
        specs.auth_secret_name(body),
    ]
    if (body.get("spec") or {}).get("backup"):
        names.append(specs.archiver_secret_name(body))
    existing = {name: _read_secret(name, namespace) for name in names}
    tokens: dict[str, bytes] = {}
    for rule in ((body.get("spec") or {}).get("auth") or {}).get("tokens") or []:
        ref = rule["secretRef"]
        key = ref.get("key", "token")
        value = pki.secret_bytes(_read_secret(ref["name"], namespace), key)
        if value is not None:
            tokens[f"{ref['name']}/{key}"] = value
    return existing, tokens


def _apply_certificate(obj: Mapping[str, Any]) -> None:
    """Create or patch a cert-manager Certificate (mode certManager)."""
    api = kube.custom_objects()
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    try:
        api.create_namespaced_custom_object(
            "cert-manager.io", "v1", namespace, "certificates", dict(obj)
        )
    except ApiException as e:
        if e.status != 409:
            raise
        api.patch_namespaced_custom_object(
            "cert-manager.io", "v1", namespace, "certificates", name, dict(obj)
        )


async def _ensure_pki(body: kopf.Body, logger: Logger) -> None:
    """Create or renew the log's certificates and roles (pki.plan_secrets), and keep the
    operator's client credentials for it. Raises SecretRaced if a Secret planned as new
    appeared meanwhile (nothing planned after it is written)."""
    from rlog.client import Credentials

    key = (specs.namespace_of(body), specs.name_of(body))
    mode = specs.mode_of(body)
    if mode == specs.MODE_DISABLED:
        _CREDENTIALS[key] = None
        return
    if mode == specs.MODE_CERT_MANAGER:
        for request in pki.certificate_requests(body, CONFIG):
            kopf.adopt(request, owner=body, strict=True)
            await asyncio.to_thread(_apply_certificate, request)
    # One plan at a time per log: two at once (the create handler and the observe timer
    # on a new log) would each make a CA, and one log's Secrets would mix them.
    async with _PKI_LOCKS.setdefault(key, asyncio.Lock()):
        existing, tokens = await asyncio.to_thread(_secrets_of, body)
        now = dt.datetime.now(dt.UTC)
        for secret in pki.plan_secrets(body, CONFIG, existing, now, tokens):
            name = secret["metadata"]["name"]
            kopf.adopt(secret, owner=body, strict=True)
            await asyncio.to_thread(_write_secret, secret, existing.get(name) is None)
            existing[name] = secret
            logger.info("wrote Secret %s", name)
    mine = existing.get(pki.operator_secret_name(body))
    cert = pki.secret_bytes(mine, specs.CERT_KEY)
    if cert is None:  # certManager: cert-manager has not written the operator's Secret yet
        _CREDENTIALS[key] = None
        return
    _CREDENTIALS[key] = Credentials(
        pki.secret_bytes(mine, specs.CA_KEY), cert, pki.secret_bytes(mine, specs.KEY_KEY)
    )


def _credentials(body: Mapping[str, Any]) -> Any:
    return _CREDENTIALS.get((specs.namespace_of(body), specs.name_of(body)))


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
        existing = await asyncio.to_thread(_read_statefulset, sts_name, namespace)
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
        await _ensure_pki(body, logger)
    except ApiException as e:
        metrics.ERRORS.labels(handler="apply").inc()
        raise _temporary(e, "writing the log's certificates") from e
    except SecretRaced as raced:
        # Another operator pod wrote it (an HA hand-over): the next pass plans with it.
        raise kopf.TemporaryError(f"Secret {raced} was created meanwhile", delay=2) from None
    for obj in objects:
        kopf.adopt(obj, owner=body, strict=True)
        try:
            what = await asyncio.to_thread(_apply_one, obj)
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


def _endpoint(body: Mapping[str, Any], pod: str) -> str:
    ordinal = specs.ordinal_of(pod)
    return f"{specs.peer_host(body, ordinal or 0, CONFIG)}:{CONFIG.grpc_port}"


# One client (one gRPC channel) per replica endpoint and credentials, kept between ticks:
# asking Status every second must not cost a DNS lookup, a new connection and a TLS
# handshake every second. A client that failed is dropped and made again on the next tick
# (the pod may have a new address); renewed credentials make a new one (the old is closed).
_STATUS_CLIENTS: dict[str, tuple[Any, Any]] = {}  # endpoint -> (credentials, client)


async def _status_client(endpoint: str, credentials: Any) -> Any:
    from rlog.client import AsyncClient

    kept = _STATUS_CLIENTS.get(endpoint)
    if kept is not None and kept[0] == credentials:
        return kept[1]
    if kept is not None:
        await kept[1].close()
    # A probe reports what it sees now (the next tick asks again): no waiting for a
    # replica that cannot be connected to.
    client = AsyncClient(endpoint, timeout=STATUS_TIMEOUT, credentials=credentials, connect_wait=0)
    _STATUS_CLIENTS[endpoint] = (credentials, client)
    return client


async def _replica_status(endpoint: str, credentials: Any = None) -> observed.ReplicaStatus | None:
    from rlog.client import status_to_dict

    client = await _status_client(endpoint, credentials)
    try:
        response = await asyncio.wait_for(client.status(endpoint), STATUS_TIMEOUT + 1)
        return status_to_dict(response)
    except Exception:  # unreachable, refusing, timing out: all mean "no answer"
        _STATUS_CLIENTS.pop(endpoint, None)
        await client.close()
        return None


async def _forget_status_clients(endpoints: list[str]) -> None:
    """Close the kept clients of a deleted log."""
    for endpoint in endpoints:
        kept = _STATUS_CLIENTS.pop(endpoint, None)
        if kept is not None:
            await kept[1].close()


async def _replica_call(
    endpoint: str, what: str, log_id: str = "", credentials: Any = None
) -> None:
    from rlog.client import AsyncClient

    client = AsyncClient(endpoint, timeout=ACTION_TIMEOUT, credentials=credentials)
    try:
        if what == "grant":
            await client.grant_permit(log_id, endpoint=endpoint)
        elif what == "revoke":
            await client.revoke_permit(log_id, endpoint=endpoint)
        else:
            await client.step_down(endpoint=endpoint)
    finally:
        await client.close()


# ---- acting ---------------------------------------------------------------------------------


def _delete_pod(name: str, namespace: str, uid: str) -> None:
    try:
        kube.core().delete_namespaced_pod(
            name, namespace, body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
        )
    except ApiException as e:
        if e.status not in (404, 409):  # gone already / another pod by that name now
            raise


def _delete_pvc(name: str, namespace: str, uid: str) -> None:
    try:
        kube.core().delete_namespaced_persistent_volume_claim(
            name, namespace, body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
        )
    except ApiException as e:
        if e.status not in (404, 409):
            raise


def _fetch_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=2.0) as answer:
        return str(answer.read().decode())


def _post(url: str) -> None:
    import urllib.request

    with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=2.0):
        pass


async def _observe_archive(
    body: kopf.Body,
    previous: Mapping[str, Any],
    statuses: Mapping[str, observed.ReplicaStatus | None],
    status: Mapping[str, Any],
    now: str,
    patch: kopf.Patch,
    logger: Any,
) -> None:
    """status.archive from the archiver's metrics, and the next step of a backup request
    (rlog.io/backup, backups.py): a flush asked of the archiver, its completion reported."""
    before = dict(previous.get("archive") or {})
    archive = await _archive_status(body) if (body.get("spec") or {}).get("backup") else {}
    leader = str(status.get("leader") or "")
    answer = statuses.get(leader) if leader else None
    learned = int(answer["learned"]) if answer and "learned" in answer else None
    position = archive.get("archivedPosition")
    step = backups.backup_step(body, learned, position, before.get("backup"), now)
    backup = step.backup if step.backup is not None else before.get("backup")
    if backup:
        archive["backup"] = dict(backup)
    if step.kind == "flush":
        name, namespace = archive_specs.archiver_name(body), specs.namespace_of(body)
        url = (
            f"http://{name}.{namespace}.svc:{archive_specs.ARCHIVER_METRICS_PORT}"
            f"/flush?through={step.through}"
        )
        try:  # repeated each tick until the archive covers the position
            await asyncio.to_thread(_post, url)
        except OSError as exc:
            logger.warning("backup: asking the archiver to flush (%s): %s", url, exc)
    if step.event:
        kind, reason, message = step.event
        kopf.event(body, type=kind, reason=reason, message=message)
    if before != archive:
        patch.status["archive"] = archive


async def _archive_status(body: Mapping[str, Any]) -> dict[str, Any]:
    """`status.archive` from the archiver's metrics (spec.backup), read through its Service."""
    name, namespace = archive_specs.archiver_name(body), specs.namespace_of(body)
    url = f"http://{name}.{namespace}.svc:{archive_specs.ARCHIVER_METRICS_PORT}/metrics"
    try:
        text = await asyncio.to_thread(_fetch_text, url)
    except OSError as exc:
        return archive_specs.archive_status(None, f"cannot read {url}: {exc}")
    return archive_specs.archive_status(archive_specs.parse_archive_metrics(text))


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
        await _ensure_pki(body, logger)
    except ApiException as e:
        metrics.ERRORS.labels(handler="pki").inc()
        logger.warning("the log's certificates: HTTP %s %s", e.status, e.reason)
    except SecretRaced as raced:
        logger.info("Secret %s was created meanwhile: planned again next tick", raced)
    credentials = _credentials(body)
    names = [specs.pod_name(view, i) for i in range(specs.replicas_of(view))]
    answers = await asyncio.gather(
        *(_replica_status(_endpoint(body, n), credentials) for n in names)
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
        await _observe_archive(body, previous, statuses, result.status, now, patch, logger)

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
            await _replica_call(_endpoint(body, asked), "step-down", credentials=_credentials(body))
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
    await _forget_status_clients([_endpoint(body, n) for n in names])


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
            what = await asyncio.to_thread(_apply_one, obj)
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
            await asyncio.to_thread(_delete_child, child, key[0])
        except ApiException as e:
            metrics.ERRORS.labels(handler="children").inc()
            logger.warning("deleting %s %s: HTTP %s %s", child.kind, child.name, e.status, e.reason)
            continue
        metrics.CHILDREN_MENDED.labels(kind=child.kind, action="delete").inc()
        message = f"{child.kind} {child.name} is no longer in the spec: deleted it"
        kopf.info(body, reason="DeletedChild", message=message)
        logger.info(message)


def _delete_child(child: children.Child, namespace: str) -> None:
    api, suffix = _api_for(child.kind)
    options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=child.uid))
    try:
        getattr(api, f"delete_{suffix}")(child.name, namespace, body=options)
    except ApiException as e:
        if e.status not in (404, 409):  # gone already / another object by that name now
            raise


async def _act(body: kopf.Body, what: str, pod: str, uid: str, logger: Any) -> None:
    try:
        await _replica_call(_endpoint(body, pod), what, uid, _credentials(body))
        logger.info("%s initialization permit: %s", what, pod)
    except Exception as e:  # the next tick retries
        metrics.ERRORS.labels(handler=f"permit-{what}").inc()
        logger.warning("%s permit of %s failed: %s", what, pod, e)


async def _roll(body: kopf.Body, action: rolling.Action, namespace: str, logger: Any) -> None:
    metrics.ROLLING_ACTIONS.labels(action=action.kind).inc()
    try:
        if action.kind == "step-down":
            await _replica_call(
                _endpoint(body, action.pod), "step-down", credentials=_credentials(body)
            )
            kopf.info(body, reason="StepDown", message=f"asked {action.pod} to step down")
        elif action.kind == "delete-pod":
            await asyncio.to_thread(_delete_pod, action.pod, namespace, action.uid)
            kopf.info(body, reason="ReplacingPod", message=f"deleted {action.pod}: {action.reason}")
        elif action.kind == "delete-pvc-and-pod":
            await asyncio.to_thread(_delete_pvc, action.pvc, namespace, action.pvc_uid)
            await asyncio.to_thread(_delete_pod, action.pod, namespace, action.uid)
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

# StorageClass name -> allowVolumeExpansion, looked up once per operator run
_EXPANDABLE: dict[str, bool] = {}


def _class_expandable(name: str) -> bool | None:
    if name in _EXPANDABLE:
        return _EXPANDABLE[name]
    try:
        found = kube.storage().read_storage_class(name)
    except ApiException as e:
        if e.status == 404:
            return False  # no such class: it cannot expand anything
        return None
    _EXPANDABLE[name] = bool(found.allow_volume_expansion)
    return _EXPANDABLE[name]


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
    expandable = await asyncio.to_thread(_class_expandable, cls) if cls else False
    return sg.next_step(
        wanted,
        sg.built_of(sts),
        claims,
        states={name: observed.status_name(s) for name, s in statuses.items()},
        leader=str(status.get("leader") or ""),
        expandable=expandable,
        busy=sg.rolling_busy(queue, pods),
    )


def _create_statefulset(body: kopf.Body) -> None:
    desired = specs.statefulset(body, CONFIG)
    kopf.adopt(desired, owner=body, strict=True)
    _apply_one(desired)  # created (it is gone); a patch only if it came back meanwhile


def _recreate_statefulset(body: kopf.Body, uid: str) -> None:
    """Delete the StatefulSet leaving its pods and claims (Orphan), wait until it is gone,
    and create it from the spec: it adopts the same pods without restarting them."""
    name, namespace = specs.statefulset_name(body), specs.namespace_of(body)
    api = kube.apps()
    try:
        api.delete_namespaced_stateful_set(
            name,
            namespace,
            body=k8s.V1DeleteOptions(
                propagation_policy="Orphan", preconditions=k8s.V1Preconditions(uid=uid)
            ),
        )
    except ApiException as e:
        if e.status not in (404, 409):
            raise
    for _ in range(40):
        if _read_statefulset(name, namespace) is None:
            break
        time.sleep(0.25)
    else:
        return  # still going: the next tick creates it (storage: create-statefulset)
    _create_statefulset(body)


def _expand_claim(name: str, namespace: str, size: str) -> None:
    kube.core().patch_namespaced_persistent_volume_claim(
        name, namespace, {"spec": {"resources": {"requests": {"storage": size}}}}
    )


def _ask_new_volume(pod: str, namespace: str) -> None:
    kube.core().patch_namespaced_pod(
        pod, namespace, {"metadata": {"annotations": {c.ANNOTATION_REPLACE_VOLUME: "storage"}}}
    )


async def _storage_act(
    body: kopf.Body,
    step: sg.Step,
    sts: observed.StatefulSetRecord | None,
    namespace: str,
    logger: Any,
) -> None:
    try:
        if step.kind == "create-statefulset":
            await asyncio.to_thread(_create_statefulset, body)
            kopf.info(body, reason="StorageTemplate", message=step.reason)
        elif step.kind == "recreate-statefulset" and sts is not None:
            await asyncio.to_thread(_recreate_statefulset, body, str(sts.get("uid") or ""))
            kopf.info(body, reason="StorageTemplate", message=step.reason)
        elif step.kind == "expand":
            await asyncio.to_thread(_expand_claim, step.claim, namespace, step.size)
            kopf.info(body, reason="ExpandingVolume", message=step.reason)
        elif step.kind == "migrate":
            await asyncio.to_thread(_ask_new_volume, step.pod, namespace)
            kopf.info(body, reason="MigratingVolume", message=step.reason)
    except ApiException as e:
        metrics.ERRORS.labels(handler="storage").inc()
        raise _temporary(e, f"storage {step.kind} {step.pod or step.claim}") from e
    logger.info("storage: %s (%s)", step.kind, step.reason)
