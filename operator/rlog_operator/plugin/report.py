"""The plugin's read-only commands that gather from several objects: `version` (the builds
in use), `logs` (every replica's log, prefixed) and `report` (a support bundle: one
.tar.gz to attach to an issue, so that whoever helps sees what the user saw, without a
round of "please also send ...")."""

from __future__ import annotations

import datetime as dt
import io
import tarfile
from collections import Counter
from collections.abc import Mapping
from typing import Any

from rlog import __version__
from rlog.protocol.peer_version import PROTOCOL
from rlog_operator import constants as c
from rlog_operator.plugin.cluster import Cluster
from rlog_operator.plugin.patches import PluginError
from rlog_operator.plugin.views import (
    rendered,
    status_document,
    status_table,
    version_document,
    version_text,
)

OPERATOR_LOG_LINES = 5000  # of each operator pod: it logs about every log it serves


def _version_document(cluster: Cluster, namespace: str | None) -> dict[str, Any]:
    pods = cluster.operator_pods()
    operator = (
        None
        if pods is None
        else {
            f"{pod.metadata.namespace}/{pod.metadata.name}": [k.image for k in pod.spec.containers]
            for pod in pods
        }
    )
    replicas: dict[str, Counter[str]] = {}
    for log in cluster.logs(namespace):
        ns, name = log["metadata"].get("namespace", "default"), log["metadata"]["name"]
        replicas[f"{ns}/{name}"] = Counter(
            k.image
            for pod in cluster.replica_pods(ns, name)
            for k in pod.spec.containers
            if k.name == c.CONTAINER_NAME
        )
    return version_document(__version__, PROTOCOL, operator, replicas)


def version(cluster: Cluster, namespace: str | None, output: str | None) -> str:
    """The plugin's build, the operator pods' images, and each log's replica images (of
    `namespace`; None: every namespace)."""
    document = _version_document(cluster, namespace)
    return rendered(document, output) if output else version_text(document)


def replica_logs(
    cluster: Cluster,
    namespace: str,
    name: str,
    since: int | None,
    tail: int | None,
    previous: bool,
) -> str:
    """Every replica pod's log (with the kubelet's timestamps), each line prefixed with
    `[pod]`, one pod after the other."""
    pods = cluster.replica_pods(namespace, name)
    if not pods:
        raise PluginError(f"{name} has no replica pods in namespace {namespace}")
    out: list[str] = []
    for pod in pods:
        pod_name = pod.metadata.name
        text = cluster.pod_log(namespace, pod_name, since, tail, previous)
        out += [f"[{pod_name}] {line}" for line in text.splitlines()]
    return "\n".join(out)


def write_report(cluster: Cluster, namespace: str, log: Mapping[str, Any], path: str | None) -> str:
    """Write the support bundle; returns the line to print (where, and what it holds).
    Nothing secret goes in: no Secret is read, and the log's entries are never read."""
    name = str(log["metadata"]["name"])
    now = dt.datetime.now(dt.UTC)
    path = path or f"{name}-report-{now.strftime('%Y%m%dT%H%M%SZ')}.tar.gz"
    owned = cluster.owned(namespace, name)
    pods = [pod["metadata"]["name"] for pod in owned["pods"]]
    claims = [claim["metadata"]["name"] for claim in owned["persistentvolumeclaims"]]
    files: dict[str, str] = {
        "README.txt": (
            f"kubectl rlog report of ReplicatedLog {namespace}/{name}, {now.isoformat()}\n"
            f"by kubectl-rlog {__version__}. Contents: the log (log.yaml, status.txt), the\n"
            "objects the operator made for it (objects.yaml), events about them (events.yaml),\n"
            "every replica's log and previous log (logs/), the operator pods' logs\n"
            "(operator/), and the builds in use (version.txt). No Secret and no entry.\n"
        ),
        "log.yaml": rendered(_without_managed_fields(log), "yaml") + "\n",
        "status.txt": status_table(log) + "\n",
        "status.json": rendered(status_document(log), "json") + "\n",
        "objects.yaml": rendered(_without_managed_fields(owned), "yaml") + "\n",
        "events.yaml": rendered(cluster.events(namespace, {name, *pods, *claims}), "yaml") + "\n",
        "version.txt": version_text(_version_document(cluster, namespace)) + "\n",
    }
    for pod in pods:
        for previous in (False, True):
            text = _log_or_why(cluster, namespace, pod, None, previous)
            if text:
                files[f"logs/{pod}{'.previous' if previous else ''}.log"] = text
    for operator in cluster.operator_pods() or []:
        where, pod = operator.metadata.namespace, operator.metadata.name
        text = _log_or_why(cluster, where, pod, OPERATOR_LOG_LINES, False)
        if text:
            files[f"operator/{where}-{pod}.log"] = text
    with tarfile.open(path, "w:gz") as bundle:
        for member, content in files.items():
            data = content.encode()
            info = tarfile.TarInfo(f"{name}-report/{member}")
            info.size, info.mtime = len(data), int(now.timestamp())
            bundle.addfile(info, io.BytesIO(data))
    return f"{path}: {len(files)} files ({', '.join(sorted(files)[:4])}, ...)"


def _log_or_why(
    cluster: Cluster, namespace: str, pod: str, tail: int | None, previous: bool
) -> str:
    """A pod's log, or why it could not be read (the report goes on without it)."""
    try:
        return cluster.pod_log(namespace, pod, None, tail, previous)
    except PluginError as e:
        return f"(not read: {e})\n"


def _without_managed_fields(document: Any) -> Any:
    """`document` (plain data: the API's objects serialized) with every
    metadata.managedFields left out (noise for a reader)."""
    if isinstance(document, dict):
        return {k: _without_managed_fields(v) for k, v in document.items() if k != "managedFields"}
    if isinstance(document, list):
        return [_without_managed_fields(v) for v in document]
    return document
