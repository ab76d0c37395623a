"""`rlog_build_info`: which build a process runs, as a metric. A constant 1 with the build
in its labels (`component`: replica, operator or archiver; `version`; `peer_protocol`;
`python`), the convention of Prometheus's own `prometheus_build_info`: a dashboard counts
the versions in use during a rolling upgrade (`count by (version) (rlog_build_info)`), and
an alert can join on it."""

from __future__ import annotations

import platform

from prometheus_client import REGISTRY, CollectorRegistry, Info

from rlog import __version__


def register_build_info(
    component: str, peer_protocol: int, registry: CollectorRegistry = REGISTRY
) -> Info:
    """Register it in `registry`; `peer_protocol`: the caller's PROTOCOL
    (rlog.protocol.peer_version), given because this module sits below the protocol."""
    info = Info("rlog_build", "The build this process runs", registry=registry)
    info.info(
        {
            "component": component,
            "version": __version__,
            "peer_protocol": str(peer_protocol),
            "python": platform.python_version(),
        }
    )
    return info
