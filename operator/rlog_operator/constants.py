"""Names shared by the CRD, the manifest builders, the status and rolling logic.

Everything here is part of the operator's contract with users (labels they select on,
annotations they set) or with the replica image (ports, paths): change with care.
"""

from __future__ import annotations

from typing import Final

GROUP: Final = "rlog.io"
VERSION: Final = "v1alpha1"
KIND: Final = "ReplicatedLog"
PLURAL: Final = "replicatedlogs"
SHORT_NAME: Final = "rlog"

# ---- labels on everything the operator makes -----------------------------------------------
# The watches select replicas by name and component; the instance names the log they belong to.
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
APP_NAME: Final = "rlog"
COMPONENT_REPLICA: Final = "replica"
COMPONENT_ARCHIVER: Final = "archiver"
MANAGED_BY: Final = "rlog-operator"

# Set by the StatefulSet controller on its pods.
LABEL_REVISION: Final = "controller-revision-hash"
LABEL_POD_INDEX: Final = "apps.kubernetes.io/pod-index"  # GA in Kubernetes 1.32 (beta 1.28)
LABEL_POD_NAME: Final = "statefulset.kubernetes.io/pod-name"

# ---- annotations users set -----------------------------------------------------------------
# On the ReplicatedLog, value = the CR's metadata.uid (so a copied manifest cannot trigger it):
ANNOTATION_INITIALIZE: Final = "rlog.io/initialize"  # first initialization, autoInitialize false
ANNOTATION_REINITIALIZE: Final = "rlog.io/reinitialize"  # after a suspected total data loss
# On the ReplicatedLog, "true": pause reconciliation (status.paused says so). The status
# stays fresh; nothing is applied, granted, deleted or stepped down until it is removed
# (or set to anything else).
ANNOTATION_PAUSED: Final = "rlog.io/paused"
# On the ReplicatedLog, any non-empty value: ask the current leader to step down once (the
# operator removes the annotation when done; `kubectl rlog step-down` sets it).
ANNOTATION_STEP_DOWN: Final = "rlog.io/step-down"
# On the ReplicatedLog, a request id (`kubectl rlog backup` writes the time): archive the
# log through its current learned position now (backups.py); status.archive.backup reports it.
ANNOTATION_BACKUP: Final = "rlog.io/backup"
# On a replica pod, any non-empty value: replace this replica's volume (PVC + pod).
ANNOTATION_REPLACE_VOLUME: Final = "rlog.io/replace-volume"
# On the StatefulSet and pods the operator makes: the identity the replicas are stamped with.
ANNOTATION_LOG_ID: Final = "rlog.io/log-id"

# ---- the replica container -----------------------------------------------------------------
CONTAINER_NAME: Final = "replica"
ARCHIVER_CONTAINER: Final = "archiver"
RESTORE_CONTAINER: Final = "restore"  # the init container of spec.bootstrap.fromArchive
DATA_VOLUME: Final = "data"
DATA_MOUNT: Final = "/data"
# A sub-directory of the volume: a fresh ext4 volume holds lost+found at its root.
DATA_DIR: Final = "/data/log"
GRPC_PORT: Final = 7000
# The replicas' write lane (the leader's writes on plain TCP, mutual TLS with TLS) at the
# gRPC port + this (`rlog replica --write-lane-offset`): 7001 by default.
WRITE_LANE_OFFSET: Final = 1
METRICS_PORT: Final = 9100
# grpc.health.v1 in plaintext for the kubelet's grpc probes (`rlog replica --health-port`).
HEALTH_PORT: Final = 7002
# The health service a replica reports SERVING only while VOTING (rlog/runtime/health.py).
READY_SERVICE: Final = "rlog.v1.Log"
REPLICA_UID: Final = 10001  # the replica image's user (replica_image/Dockerfile)

DEFAULT_REPLICAS: Final = 3
ALLOWED_REPLICAS: Final = (1, 3, 5, 7)

# Replica statuses as `rlog status --json` prints them.
EMPTY: Final = "EMPTY"
STARTING: Final = "STARTING"
RECOVERING: Final = "RECOVERING"
VOTING: Final = "VOTING"


def quorum(replicas: int) -> int:
    """The Paxos quorum of a log of `replicas` replicas (the real count, never 2q-1)."""
    return replicas // 2 + 1
