"""Desired Kubernetes objects of a ReplicatedLog, built by pure functions (no I/O).

Like CloudNativePG's `pkg/specs`, every builder takes the custom resource (its `metadata`
and `spec`, as the API server returns it) and the operator's configuration and returns a
plain manifest dict; the kopf handlers add owner references (`kopf.adopt`) and apply them.

Design choices (see also the module docs of status.py and rolling.py):

* Replica id = StatefulSet ordinal, read from the downward API label
  `apps.kubernetes.io/pod-index` into `$(RLOG_REPLICA_ID)` and expanded by the kubelet in the
  container's args. No shell wrapper: `rlog replica` is PID 1 and gets SIGTERM directly. The
  label is set by the StatefulSet controller since Kubernetes 1.28 (beta, on by default) and
  GA in 1.32; on an older cluster the variable is empty and the replica exits with a one-line
  usage error instead of guessing.
* `--peers` lists the stable DNS names `<sts>-<i>.<headless>.<ns>.svc[.<domain>]` in ordinal
  order; the headless Service publishes not-ready addresses so that replicas find each other
  before any of them is VOTING (auto-initialization needs every replica to answer). The
  replica binds `0.0.0.0:<port>` (`--listen`), so it starts before its DNS record exists and
  the probes reach it on 127.0.0.1.
* Probes: the kubelet's own gRPC probes of the replica's health port (probes.py): alive
  while the replica serves, ready only while it is VOTING, so the client Service only routes
  to voting replicas and the PodDisruptionBudget counts only voting replicas as healthy. A
  long catch-up never gets the pod killed; the startup probe gives a slow start 10 minutes.
* Stopping: `rlog replica` is PID 1 and handles SIGTERM itself (no preStop hook: there is no
  shell in the way, and a hook would only duplicate it): a leader steps down first and keeps
  serving until another replica leads (`--drain-timeout`, OperatorConfig.drain_seconds),
  within terminationGracePeriodSeconds. Replicas spread over zones and nodes by default
  (topology spread constraints, ScheduleAnyway; `spec.topologySpreadConstraints` overrides).
* Restricted pod security: non-root uid 10001 (the image's user), fsGroup for the volume,
  seccomp RuntimeDefault, no capabilities, no privilege escalation, read-only root
  filesystem (an emptyDir on /tmp), no service-account token (replicas never call the API).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rlog import __version__
from rlog.log_format import ENV as LOG_FORMAT_ENV
from rlog.log_format import TEXT, check_format
from rlog.version import semver
from rlog_operator import archive_specs
from rlog_operator import constants as c
from rlog_operator.probes import probes
from rlog_operator.quantities import quantity

Manifest = dict[str, Any]
Body = Mapping[str, Any]


@dataclass(frozen=True)
class OperatorConfig:
    """What the operator's deployment decides for every log (env vars of the operator)."""

    # the replica image of this build, tagged with the version's SemVer spelling (the chart
    # sets RLOG_REPLICA_IMAGE, its own default the same: docs/upgrades.md, "Versions")
    replica_image: str = f"docker.io/rlog/rlog-replica:{semver(__version__)}"
    image_pull_policy: str = "IfNotPresent"
    grpc_port: int = c.GRPC_PORT
    metrics_port: int = c.METRICS_PORT
    health_port: int = c.HEALTH_PORT
    # "" -> peers are `<pod>.<svc>.<ns>.svc` (resolved through the pod's search path);
    # e.g. "cluster.local" -> fully qualified names.
    cluster_domain: str = ""
    listen_host: str = "0.0.0.0"
    # A leader asked to stop steps down and serves until another replica leads, at most
    # drain_seconds (`rlog replica --drain-timeout`); the grace period leaves room for that
    # and for closing the store before the kubelet's SIGKILL.
    drain_seconds: int = 10
    termination_grace_seconds: int = 30
    # where the operator runs (its pods are let in by a log's NetworkPolicy)
    operator_namespace: str = "rlog-system"
    # the operator's own log format, which its replicas use too (`--log-format`): text
    # leaves the replicas' arguments as they were, so no rolling restart follows an upgrade
    log_format: str = TEXT

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> OperatorConfig:
        """Read RLOG_REPLICA_IMAGE, RLOG_IMAGE_PULL_POLICY, RLOG_GRPC_PORT, RLOG_METRICS_PORT,
        RLOG_HEALTH_PORT, RLOG_CLUSTER_DOMAIN, RLOG_LOG_FORMAT from a mapping (pass
        os.environ)."""
        d = cls()
        config = cls(
            replica_image=env.get("RLOG_REPLICA_IMAGE", d.replica_image),
            image_pull_policy=env.get("RLOG_IMAGE_PULL_POLICY", d.image_pull_policy),
            grpc_port=int(env.get("RLOG_GRPC_PORT", d.grpc_port)),
            metrics_port=int(env.get("RLOG_METRICS_PORT", d.metrics_port)),
            health_port=int(env.get("RLOG_HEALTH_PORT", d.health_port)),
            cluster_domain=env.get("RLOG_CLUSTER_DOMAIN", d.cluster_domain).strip("."),
            operator_namespace=env.get("RLOG_OPERATOR_NAMESPACE", d.operator_namespace),
            log_format=check_format(env.get(LOG_FORMAT_ENV) or d.log_format),
        )
        ports = {
            "RLOG_GRPC_PORT": config.grpc_port,
            "the write lane's port (RLOG_GRPC_PORT + 1)": lane_port(config),
            "RLOG_METRICS_PORT": config.metrics_port,
            "RLOG_HEALTH_PORT": config.health_port,
        }
        seen: dict[int, str] = {}
        for name, port in ports.items():
            if port in seen:
                raise ValueError(f"{name} {port} collides with {seen[port]}: each needs its own")
            seen[port] = name
        return config


