"""The Kubernetes API objects the operator's own calls go through (kopf's go through kopf),
all on one API client whose every request has a deadline.

Why a deadline: the client library's default is none, and a request on a connection that
died silently then blocks its thread for good. The observe timer makes these calls, kopf
waits for a running timer invocation without a timeout before it lets a deleted log go, so
one such request would hold a deletion forever; and the lease renewal would stop renewing
without noticing. One shared client also reuses its connections (a new API object per call
opened a new connection pool, and a TLS handshake, each time).
"""

from __future__ import annotations

import threading
from typing import Any

from kubernetes import client as k8s

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
