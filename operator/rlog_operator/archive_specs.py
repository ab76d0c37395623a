"""Desired objects of `spec.backup` and `spec.bootstrap.fromArchive` (docs/backup.md),
built by pure functions like specs.py.

* `spec.backup`: a Deployment `<name>-archiver` with one pod running `rlog archive run`
  against the log's client Service (strategy Recreate: never two archivers on one archive),
  and a Service of the same name for its metrics, which the operator reads into
  `status.archive` and Prometheus scrapes (`rlog_archive_*`), and for its control port
  (`POST /flush`), which on a TLS log takes the operator's certificate only and on a
  plaintext log listens on the pod's loopback only (rlog.archive.endpoint).
* `spec.bootstrap.fromArchive`: an init container on every replica pod running `rlog
  restore --if-fresh --starting --unless-peers-voting <peers>`: a fresh volume is restored
  STARTING, and the log then initializes as usual (the operator's permit); a volume lost
  later, while other replicas run the log, is left empty and recovers from them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from rlog_operator import constants as c

Manifest = dict[str, Any]
Body = Mapping[str, Any]

ARCHIVER_METRICS_PORT = 9101
ARCHIVER_CONTROL_PORT = 9102
# The archiver's delete credentials (spec.backup.deleteCredentialsSecret), as `rlog archive
# run` reads them: the Secret's keys are the usual AWS_* ones.
DELETE_CREDENTIALS_ENV = {
    "RLOG_ARCHIVE_DELETE_ACCESS_KEY_ID": "AWS_ACCESS_KEY_ID",
    "RLOG_ARCHIVE_DELETE_SECRET_ACCESS_KEY": "AWS_SECRET_ACCESS_KEY",
}


def archiver_name(body: Body) -> str:
    return f"{body['metadata']['name']}-archiver"


def archiver_host(body: Body) -> str:
    """The archiver Service's DNS name, which the operator dials (and the archiver's
    certificate names)."""
    return f"{archiver_name(body)}.{body['metadata'].get('namespace') or 'default'}.svc"


def archiver_server_names(body: Body) -> list[str]:
    """The names the archiver's certificate carries, for the operator's calls to its
    control port: the Service's, short and qualified."""
    namespace = body["metadata"].get("namespace") or "default"
    name = archiver_name(body)
    return [name, f"{name}.{namespace}", f"{name}.{namespace}.svc"]


def archiver_labels(body: Body) -> dict[str, str]:
    return {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: str(body["metadata"]["name"]),
        c.LABEL_COMPONENT: c.COMPONENT_ARCHIVER,
    }


def default_prefix(body: Body) -> str:
    meta = body["metadata"]
    return f"{meta.get('namespace', 'default')}/{meta['name']}"


def store_args(archive: Mapping[str, Any], prefix: str) -> list[str]:
    """The `--s3-endpoint/--bucket/--prefix/--region` arguments of an archive reference."""
    args = ["--bucket", str(archive["bucket"]), "--prefix", prefix]
    if archive.get("endpoint"):
        args += ["--s3-endpoint", str(archive["endpoint"])]
    if archive.get("region"):
        args += ["--region", str(archive["region"])]
    return args


def credentials_env(secret: str) -> list[Manifest]:
    return [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]


def backup_credentials_env(backup: Mapping[str, Any]) -> list[Manifest]:
    """The writing credentials' variables; none without credentialsSecret: the archiver then
    takes its keys from the pod's workload identity (serviceAccountName), whose variables the
    cloud's webhook sets (rlog.archive.credentials)."""
    secret = backup.get("credentialsSecret")
    return credentials_env(str(secret)) if secret else []


def delete_credentials_env(backup: Mapping[str, Any]) -> list[Manifest]:
    """The delete credentials' variables (none without deleteCredentialsSecret: the
    archiver then deletes with its writing credentials)."""
    secret = backup.get("deleteCredentialsSecret")
    if not secret:
        return []
    return [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": str(secret), "key": key}}}
        for name, key in DELETE_CREDENTIALS_ENV.items()
    ]


CLIENT_TLS_MOUNT = "/etc/rlog/tls"


def _client_tls_env() -> list[Manifest]:
    return [
        {"name": "RLOG_CA", "value": f"{CLIENT_TLS_MOUNT}/ca.crt"},
        {"name": "RLOG_CERT", "value": f"{CLIENT_TLS_MOUNT}/tls.crt"},
        {"name": "RLOG_KEY", "value": f"{CLIENT_TLS_MOUNT}/tls.key"},
    ]


def archiver_args(body: Body, client_endpoint: str) -> list[str]:
    backup = body["spec"]["backup"]
    args = ["archive", "run", "--endpoint", client_endpoint]
    args += store_args(backup, backup.get("prefix") or default_prefix(body))
    args += ["--metrics-port", str(ARCHIVER_METRICS_PORT)]
    args += ["--control-port", str(ARCHIVER_CONTROL_PORT)]
    if backup.get("segmentBytes"):
        args += ["--segment-bytes", str(backup["segmentBytes"])]
    if backup.get("flushIntervalSeconds"):
        args += ["--flush-interval", str(backup["flushIntervalSeconds"])]
    retention = backup.get("retention") or {}
    if retention.get("maxAgeSeconds"):
        args += ["--retention-max-age", str(retention["maxAgeSeconds"])]
    if retention.get("keepFromPosition") is not None:
        args += ["--retention-keep-from", str(retention["keepFromPosition"])]
    if retention.get("keepSegments"):
        args += ["--retention-keep-segments", str(retention["keepSegments"])]
    return args


