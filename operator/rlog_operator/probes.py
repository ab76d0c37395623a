"""The replica container's probes: the kubelet's own gRPC probes of the replica's health port
(`rlog replica --health-port`, rlog/runtime/health.py; docs/operator.md, "Probes").

Alive while the replica serves, whatever its status (a catching-up replica is alive: a long
catch-up never gets the pod killed); ready only while it is VOTING, so the client Service
routes only to voting replicas and the PodDisruptionBudget counts only them as healthy. The
alternative rejected: an `exec` of `rlog status`, which started Python and a gRPC client in
the pod at every probe (156 ms of CPU each, measured).
"""

from __future__ import annotations

from typing import Any, Final

from rlog_operator import constants as c

Manifest = dict[str, Any]

# A probe's handler types: one at most. The StatefulSet is updated by a strategic merge patch
# (kube.apply_one), which keeps every key it is not told to delete: a template of release
# 0.1.0 (`exec` probes) patched with `grpc` ones would hold both, which the API refuses
# (found by e2e/operator/test_upgrade_release.py). The alternative rejected, server-side
# apply, removes only fields an earlier *apply* of the same manager set, not fields the
# operator created or patched before.
PROBE_HANDLERS: Final = ("exec", "httpGet", "tcpSocket", "grpc")


def only_handler(handler: Manifest) -> Manifest:
    """`handler` (one probe handler) with every other handler type null: deleted by a merge
    patch, ignored on create."""
    return {**dict.fromkeys(PROBE_HANDLERS), **handler}


def probes(health_port: int) -> dict[str, Manifest]:
    """startupProbe, livenessProbe and readinessProbe of a replica serving health on
    `health_port`."""
    alive = only_handler({"grpc": {"port": health_port}})
    return {
        "startupProbe": {
            **alive,
            "periodSeconds": 5,
            "timeoutSeconds": 10,
            "failureThreshold": 120,  # 10 minutes to open the store and serve
        },
        "livenessProbe": {
            **alive,
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 6,  # 3 minutes of not answering at all
        },
        "readinessProbe": {
            **only_handler({"grpc": {"port": health_port, "service": c.READY_SERVICE}}),
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 2,
            "successThreshold": 1,
        },
    }