# ---- names ----------------------------------------------------------------------------------


def name_of(body: Body) -> str:
    return str(body["metadata"]["name"])


def namespace_of(body: Body) -> str:
    return str(body["metadata"].get("namespace") or "default")


def uid_of(body: Body) -> str:
    return str(body["metadata"].get("uid") or "")


def statefulset_name(body: Body) -> str:
    return name_of(body)


def headless_service_name(body: Body) -> str:
    return f"{name_of(body)}-headless"


def client_service_name(body: Body) -> str:
    return name_of(body)


def pdb_name(body: Body) -> str:
    return name_of(body)


def pod_name(body: Body, ordinal: int) -> str:
    return f"{statefulset_name(body)}-{ordinal}"


def pvc_name(body: Body, ordinal: int) -> str:
    """The StatefulSet controller names claims `<template>-<sts>-<ordinal>`."""
    return f"{c.DATA_VOLUME}-{statefulset_name(body)}-{ordinal}"


def replicas_of(body: Body) -> int:
    return int(body.get("spec", {}).get("replicas", c.DEFAULT_REPLICAS))


def peer_host(body: Body, ordinal: int, config: OperatorConfig) -> str:
    host = f"{pod_name(body, ordinal)}.{headless_service_name(body)}.{namespace_of(body)}.svc"
    return f"{host}.{config.cluster_domain}" if config.cluster_domain else host


def peers(body: Body, config: OperatorConfig) -> list[str]:
    """Every replica's address, in replica-id (= ordinal) order, as `--peers` wants them."""
    return [f"{peer_host(body, i, config)}:{config.grpc_port}" for i in range(replicas_of(body))]