def archiver_deployment(
    body: Body,
    *,
    image: str,
    pull_policy: str,
    client_endpoint: str,
    security_context: Manifest,
    pod_security_context: Manifest,
    tls_secret: str | None = None,
) -> Manifest:
    """The archiver; `tls_secret`: the Secret of its client certificate (a TLS log), mounted
    and named to `rlog` through the RLOG_* variables."""
    meta = body["metadata"]
    pod_labels = {**archiver_labels(body), c.LABEL_MANAGED_BY: c.MANAGED_BY}
    container: Manifest = {
        "name": c.ARCHIVER_CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": ["rlog"],
        "args": archiver_args(body, client_endpoint),
        "env": [
            *backup_credentials_env(body["spec"]["backup"]),
            *delete_credentials_env(body["spec"]["backup"]),
            *(_client_tls_env() if tls_secret else []),
        ],
        "ports": [
            {"name": "metrics", "containerPort": ARCHIVER_METRICS_PORT, "protocol": "TCP"},
            {"name": "control", "containerPort": ARCHIVER_CONTROL_PORT, "protocol": "TCP"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/metrics", "port": "metrics"},
            "periodSeconds": 10,
        },
        "resources": copy.deepcopy((body["spec"]["backup"].get("resources")) or {}),
        "securityContext": copy.deepcopy(security_context),
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            *([{"name": "tls", "mountPath": CLIENT_TLS_MOUNT}] if tls_secret else []),
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    volumes: list[Manifest] = [{"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}}]
    if tls_secret:
        volumes.append({"name": "tls", "secret": {"secretName": tls_secret, "defaultMode": 0o440}})
    account = body["spec"]["backup"].get("serviceAccountName")
    # the identity's ServiceAccount; the API token stays unmounted (the archiver never calls
    # the API; an identity webhook projects its own token)
    identity: Manifest = {"serviceAccountName": str(account)} if account else {}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": archiver_name(body),
            "namespace": meta.get("namespace"),
            "labels": pod_labels,
        },
        "spec": {
            "replicas": 1,
            # Never two archivers at once: the old pod is gone before the new one starts.
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": archiver_labels(body)},
            "template": {
                "metadata": {"labels": pod_labels},
                "spec": {
                    "containers": [container],
                    "securityContext": copy.deepcopy(pod_security_context),
                    **identity,
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    # flush what is pending on SIGTERM (one segment upload)
                    "terminationGracePeriodSeconds": 60,
                    "volumes": volumes,
                },
            },
        },
    }


def archiver_service(body: Body) -> Manifest:
    meta = body["metadata"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": archiver_name(body),
            "namespace": meta.get("namespace"),
            "labels": {**archiver_labels(body), c.LABEL_MANAGED_BY: c.MANAGED_BY},
        },
        "spec": {
            "type": "ClusterIP",
            "selector": archiver_labels(body),
            "ports": [
                {
                    "name": "metrics",
                    "port": ARCHIVER_METRICS_PORT,
                    "targetPort": "metrics",
                    "protocol": "TCP",
                },
                {
                    "name": "control",
                    "port": ARCHIVER_CONTROL_PORT,
                    "targetPort": "control",
                    "protocol": "TCP",
                },
            ],
        },
    }


def restore_init_container(
    body: Body,
    *,
    image: str,
    pull_policy: str,
    peers: list[str],
    security_context: Manifest,
    tls_env: Sequence[Manifest] = (),
    tls_mounts: Sequence[Manifest] = (),
) -> Manifest | None:
    """The init container restoring `spec.bootstrap.fromArchive` (None without one). On a
    TLS log it asks the peers' Status (`--unless-peers-voting`) with the replica's own
    certificate (`tls_env`, `tls_mounts`: the replica container's)."""
    source = ((body.get("spec") or {}).get("bootstrap") or {}).get("fromArchive")
    if not source:
        return None
    args = ["restore", "--if-fresh", "--starting", "--unless-peers-voting", ",".join(peers)]
    args += ["--data-dir", c.DATA_DIR]
    args += store_args(source, source.get("prefix") or "")
    if source.get("toPosition") is not None:
        args += ["--to-position", str(source["toPosition"])]
    return {
        "name": c.RESTORE_CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": ["rlog"],
        "args": args,
        "env": [*credentials_env(source["credentialsSecret"]), *copy.deepcopy(tls_env)],
        "securityContext": copy.deepcopy(security_context),
        "volumeMounts": [
            {"name": c.DATA_VOLUME, "mountPath": c.DATA_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
            *copy.deepcopy(tls_mounts),
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def parse_archive_metrics(text: str) -> dict[str, float]:
    """The archiver's gauges from its Prometheus text exposition."""
    wanted = {
        "rlog_archive_archived_position": "archivedPosition",
        "rlog_archive_log_learned_position": "logLearnedPosition",
        "rlog_archive_lag_positions": "lag",
        "rlog_archive_last_segment_timestamp_seconds": "lastSegment",
    }
    found: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.partition(" ")
        if name in wanted:
            try:
                found[wanted[name]] = float(value)
            except ValueError:
                continue
    return found


def archive_status(metrics: Mapping[str, float] | None, error: str = "") -> Manifest:
    """`status.archive` from the archiver's gauges (or why they could not be read)."""
    if metrics is None:
        return {"message": error or "the archiver's metrics could not be read"}
    status: Manifest = {}
    for key in ("archivedPosition", "logLearnedPosition", "lag"):
        if key in metrics:
            status[key] = int(metrics[key])
    if metrics.get("lastSegment"):
        import datetime

        when = datetime.datetime.fromtimestamp(metrics["lastSegment"], tz=datetime.UTC)
        status["lastSegmentTime"] = when.strftime("%Y-%m-%dT%H:%M:%SZ")
    status["message"] = ""
    return status
