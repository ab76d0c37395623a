"""The Kubernetes API objects the operator's own calls go through (kopf's go through kopf),
all on one API client whose every request has a deadline.

Why a deadline: the client library's default is none, and a request on a connection that
died silently then blocks its thread for good. The observe timer makes these calls, kopf
waits for a running timer invocation without a timeout before it lets a deleted log go, so
one such request would hold a deletion forever; and the lease renewal would stop renewing
without noticing. One shared client also reuses its connections (a new API object per call
opened a new connection pool, and a TLS handshake, each time).

Below the API objects, the operator's own calls: plain synchronous functions the handlers run
in threads (`asyncio.to_thread`) so kopf's event loop never blocks. Every destructive one is a
delete with a UID precondition (a stale twin of the operator cannot do harm, see
rlog_operator.handlers).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

from rlog_operator import children
from rlog_operator import constants as c

# (connect, read) seconds for every request: reads of single objects, patches, deletes and
# creates answer in well under a second on a healthy API server.
REQUEST_TIMEOUT: tuple[float, float] = (5.0, 30.0)


class TimedApiClient(k8s.ApiClient):
    """An API client whose requests without a timeout of their own get `REQUEST_TIMEOUT`."""

    def call_api(
        self,
        method: str,
        url: str,
        header_params: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> Any:
        return super().call_api(
            method,
            url,
            header_params,
            body,
            post_params,
            _request_timeout=_request_timeout or REQUEST_TIMEOUT,
        )


_shared: TimedApiClient | None = None
_lock = threading.Lock()


def api_client() -> TimedApiClient:
    """The shared client, made on first use: after the kube config is loaded."""
    global _shared
    with _lock:
        if _shared is None:
            _shared = TimedApiClient()
        return _shared


def core() -> k8s.CoreV1Api:
    return k8s.CoreV1Api(api_client())


def apps() -> k8s.AppsV1Api:
    return k8s.AppsV1Api(api_client())


def policy() -> k8s.PolicyV1Api:
    return k8s.PolicyV1Api(api_client())


def networking() -> k8s.NetworkingV1Api:
    return k8s.NetworkingV1Api(api_client())


def storage() -> k8s.StorageV1Api:
    return k8s.StorageV1Api(api_client())


def custom_objects() -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api_client())


def coordination() -> k8s.CoordinationV1Api:
    return k8s.CoordinationV1Api(api_client())


def temporary(e: ApiException, what: str) -> kopf.TemporaryError:
    """A failed call as the handler's error: kopf retries it after a while."""
    return kopf.TemporaryError(f"{what}: HTTP {e.status} {e.reason}", delay=10)


def load_kube_config() -> None:
    try:
        k8s_config.load_incluster_config()
    except k8s_config.ConfigException:
        k8s_config.load_kube_config()


# ---- applying and reading objects -----------------------------------------------------------


def api_for(kind: str) -> tuple[Any, str]:
    """(the API object, the method suffix) of a kind `desired_objects` builds."""
    if kind == "StatefulSet":
        return apps(), "namespaced_stateful_set"
    if kind == "Deployment":  # the archiver of spec.backup
        return apps(), "namespaced_deployment"
    if kind == "Service":
        return core(), "namespaced_service"
    if kind == "PodDisruptionBudget":
        return policy(), "namespaced_pod_disruption_budget"
    if kind == "NetworkPolicy":
        return networking(), "namespaced_network_policy"
    raise kopf.PermanentError(f"the operator cannot apply a {kind}")


def apply_one(obj: Mapping[str, Any]) -> str:
    """Create `obj`, or patch it if it exists; returns "created" or "patched"."""
    api, suffix = api_for(obj["kind"])
    name, namespace = obj["metadata"]["name"], obj["metadata"]["namespace"]
    try:
        getattr(api, f"create_{suffix}")(namespace, obj)
        return "created"
    except ApiException as e:
        if e.status != 409:
            raise
    getattr(api, f"patch_{suffix}")(name, namespace, obj)
    return "patched"


def read_or_none(read: Callable[[], Any]) -> dict[str, Any] | None:
    """What `read()` returns, as plain data; None if it does not exist (404)."""
    try:
        found = read()
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    result: dict[str, Any] = api_client().sanitize_for_serialization(found)
    return result


def read_statefulset(name: str, namespace: str) -> dict[str, Any] | None:
    return read_or_none(lambda: apps().read_namespaced_stateful_set(name, namespace))


def read_secret(name: str, namespace: str) -> dict[str, Any] | None:
    return read_or_none(lambda: core().read_namespaced_secret(name, namespace))


# ---- deleting (each with a UID precondition) --------------------------------------------------


def delete_child(child: children.Child, namespace: str) -> None:
    api, suffix = api_for(child.kind)
    options = k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=child.uid))
    try:
        getattr(api, f"delete_{suffix}")(child.name, namespace, body=options)
    except ApiException as e:
        if e.status not in (404, 409):  # gone already / another object by that name now
            raise


def delete_pod(name: str, namespace: str, uid: str) -> None:
    try:
        core().delete_namespaced_pod(
            name, namespace, body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
        )
    except ApiException as e:
        if e.status not in (404, 409):  # gone already / another pod by that name now
            raise


def delete_pvc(name: str, namespace: str, uid: str) -> None:
    try:
        core().delete_namespaced_persistent_volume_claim(
            name, namespace, body=k8s.V1DeleteOptions(preconditions=k8s.V1Preconditions(uid=uid))
        )
    except ApiException as e:
        if e.status not in (404, 409):
            raise


# ---- storage expansion and migration (storage.py decides) -------------------------------------

# StorageClass name -> allowVolumeExpansion, looked up once per operator run
_EXPANDABLE: dict[str, bool] = {}


def class_expandable(name: str) -> bool | None:
    if name in _EXPANDABLE:
        return _EXPANDABLE[name]
    try:
        found = storage().read_storage_class(name)
    except ApiException as e:
        if e.status == 404:
            return False  # no such class: it cannot expand anything
        return None
    _EXPANDABLE[name] = bool(found.allow_volume_expansion)
    return _EXPANDABLE[name]


def recreate_statefulset(desired: Mapping[str, Any], uid: str) -> None:
    """Delete the StatefulSet leaving its pods and claims (Orphan), wait until it is gone,
    and create it from the spec (`desired`): it adopts the same pods without restarting
    them."""
    name, namespace = desired["metadata"]["name"], desired["metadata"]["namespace"]
    try:
        apps().delete_namespaced_stateful_set(
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
        if read_statefulset(name, namespace) is None:
            break
        time.sleep(0.25)
    else:
        return  # still going: the next tick creates it (storage: create-statefulset)
    apply_one(desired)  # created (it is gone); a patch only if it came back meanwhile


def expand_claim(name: str, namespace: str, size: str) -> None:
    core().patch_namespaced_persistent_volume_claim(
        name, namespace, {"spec": {"resources": {"requests": {"storage": size}}}}
    )


def ask_new_volume(pod: str, namespace: str) -> None:
    core().patch_namespaced_pod(
        pod, namespace, {"metadata": {"annotations": {c.ANNOTATION_REPLACE_VOLUME: "storage"}}}
    )