def paused(body: Body) -> bool:
    """The annotation rlog.io/paused=true stops reconciliation (not observation)."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(c.ANNOTATION_PAUSED, "")).strip().lower() == "true"


def ordinal_of(pod: str) -> int | None:
    """The StatefulSet ordinal at the end of a pod name, or None."""
    head, sep, tail = pod.rpartition("-")
    return int(tail) if sep and head and tail.isdigit() else None


# ---- labels ---------------------------------------------------------------------------------


def selector_labels(body: Body) -> dict[str, str]:
    """The (immutable) StatefulSet selector: the subset of labels that identifies replicas."""
    return {
        c.LABEL_NAME: c.APP_NAME,
        c.LABEL_INSTANCE: name_of(body),
        c.LABEL_COMPONENT: c.COMPONENT_REPLICA,
    }


def labels(body: Body) -> dict[str, str]:
    return {**selector_labels(body), c.LABEL_MANAGED_BY: c.MANAGED_BY}


def _metadata(body: Body, name: str) -> Manifest:
    return {"name": name, "namespace": namespace_of(body), "labels": labels(body)}


# ---- TLS and roles (docs/security.md; the certificates themselves: pki.py) ------------------

MODE_OPERATOR = "operator"
MODE_CERT_MANAGER = "certManager"
MODE_DISABLED = "disabled"
MODES = (MODE_OPERATOR, MODE_CERT_MANAGER, MODE_DISABLED)
TLS_MOUNT = "/etc/rlog/tls"
AUTH_MOUNT = "/etc/rlog/auth"
# Keys of the Secrets (those of kubernetes.io/tls and of cert-manager).
CA_KEY = "ca.crt"
CERT_KEY = "tls.crt"
KEY_KEY = "tls.key"
ROLES_KEY = "roles.json"
# The replicas' Secret in mode operator also holds the two CAs apart (docs/security.md,
# "PKI"): the peer CA (replicas and operator) and the client CA (every other client).
PEER_CA_KEY = "peer-ca.crt"
CLIENT_CA_KEY = "client-ca.crt"
# Mode certManager with spec.tls.peerIssuerRef: the clients' issuer's CA (ca.crt of the
# Secret `client_ca_secret_name`) for the replicas.
CLIENT_CA_MOUNT = "/etc/rlog/client-ca"


def built_mode_of(body: Body) -> str:
    """The mode the log was built with: `status.tls.mode`, else `disabled` for a log
    initialized before the operator knew TLS (no `status.tls`); "" for a log not built yet.
    A running log's mode never changes (observed.tls_mode_changed, and the CRD's rule)."""
    status = body.get("status") or {}
    built = (status.get("tls") or {}).get("mode")
    if built:
        return str(built)
    return MODE_DISABLED if status.get("initialized") else ""


def mode_of(body: Body) -> str:
    """`spec.tls.mode`: operator, certManager or disabled. Unset: the mode the log was
    built with (`built_mode_of`), else `operator` for a new log: a rolling change of the
    mode would leave TLS and plaintext replicas unable to talk to each other, so unset
    never means another mode than the one the log runs."""
    given = (body.get("spec", {}).get("tls") or {}).get("mode")
    mode = str(given) if given else built_mode_of(body) or MODE_OPERATOR
    if mode not in MODES:
        raise ValueError(f"spec.tls.mode {mode!r} is not one of {', '.join(MODES)}")
    return mode


def server_secret_name(body: Body) -> str:
    """The replicas' certificate, key and CA (kubernetes.io/tls)."""
    return f"{name_of(body)}-tls"


def archiver_secret_name(body: Body) -> str:
    """The archiver's client certificate (spec.backup; role read)."""
    return f"{name_of(body)}-tls-archiver"


def client_ca_secret_name(body: Body) -> str:
    """Mode certManager with a peers' issuer: the clients' issuer's CA (its ca.crt)."""
    return f"{name_of(body)}-tls-client-ca"


def peer_issuer_given(body: Body) -> bool:
    """Mode certManager with `spec.tls.peerIssuerRef`: the log's own identities (replicas,
    operator, archiver) from an issuer of their own, clients from `spec.tls.issuerRef`."""
    tls = body.get("spec", {}).get("tls") or {}
    return mode_of(body) == MODE_CERT_MANAGER and bool(tls.get("peerIssuerRef"))


def auth_secret_name(body: Body) -> str:
    """The replicas' roles file."""
    return f"{name_of(body)}-auth"


# Mode disabled: the replicas serve plaintext on the pod's address (`--listen 0.0.0.0`),
# which a replica refuses without --insecure, and the operator calls their Admin API
# (permits, step-down: replica_calls.py) from its own pod, which a plaintext replica answers
# only from loopback without --admin-from-anywhere (docs/security.md, "Plaintext").
PLAINTEXT_ARGS = ("--insecure", "--admin-from-anywhere")


