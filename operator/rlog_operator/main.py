"""Entry point of `rlog-operator`: runs kopf with the handlers of rlog_operator.handlers.

Importing this module stays cheap (kopf and the handlers are imported in main())."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, cast


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="rlog-operator",
        description="Runs the rlog operator (kopf) for ReplicatedLog resources.",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=None,
        help="watch only this namespace (repeatable); default: every namespace",
    )
    p.add_argument(
        "--liveness",
        default=os.environ.get("RLOG_OPERATOR_LIVENESS", "http://0.0.0.0:8081/healthz"),
        help="kopf's liveness endpoint (default %(default)s)",
    )
    p.add_argument("--verbose", action="store_true", help="debug logging")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import logging

    import kopf

    from rlog_operator import handlers  # noqa: F401  (registers the handlers)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    import socket

    kopf.run(
        # kopf's default identity asks getpass.getuser(), which fails for a uid without a
        # passwd entry (the image runs as 65532): name it after the pod instead.
        identity=cast(Any, f"rlog-operator@{socket.gethostname()}"),  # kopf's Identity NewType
        standalone=True,  # a single active operator: see rlog_operator.handlers
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness,
    )
