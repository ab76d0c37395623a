"""The few calls `kubectl rlog` makes, through the kubernetes client, and the retry of a
write that lost a race (`apply_fresh`). Every failure becomes a one-line `PluginError`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from rlog_operator import constants as c
from rlog_operator.plugin.patches import ConflictError, PluginError, Request

OPERATOR_APP = "rlog-operator"  # the chart's app.kubernetes.io/name on the operator's pods

# A request built from what was read (a list replaced whole) carries the resourceVersion
# read, and any write in between fails it: the operator writes a log's status and
# annotations several times a second while it settles. As client-go's RetryOnConflict does:
# read again, build again, write again, with a growing jittered pause, for this long.
# Rejected: a merge patch without the precondition (it would drop an entry another writer
# added to the list in between).
CONFLICT_SECONDS = 30.0


class Cluster:
    """The few calls the plugin makes, through the kubernetes client."""

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        import logging

        try:
            from kubernetes import client, config
        except ImportError:
            raise PluginError(
                "the kubernetes client is not installed: pip install 'rlog-paxos[kubectl]'"
            ) from None

        # urllib3 would print its retries on stderr: the plugin says one line instead
        logging.getLogger("urllib3").setLevel(logging.CRITICAL)
        try:
            config.load_kube_config(config_file=kubeconfig, context=context)
            _, active = config.list_kube_config_contexts(config_file=kubeconfig)
        except Exception as e:  # no file, no such context, a broken kubeconfig
            raise PluginError(f"no cluster: cannot load the kubeconfig: {e}") from None
        chosen = context or (active or {}).get("name")
        contexts = {ctx["name"]: ctx for ctx in config.list_kube_config_contexts(kubeconfig)[0]}
        self.default_namespace = str(
            ((contexts.get(chosen or "") or {}).get("context") or {}).get("namespace") or "default"
        )
        self.custom = client.CustomObjectsApi()
        self.core = client.CoreV1Api()
        self.api_client = client.ApiClient()

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn(*args, **kwargs)
        except ApiException as e:
            if e.status == 404:
                raise PluginError(f"{what}: not found") from None
            if e.status == 409 and _status_reason(e) == "Conflict":
                raise ConflictError(f"{what}: changed since it was read") from None
            if e.status == 409:
                raise PluginError(f"{what}: already exists") from None
            if e.status == 403:
                raise PluginError(f"{what}: forbidden ({e.reason})") from None
            raise PluginError(f"{what}: HTTP {e.status} {e.reason}") from None
        except Exception as e:  # connection refused, DNS, TLS: the cluster is not there
            raise PluginError(f"no cluster: {what}: {type(e).__name__}: {e}") from None

    def log_names(self, namespace: str, timeout: float) -> list[str]:
        """The ReplicatedLogs of `namespace`, by name (for shell completion)."""
        return [str(log["metadata"]["name"]) for log in self.logs(namespace, timeout)]

    def logs(self, namespace: str | None, timeout: float | None = None) -> list[dict[str, Any]]:
        """The ReplicatedLogs of `namespace` (None: of every namespace), by namespace, name;
        `timeout`: the request's, in seconds (None: the client's default)."""
        limit = {} if timeout is None else {"_request_timeout": timeout}
        if namespace is None:
            found = self._call(
                "ReplicatedLogs (all namespaces)",
                self.custom.list_cluster_custom_object,
                c.GROUP,
                c.VERSION,
                c.PLURAL,
                **limit,
            )
        else:
            found = self._call(
                f"ReplicatedLogs in {namespace}",
                self.custom.list_namespaced_custom_object,
                c.GROUP,
                c.VERSION,
                namespace,
                c.PLURAL,
                **limit,
            )
        items: list[dict[str, Any]] = list(found.get("items", []))
        return sorted(
            items, key=lambda o: (o["metadata"].get("namespace", ""), o["metadata"]["name"])
        )

    def replica_pods(self, namespace: str, name: str) -> list[Any]:
        """The log's replica pods (V1Pod), by name (the operator's selector labels)."""
        selector = ",".join(
            f"{k}={v}"
            for k, v in {
                c.LABEL_NAME: c.APP_NAME,
                c.LABEL_INSTANCE: name,
                c.LABEL_COMPONENT: c.COMPONENT_REPLICA,
            }.items()
        )
        found = self._call(
            f"pods of {namespace}/{name}",
            self.core.list_namespaced_pod,
            namespace,
            label_selector=selector,
        )
        return sorted(found.items, key=lambda pod: pod.metadata.name)

    def operator_pods(self) -> list[Any] | None:
        """The operator's pods in any namespace (the chart's label); None if the user may
        not list pods across namespaces."""
        try:
            found = self._call(
                "operator pods",
                self.core.list_pod_for_all_namespaces,
                label_selector=f"{c.LABEL_NAME}={OPERATOR_APP}",
            )
        except PluginError as e:
            if "forbidden" in str(e):
                return None
            raise
        return sorted(found.items, key=lambda p: (p.metadata.namespace, p.metadata.name))

    def pod_log(
        self, namespace: str, pod: str, since: int | None, tail: int | None, previous: bool
    ) -> str:
        """A container's log ("" when there is none, e.g. no previous container)."""
        kwargs: dict[str, Any] = {"timestamps": True, "previous": previous}
        if since is not None:
            kwargs["since_seconds"] = since
        if tail is not None:
            kwargs["tail_lines"] = tail
        try:
            return str(
                self._call(
                    f"log of {namespace}/{pod}",
                    self.core.read_namespaced_pod_log,
                    pod,
                    namespace,
                    **kwargs,
                )
            )
        except PluginError as e:
            if previous and "HTTP 400" in str(e):
                return ""  # no previous container: nothing to say
            raise

    def events(self, namespace: str, names: set[str]) -> list[dict[str, Any]]:
        """The namespace's events about the objects named `names` (the log, its pods and
        claims), oldest first."""
        found = self._call(f"events in {namespace}", self.core.list_namespaced_event, namespace)
        serialized = [self.api_client.sanitize_for_serialization(e) for e in found.items]
        about = [e for e in serialized if (e.get("involvedObject") or {}).get("name") in names]
        return sorted(about, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))

    def owned(self, namespace: str, name: str) -> dict[str, Any]:
        """What the operator made for the log, as the API returns it: the StatefulSet, the
        pods, the claims, the Services (for a support report)."""
        selector = f"{c.LABEL_INSTANCE}={name}"
        serialize = self.api_client.sanitize_for_serialization
        apps = self._apps()
        return {
            "statefulsets": serialize(
                self._call(
                    f"StatefulSets of {namespace}/{name}",
                    apps.list_namespaced_stateful_set,
                    namespace,
                    label_selector=selector,
                ).items
            ),
            "pods": serialize(self.replica_pods(namespace, name)),
            "persistentvolumeclaims": serialize(
                self._call(
                    f"claims of {namespace}/{name}",
                    self.core.list_namespaced_persistent_volume_claim,
                    namespace,
                    label_selector=selector,
                ).items
            ),
            "services": serialize(
                self._call(
                    f"Services of {namespace}/{name}",
                    self.core.list_namespaced_service,
                    namespace,
                    label_selector=selector,
                ).items
            ),
        }

    def _apps(self) -> Any:
        from kubernetes import client

        return client.AppsV1Api(self.api_client)

    def log(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            found: dict[str, Any] = self._call(
                f"ReplicatedLog {namespace}/{name}",
                self.custom.get_namespaced_custom_object,
                c.GROUP,
                c.VERSION,
                namespace,
                c.PLURAL,
                name,
            )
        except PluginError as e:
            if str(e).endswith("not found"):
                raise PluginError(f"no ReplicatedLog {name!r} in namespace {namespace}") from None
            raise
        return found

    def create(self, namespace: str, body: Mapping[str, Any]) -> None:
        self._call(
            f"ReplicatedLog {namespace}/{body['metadata']['name']}",
            self.custom.create_namespaced_custom_object,
            c.GROUP,
            c.VERSION,
            namespace,
            c.PLURAL,
            dict(body),
        )

    def secret_written(self, namespace: str, name: str) -> bool:
        try:
            found = self._call(
                f"Secret {namespace}/{name}", self.core.read_namespaced_secret, name, namespace
            )
        except PluginError as e:
            if str(e).endswith("not found"):
                return False
            raise
        return bool((found.data or {}).get("tls.crt"))

    def apply(self, namespace: str, request: Request) -> None:
        what = f"{request.kind} {namespace}/{request.name}"
        if request.kind == "Pod":
            self._call(what, self.core.patch_namespaced_pod, request.name, namespace, request.patch)
        else:
            self._call(
                what,
                self.custom.patch_namespaced_custom_object,
                c.GROUP,
                c.VERSION,
                namespace,
                c.PLURAL,
                request.name,
                request.patch,
            )


def _by_place(item: Mapping[str, Any]) -> tuple[str, str]:
    return str(item["metadata"].get("namespace", "")), str(item["metadata"]["name"])


def _status_reason(e: Any) -> str:
    """The reason of a Kubernetes Status body ("Conflict", "AlreadyExists", ...); both are
    HTTP 409."""
    import json

    try:
        body = json.loads(e.body or "{}")
    except (TypeError, ValueError):
        return ""
    return str(body.get("reason") or "") if isinstance(body, dict) else ""


def apply_fresh(
    cluster: Cluster,
    namespace: str,
    name: str,
    build: Callable[[Mapping[str, Any]], Request],
    log: Mapping[str, Any] | None = None,
) -> tuple[Request, int]:
    """`build` a request from the log (`log` as read already, else read now) and apply it;
    on a conflict read the log again and build again (`CONFLICT_SECONDS`). Returns the
    request applied and the number of attempts it took."""
    import random
    import time

    deadline = time.monotonic() + CONFLICT_SECONDS
    attempts, pause = 0, 0.05
    while True:
        current = log if log is not None else cluster.log(namespace, name)
        request = build(current)
        attempts += 1
        try:
            cluster.apply(namespace, request)
            return request, attempts
        except ConflictError as e:
            if time.monotonic() + pause > deadline:
                raise PluginError(
                    f"{e}, {attempts} times in {CONFLICT_SECONDS:g}s: another writer keeps "
                    "changing it; try again"
                ) from None
        time.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(pause * 2, 1.0)
        log = None