def security_args(body: Body) -> list[str]:
    """The replica's security flags for the mode (disabled: plaintext, said explicitly).
    Mode operator keeps peers apart from clients (`--tls-peer-ca`: only the peer CA's
    certificates are peers or admins), and so does mode certManager with
    `spec.tls.peerIssuerRef`; mode certManager with one issuer for everybody knows peers by
    name (the replicas warn; docs/security.md)."""
    mode = mode_of(body)
    if mode == MODE_DISABLED:
        return list(PLAINTEXT_ARGS)
    if mode == MODE_OPERATOR:
        trust = [
            "--tls-client-ca",
            f"{TLS_MOUNT}/{CLIENT_CA_KEY}",
            "--tls-peer-ca",
            f"{TLS_MOUNT}/{PEER_CA_KEY}",
        ]
    elif peer_issuer_given(body):
        trust = [
            "--tls-client-ca",
            f"{CLIENT_CA_MOUNT}/{CA_KEY}",
            "--tls-peer-ca",
            f"{TLS_MOUNT}/{CA_KEY}",
        ]
    else:
        trust = ["--tls-client-ca", f"{TLS_MOUNT}/{CA_KEY}"]
    return [
        "--tls-cert",
        f"{TLS_MOUNT}/{CERT_KEY}",
        "--tls-key",
        f"{TLS_MOUNT}/{KEY_KEY}",
        *trust,
        "--auth-config",
        f"{AUTH_MOUNT}/{ROLES_KEY}",
    ]


def security_env(body: Body) -> list[Manifest]:
    """The probes' and `kubectl exec ... rlog` credentials: the replica's own certificate
    (role peer: it may read Status) through the RLOG_* variables."""
    mode = mode_of(body)
    if mode == MODE_DISABLED:
        return []
    server_ca = PEER_CA_KEY if mode == MODE_OPERATOR else CA_KEY  # what verifies the replicas
    return [
        {"name": "RLOG_CA", "value": f"{TLS_MOUNT}/{server_ca}"},
        {"name": "RLOG_CERT", "value": f"{TLS_MOUNT}/{CERT_KEY}"},
        {"name": "RLOG_KEY", "value": f"{TLS_MOUNT}/{KEY_KEY}"},
    ]


def security_volumes(body: Body) -> tuple[list[Manifest], list[Manifest]]:
    """(pod volumes, container mounts) of the Secrets. Mounted as directories (no
    subPath): the kubelet swaps the files in place when the Secret changes."""
    if mode_of(body) == MODE_DISABLED:
        return [], []
    volumes: list[Manifest] = [
        {
            "name": "tls",
            "secret": {"secretName": server_secret_name(body), "defaultMode": 0o440},
        },
        {
            "name": "auth",
            "secret": {"secretName": auth_secret_name(body), "defaultMode": 0o440},
        },
    ]
    mounts: list[Manifest] = [
        {"name": "tls", "mountPath": TLS_MOUNT, "readOnly": True},
        {"name": "auth", "mountPath": AUTH_MOUNT, "readOnly": True},
    ]
    if peer_issuer_given(body):  # only the CA's certificate of that Secret
        secret = {
            "secretName": client_ca_secret_name(body),
            "defaultMode": 0o440,
            "items": [{"key": CA_KEY, "path": CA_KEY}],
        }
        volumes.append({"name": "client-ca", "secret": secret})
        mounts.append({"name": "client-ca", "mountPath": CLIENT_CA_MOUNT, "readOnly": True})
    return volumes, mounts


# ---- the StatefulSet ------------------------------------------------------------------------


def lane_port(config: OperatorConfig) -> int:
    """The replicas' lane port: the leader's writes, and clients' appends."""
    return config.grpc_port + c.WRITE_LANE_OFFSET


def replica_args(body: Body, config: OperatorConfig) -> list[str]:
    """Arguments of `rlog replica` (the id is expanded by the kubelet from the env)."""
    return [
        "--id",
        "$(RLOG_REPLICA_ID)",
        "--peers",
        ",".join(peers(body, config)),
        "--data-dir",
        c.DATA_DIR,
        "--listen",
        f"{config.listen_host}:{config.grpc_port}",
        "--metrics-port",
        str(config.metrics_port),
        "--health-port",
        str(config.health_port),
        "--log-id",
        uid_of(body),
        "--drain-timeout",
        str(config.drain_seconds),
        "--write-lane-offset",
        str(c.WRITE_LANE_OFFSET),
        *catchup_args(body),
        *security_args(body),
        *(["--log-format", config.log_format] if config.log_format != TEXT else []),
    ]


