"""Entry point of `rlog-operator`: runs kopf with the handlers of rlog_operator.handlers.

Importing this module stays cheap (kopf and the handlers are imported in main())."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, cast

from rlog import __version__
from rlog.log_format import LOG_FORMATS, default_format
from rlog.log_format import configure as configure_logs


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
    p.add_argument(
        "--lease",
        default=os.environ.get("RLOG_OPERATOR_LEASE", ""),
        metavar="NAME",
        help="act only while holding this Lease in the operator's namespace "
        "(RLOG_OPERATOR_NAMESPACE); default: act at once (a single operator)",
    )
    p.add_argument("--verbose", action="store_true", help="debug logging")
    p.add_argument(
        "--log-format",
        choices=LOG_FORMATS,
        default=default_format(),
        help="text lines, or one JSON object per line; the replicas it runs log the same "
        "way (default: RLOG_LOG_FORMAT, else text)",
    )
    p.add_argument("--version", action="version", version=f"rlog-operator {__version__}")
    return p.parse_args(argv)


def liveness_port(url: str) -> int:
    """The port of kopf's liveness endpoint URL (http://host:port/path)."""
    from urllib.parse import urlsplit

    return urlsplit(url).port or 80


def _standby_health(port: int) -> Any:
    """Answer the liveness probe while standing by (kopf serves it once it runs)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Healthy(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"standing by\n")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("0.0.0.0", port), Healthy)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _hold_lease(name: str) -> Any:
    """Stand by until this pod holds the Lease; then keep it, exiting if it is lost (the
    pod restarts and stands by again). Returns the elector (to release it on exit)."""
    import logging
    import socket

    from rlog_operator.kube import load_kube_config
    from rlog_operator.lease import LeaseElector

    load_kube_config()
    namespace = os.environ.get("RLOG_OPERATOR_NAMESPACE", "default")
    identity = os.environ.get("POD_NAME") or socket.gethostname()
    elector = LeaseElector(name, namespace, identity)
    elector.acquire()

    def lost(why: str) -> None:
        logging.getLogger(__name__).error("lost the Lease (%s): exiting", why)
        os._exit(3)  # stop acting at once; the successor resumes from the status

    elector.keep(lost)
    return elector


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import logging

    try:
        configure_logs(logging.DEBUG if args.verbose else logging.INFO, args.log_format)
    except ValueError as exc:  # RLOG_LOG_FORMAT, the default argparse does not check
        sys.exit(f"rlog-operator: error: {exc} (--log-format or RLOG_LOG_FORMAT)")
    import kopf

    try:
        from rlog_operator import handlers  # noqa: F401  (registers the handlers)
    except ValueError as exc:  # the deployment's settings (OperatorConfig.from_env)
        sys.exit(f"rlog-operator: error: {exc}")
    # Which build runs: the first line of every operator log (docs/upgrades.md, "Versions").
    logging.getLogger("rlog_operator").info("rlog-operator %s starting", __version__)
    import socket

    elector = None
    if args.lease:
        health = _standby_health(liveness_port(args.liveness))
        elector = _hold_lease(args.lease)
        health.shutdown()
        health.server_close()  # kopf binds the same port
    try:
        _run_kopf(kopf, args, socket.gethostname())
    finally:
        if elector is not None:
            elector.release()


def _run_kopf(kopf: Any, args: argparse.Namespace, host: str) -> None:
    kopf.run(
        # kopf's default identity asks getpass.getuser(), which fails for a uid without a
        # passwd entry (the image runs as 65532): name it after the pod instead.
        identity=cast(Any, f"rlog-operator@{host}"),  # kopf's Identity NewType
        standalone=True,  # one acting operator (the Lease holder): see rlog_operator.election
        clusterwide=not args.namespace,
        namespaces=args.namespace or (),
        liveness_endpoint=args.liveness,
    )
