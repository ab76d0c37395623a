"""What several bench scripts start the same way.

- `serve`: a bare grpc.aio server with generic method handlers on a loopback port, which
  prints "ready" once it listens (the parent reads that line before it measures) and runs
  until killed (`grpc_rtt.py`, `append_floor.py`);
- `wrapped_cluster`: a 3-replica `rlog dev` log whose replicas are started through a bench
  script (`SCRIPT --as-replica <rlog replica arguments>`), so the script can install its
  probes or counters in the replica process before rlog starts (`latency_budget.py`,
  `loop_counts.py`). The replicas take rlog from `--tree`'s checkout;
- `add_batched_arguments` / `run_batched`: one `rlog bench` batched run (the kit's shape) as
  a subprocess, its JSON result (`cpu_split.py`, `round_split.py`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc


async def serve(
    port: int, service: str, methods: dict[str, Any], options: list[tuple[str, Any]]
) -> None:
    """Serve `methods` (name -> grpc.*_rpc_method_handler) as `service` until killed."""
    server = grpc.aio.server(options=options)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    print("ready", flush=True)
    await server.wait_for_termination()


def tree_env(tree: Path) -> dict[str, str]:
    """This process's environment with `tree`'s rlog first on PYTHONPATH."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree.resolve() / "replica_image"), *filter(None, [env.get("PYTHONPATH")])]
    )
    return env


def wrapped_cluster(
    script: str,
    directory: Path,
    env_of: Callable[[int], dict[str, str]],
    write_lane_offset: int = 0,
    tls: bool = False,
) -> Any:
    """A 3-replica DevCluster (not started: use it as a context manager) whose replica `i`
    runs `python SCRIPT --as-replica ...` with the environment `env_of(i)` (and write lanes at
    port + `write_lane_offset` when above 0)."""
    from rlog.tools.dev import DevCluster

    class WrappedCluster(DevCluster):
        def command(self, i: int) -> list[str]:
            cmd = super().command(i)
            at = cmd.index("-m")  # [python, -m, rlog.tools.cli, replica, ...]
            return [*cmd[:at], str(Path(script).resolve()), "--as-replica", *cmd[at + 2 :]]

        def start_replica(self, i: int) -> None:
            self.env = env_of(i)
            super().start_replica(i)

    return WrappedCluster(3, directory, write_lane_offset=write_lane_offset, tls=tls)


def add_batched_arguments(parser: argparse.ArgumentParser, size: int, seconds: float) -> None:
    """The batched run's shape: --size (bytes per value), --seconds, --writers, --batch."""
    parser.add_argument("--size", type=int, default=size, help="bytes per value")
    parser.add_argument("--seconds", type=float, default=seconds)
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64, help="values per append")


def run_batched(endpoint: str, args: argparse.Namespace, extra: Sequence[str] = ()) -> Any:
    """`rlog bench --mode concurrent` against `endpoint` in the shape of `args`
    (add_batched_arguments), as a child process; its JSON result."""
    bench = ["bench", "--endpoint", endpoint, "--json", *extra]
    bench += ["--size", str(args.size), "--mode", "concurrent"]
    bench += ["--concurrency", str(args.writers), "--batch", str(args.batch)]
    bench += ["--duration", str(args.seconds), "--warmup", "20"]
    out = subprocess.run(
        [sys.executable, "-m", "rlog.tools.cli", *bench], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out)