def catchup_args(body: Body) -> list[str]:
    """`--catchup-rate` from spec.catchUpRate, a quantity of bytes per second (the CRD
    admits no negative one), rounded up; nothing when unset or 0 (no cap)."""
    rate = (body.get("spec") or {}).get("catchUpRate")
    if rate is None or (value := quantity(rate)) <= 0:
        return []
    return ["--catchup-rate", str(math.ceil(value))]


def container_security_context() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": c.REPLICA_UID,
        "runAsGroup": c.REPLICA_UID,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def pod_security_context() -> Manifest:
    return {
        "runAsNonRoot": True,
        "runAsUser": c.REPLICA_UID,
        "runAsGroup": c.REPLICA_UID,
        "fsGroup": c.REPLICA_UID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def replica_container(body: Body, config: OperatorConfig) -> Manifest:
    spec = body.get("spec", {})
    env: list[Manifest] = [
        {
            "name": "RLOG_REPLICA_ID",
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.labels['{c.LABEL_POD_INDEX}']"}},
        },
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        # `kubectl exec <pod> -- rlog status` works with no flags
        {"name": "RLOG_ENDPOINT", "value": f"127.0.0.1:{config.grpc_port}"},
        *security_env(body),
    ]
    return {
        "name": c.CONTAINER_NAME,
        "image": spec.get("image") or config.replica_image,
        "imagePullPolicy": spec.get("imagePullPolicy") or config.image_pull_policy,
        "command": ["rlog", "replica"],
        "args": replica_args(body, config),
        "env": env,
        "ports": [
            {"name": "grpc", "containerPort": config.grpc_port, "protocol": "TCP"},
            {"name": "lane", "containerPort": lane_port(config), "protocol": "TCP"},
            {"name": "metrics", "containerPort": config.metrics_port, "protocol": "TCP"},
            {"name": "health", "containerPort": config.health_port, "protocol": "TCP"},
        ],
        **probes(config.health_port),
        "resources": copy.deepcopy(spec.get("resources") or {}),
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": c.DATA_VOLUME, "mountPath": c.DATA_MOUNT},
            {"name": "tmp", "mountPath": "/tmp"},
            *security_volumes(body)[1],
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def default_affinity(body: Body) -> Manifest:
    """Spread replicas over nodes when possible (preferred: a 1-node cluster still works)."""
    return {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 100,
                    "podAffinityTerm": {
                        "topologyKey": "kubernetes.io/hostname",
                        "labelSelector": {"matchLabels": selector_labels(body)},
                    },
                }
            ]
        }
    }


