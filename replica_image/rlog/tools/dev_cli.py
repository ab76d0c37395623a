"""`rlog dev`: a local N-replica log (`DevCluster`, tools/dev.py) run from the command line,
printing where each replica listens and logs, the leader and how to reach the log, until
Ctrl-C or SIGTERM stops it (its data stays in the cluster dir).
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any

from rlog.arg_types import add_storage_engine_argument
from rlog.client.errors import RlogError
from rlog.config import ConfigError
from rlog.tools.dev import DevCluster

# Lanes by default (the operator gives every replica one): the clients' appends skip gRPC's
# cost per call. 100 keeps a lane clear of the replicas' own ports P+i on one host.
DEV_LANE_OFFSET = 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=3, help="1, 3, 5 or 7 (default 3)")
    parser.add_argument("--dir", metavar="DIR", help="cluster dir (default: a new one)")
    parser.add_argument("--base-port", type=int, metavar="P", help="replica i listens on P+i")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--distinct-hosts", action="store_true", help="bind replica i to 127.0.0.(i+1)"
    )
    parser.add_argument(
        "--auto-initialize",
        action="store_true",
        help="let the replicas initialize the log themselves instead of `rlog initialize`",
    )
    add_storage_engine_argument(parser, "each data dir")
    parser.add_argument("--election-timeout", type=float, metavar="SECONDS")
    parser.add_argument("--log-id", default="dev")
    parser.add_argument(
        "--metrics", action="store_true", help="serve Prometheus metrics on free ports"
    )
    parser.add_argument("--timeout", type=float, default=60.0, help="leader election wait")
    parser.add_argument(
        "--tls",
        action="store_true",
        help="mutual TLS and roles, with a throwaway CA and certificates in <dir>/tls",
    )
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="without --tls, let the replicas serve PLAINTEXT on a --host beyond loopback "
        "(rlog replica --insecure; they refuse to otherwise)",
    )
    parser.add_argument(
        "--write-lane-offset",
        type=int,
        default=DEV_LANE_OFFSET,
        metavar="N",
        help="give every replica a lane at its port + N for the leader's writes and the "
        f"clients' appends (rlog replica --write-lane-offset; default {DEV_LANE_OFFSET}, "
        "clear of the replicas' own ports P+i; 0: off)",
    )


def run(args: argparse.Namespace) -> int:
    if args.base_port is not None and not 0 < args.base_port < 65536 - args.replicas:
        raise ConfigError(f"--base-port {args.base_port} is out of range")
    if args.write_lane_offset < 0:
        raise ConfigError(f"--write-lane-offset {args.write_lane_offset} is negative")
    if 0 < args.write_lane_offset < args.replicas and not args.distinct_hosts:
        raise ConfigError(
            f"--write-lane-offset {args.write_lane_offset} puts replica 0's lane on replica "
            f"{args.write_lane_offset}'s port: give 0, at least {args.replicas}, or "
            "--distinct-hosts"
        )
    cluster = DevCluster(
        args.replicas,
        args.dir,
        host=args.host,
        base_port=args.base_port,
        distinct_hosts=args.distinct_hosts,
        initialize=not args.auto_initialize,
        auto_initialize=args.auto_initialize,
        log_id=args.log_id,
        storage_engine=args.storage_engine,
        election_timeout=args.election_timeout,
        metrics=args.metrics,
        tls=args.tls,
        write_lane_offset=args.write_lane_offset,
        replica_args=["--insecure"] if args.insecure and not args.tls else (),
    )
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        print(f"rlog dev: cluster dir {cluster.dir}", flush=True)
        cluster.start(wait=False)
        for i, address in enumerate(cluster.addresses):
            metrics = cluster.metrics_ports[i]
            extra = f"  metrics http://{cluster.host_of(i)}:{metrics}/metrics" if metrics else ""
            print(f"replica {i}: {address}  log {cluster.log_file(i)}{extra}", flush=True)
        try:
            leader = cluster.wait_for_leader(args.timeout)
        except RlogError:
            for i in range(cluster.replicas):
                tail = cluster.log_tail(i, 5)
                if tail:
                    print(f"--- replica {i} log tail:\n{tail}", file=sys.stderr)
            raise
        print(f"leader: replica {leader} ({cluster.addresses[leader]})", flush=True)
        if cluster.tls:
            tls = cluster.tls_dir
            print(
                f"mutual TLS and roles (certificates and roles in {tls}); as the writer:\n"
                f"  export RLOG_ENDPOINT={cluster.endpoint} RLOG_CA={tls}/ca.pem "
                f"RLOG_CERT={tls}/writer.pem RLOG_KEY={tls}/writer-key.pem\n"
                f"  (role append; truncate and epochs need role owner: {tls}/owner.pem)",
                flush=True,
            )
            print("try: rlog append hello && rlog read    (Ctrl-C stops the log)", flush=True)
        else:
            print(
                "PLAINTEXT, authorization off (local development; --tls secures the log)",
                flush=True,
            )
            print(
                f"try: rlog append --endpoint {cluster.endpoint} hello && "
                f"rlog read --endpoint {cluster.endpoint}    (Ctrl-C stops the log)",
                flush=True,
            )
        while not stop.is_set():
            for i in range(cluster.replicas):
                process = cluster.processes[i]
                if process is not None and process.poll() is not None:
                    print(
                        f"replica {i} exited with {process.returncode}; see {cluster.log_file(i)}",
                        file=sys.stderr,
                        flush=True,
                    )
                    cluster.processes[i] = None
            stop.wait(0.5)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        print("rlog dev: stopping the replicas", file=sys.stderr, flush=True)
        cluster.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        print(f"rlog dev: stopped; data kept in {cluster.dir}", file=sys.stderr, flush=True)
