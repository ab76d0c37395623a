"""The operator's observe loop without Kubernetes, for the live monitoring test.

Polls the real replicas' status over gRPC (as the operator's `observe` timer does), runs the
operator's own pure `status.compute_status` over those answers (previous status carried
over, so `initialized` is sticky and DataLoss is detected as in the operator) and exports
the result through the operator's own `rlog_operator.metrics` on a metrics port. What it
fakes is only what Kubernetes would have said: every replica has a Running pod, ready when
its replica is VOTING, on revision `rev-1`; the StatefulSet's update revision is read from
a file (`--update-revision-file`, default `rev-1`), so a test can start a rolling update that
never progresses.

    python operator_observer.py --port P --namespace NS --name NAME --uid UID \\
        --endpoints H:P,H:P,H:P [--update-revision-file F]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlog.client import Client, status_to_dict
from rlog.client.errors import RlogError
from rlog_operator import metrics, observed
from rlog_operator import status as st

REVISION = "rev-1"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--uid", required=True)
    parser.add_argument("--endpoints", required=True)
    parser.add_argument("--update-revision-file", type=Path)
    parser.add_argument("--interval", type=float, default=0.3)
    args = parser.parse_args()

    endpoints = args.endpoints.split(",")
    body: dict[str, Any] = {
        "metadata": {
            "name": args.name,
            "namespace": args.namespace,
            "uid": args.uid,
            "generation": 1,
        },
        "spec": {"replicas": len(endpoints)},
    }
    names = [f"{args.name}-{i}" for i in range(len(endpoints))]
    clients = [Client(endpoint, timeout=0.5) for endpoint in endpoints]
    previous: dict[str, Any] = {}
    metrics.serve(args.port)
    while True:
        statuses: dict[str, Any] = {}
        for name, client in zip(names, clients, strict=True):
            try:
                statuses[name] = status_to_dict(client.status())
            except RlogError:
                statuses[name] = None
        pods: list[observed.PodInfo] = [
            observed.PodInfo(
                name=name,
                phase="Running",
                ready=observed.is_voting(statuses[name]),
                labels={"controller-revision-hash": REVISION},
            )
            for name in names
        ]
        update_revision = REVISION
        if args.update_revision_file is not None:
            with contextlib.suppress(OSError):
                update_revision = args.update_revision_file.read_text().strip() or REVISION
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        result = st.compute_status(body, pods, statuses, update_revision, previous, now)
        previous = {**previous, **result.status}
        metrics.RECONCILES.labels(handler="observe").inc()
        metrics.observe_status(args.namespace, args.name, result.status)
        time.sleep(args.interval)


if __name__ == "__main__":
    main()