def default_topology_spread(body: Body) -> list[Manifest]:
    """Spread replicas over zones and nodes, softly (ScheduleAnyway): a drain or a zone
    outage then takes at most one replica when the cluster has room, and a small cluster
    (one zone, fewer nodes than replicas) still schedules every replica."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": key,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector_labels(body)},
        }
        for key in ("topology.kubernetes.io/zone", "kubernetes.io/hostname")
    ]


def topology_spread(body: Body) -> list[Manifest]:
    """spec.topologySpreadConstraints when set (an empty list turns spreading off), else
    the default."""
    spec = body.get("spec", {})
    if "topologySpreadConstraints" in spec and spec["topologySpreadConstraints"] is not None:
        return copy.deepcopy(list(spec["topologySpreadConstraints"]))
    return default_topology_spread(body)


def pod_template(body: Body, config: OperatorConfig) -> Manifest:
    spec = body.get("spec", {})
    pod_labels = {**dict(spec.get("podLabels") or {}), **labels(body)}
    annotations = {
        **dict(spec.get("podAnnotations") or {}),
        "kubectl.kubernetes.io/default-container": c.CONTAINER_NAME,
        c.ANNOTATION_LOG_ID: uid_of(body),
    }
    pod_spec: Manifest = {
        "containers": [replica_container(body, config)],
        "securityContext": pod_security_context(),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": config.termination_grace_seconds,
        "affinity": copy.deepcopy(spec.get("affinity") or default_affinity(body)),
        "topologySpreadConstraints": topology_spread(body),
        "volumes": [
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            *security_volumes(body)[0],
        ],
    }
    for key in ("nodeSelector", "tolerations", "priorityClassName", "imagePullSecrets"):
        if spec.get(key):
            pod_spec[key] = copy.deepcopy(spec[key])
    restore = archive_specs.restore_init_container(
        body,
        image=spec.get("image") or config.replica_image,
        pull_policy=spec.get("imagePullPolicy") or config.image_pull_policy,
        peers=peers(body, config),
        security_context=container_security_context(),
        tls_env=security_env(body),
        tls_mounts=[m for m in security_volumes(body)[1] if m["name"] == "tls"],
    )
    if restore is not None:
        pod_spec["initContainers"] = [restore]
    return {"metadata": {"labels": pod_labels, "annotations": annotations}, "spec": pod_spec}


def volume_claim_template(body: Body) -> Manifest:
    storage = body["spec"]["storage"]
    claim: Manifest = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": str(storage["size"])}},
    }
    if storage.get("storageClassName"):
        claim["storageClassName"] = storage["storageClassName"]
    return {"metadata": {"name": c.DATA_VOLUME, "labels": labels(body)}, "spec": claim}


def statefulset(body: Body, config: OperatorConfig) -> Manifest:
    meta = _metadata(body, statefulset_name(body))
    meta["annotations"] = {c.ANNOTATION_LOG_ID: uid_of(body)}
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta,
        "spec": {
            "replicas": replicas_of(body),
            "serviceName": headless_service_name(body),
            # all replicas must run at once to auto-initialize
            "podManagementPolicy": "Parallel",
            # the operator, not the StatefulSet controller, decides when a pod goes
            "updateStrategy": {"type": "OnDelete"},
            # a replica's volume is its vote: never let Kubernetes delete it
            "persistentVolumeClaimRetentionPolicy": {
                "whenDeleted": "Retain",
                "whenScaled": "Retain",
            },
            "revisionHistoryLimit": 10,
            "selector": {"matchLabels": selector_labels(body)},
            "template": pod_template(body, config),
            "volumeClaimTemplates": [volume_claim_template(body)],
        },
    }


# ---- Services and the PodDisruptionBudget --------------------------------------------------


def _ports(config: OperatorConfig, metrics: bool) -> list[Manifest]:
    ports: list[Manifest] = [
        {
            "name": "grpc",
            "port": config.grpc_port,
            "targetPort": "grpc",
            "protocol": "TCP",
            "appProtocol": "kubernetes.io/h2c",
        },
        {"name": "lane", "port": lane_port(config), "targetPort": "lane", "protocol": "TCP"},
    ]
    if metrics:
        ports.append(
            {
                "name": "metrics",
                "port": config.metrics_port,
                "targetPort": "metrics",
                "protocol": "TCP",
                "appProtocol": "http",
            }
        )
    return ports


def headless_service(body: Body, config: OperatorConfig) -> Manifest:
    """Stable per-replica DNS names for `--peers` (and metrics scraping), ready or not."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(body, headless_service_name(body)),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": selector_labels(body),
            "ports": _ports(config, metrics=True),
        },
    }


def client_service(body: Body, config: OperatorConfig) -> Manifest:
    """What clients use: any ready (VOTING) replica serves any request and forwards appends
    to the leader, so a plain ClusterIP over the ready replicas is enough."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(body, client_service_name(body)),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(body),
            "ports": _ports(config, metrics=False),
        },
    }


def pod_disruption_budget(body: Body) -> Manifest:
    """At most one replica voluntarily down at a time. Unready (non-VOTING) pods may always
    be evicted: they hold no vote, and a drain must not hang on a crash-looping pod."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _metadata(body, pdb_name(body)),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(body)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def desired_objects(body: Body, config: OperatorConfig) -> list[Manifest]:
    """Everything a ReplicatedLog owns, in the order to create it (with
    `spec.networkPolicy`, netpol.for_log's NetworkPolicy goes before these)."""
    objects = [
        headless_service(body, config),
        client_service(body, config),
        pod_disruption_budget(body),
        statefulset(body, config),
    ]
    spec = body.get("spec", {})
    if spec.get("backup"):
        objects += [
            archive_specs.archiver_service(body),
            archive_specs.archiver_deployment(
                body,
                image=spec.get("image") or config.replica_image,
                pull_policy=spec.get("imagePullPolicy") or config.image_pull_policy,
                client_endpoint=f"{client_service_name(body)}:{config.grpc_port}",
                security_context=container_security_context(),
                pod_security_context=pod_security_context(),
                tls_secret=None if mode_of(body) == MODE_DISABLED else archiver_secret_name(body),
            ),
        ]
    return objects
