#!/usr/bin/env python3
"""A registry of workers kept the way the Mesos Registrar keeps its registry: one variable
(`registry`, a JSON list of worker names) in the log, changed by read-decide-store with the
version it was read at, by several processes at once. Each process admits its own workers
and removes some of them again; a store that lost the race (`None`) is decided again
against the newer registry. Within one process, concurrent changes are batched into one
append. At the end the registry must hold exactly the workers admitted and not removed.

    # a local log: `rlog dev --replicas 3` prints "replica i: H:P ..."
    python examples/worker_registry.py --endpoints 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002
    # a ReplicatedLog on Kubernetes, from a pod in the log's namespace (a log is mutual TLS
    # by default: the client certificate from a Secret, see docs/security.md); the replicas
    # by their pod names under the headless Service <log>-headless, which their certificates
    # carry (the client Service `orders:7000` works too)
    python examples/worker_registry.py --endpoints \
        orders-0.orders-headless:7000,orders-1.orders-headless:7000,orders-2.orders-headless:7000 \
        --ca /tls/ca.crt --cert /tls/tls.crt --key /tls/tls.key
    # or through a port-forward of its client Service (the replicas' certificates name
    # 127.0.0.1 for this)
    kubectl port-forward svc/orders 7000:7000 &
    python examples/worker_registry.py --endpoints 127.0.0.1:7000 --processes 3 --ca ca.crt ...

Options: --processes N (default 4), --workers W per process (default 10), --remove R of
them removed again (default 3), --strict (refuse a log whose state was lost), --cas (each
change as fetch + store with the version read, retried when refused, instead of an
operation decided inside the batch), and the client's security arguments (--ca, --cert,
--key, --token-file, --server-name, or the RLOG_* variables), --patience S (how long to
wait for a leader before giving up, default 30).

On a log with roles any writing role will do: role append stores; only compaction (after
10,000 mutations by default, more than this example makes) truncates, which needs role
owner (docs/security.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import sys
from dataclasses import dataclass

from rlog.client.errors import RlogError
from rlog.client.security import Credentials
from rlog.config import ConfigError
from rlog.state import AsyncState, Variable
from rlog.tools.client_args import add_security_arguments, credentials_of


def _decode(variable: Variable) -> list[str]:
    return list(json.loads(variable.value)) if variable.exists else []


async def change(state: AsyncState, admit: str | None, remove: str | None) -> int:
    """Admit and/or remove one worker with fetch + store (compare-and-set); returns how many
    tries it took (a store refused because the registry changed is decided again)."""
    tries = 0
    while True:
        tries += 1
        current = await state.fetch("registry")
        workers = set(_decode(current))
        if admit is not None:
            workers.add(admit)
        if remove is not None:
            workers.discard(remove)
        value = json.dumps(sorted(workers)).encode()
        if await state.store(Variable("registry", value, current.version)) is not None:
            return tries


async def operate(state: AsyncState, admit: str | None, remove: str | None) -> int:
    """The same change as an operation the batch applies to whatever the registry is when
    the batch is decided (the Registrar's way): never refused, so always one try."""

    def apply(current: Variable) -> bytes:
        workers = set(_decode(current))
        if admit is not None:
            workers.add(admit)
        if remove is not None:
            workers.discard(remove)
        return json.dumps(sorted(workers)).encode()

    await state.update("registry", apply)
    return 1


@dataclass(frozen=True)
class Connection:
    """How every process of the example reaches the log."""

    endpoints: str
    credentials: Credentials | None
    strict: bool = False
    patience: float = 30.0  # how long to wait out a log with no leader (or unreachable)

    def state(self) -> AsyncState:
        return AsyncState(
            self.endpoints,
            strict=self.strict,
            credentials=self.credentials,
            unavailable_patience=self.patience,
        )


async def agent(log: Connection, index: int, workers: int, remove: int, cas: bool) -> int:
    names = [f"p{index}-worker-{j}" for j in range(workers)]
    step = change if cas else operate
    async with log.state() as state:
        # Admit every worker at once: the changes share appends (Registrar batching).
        tries = await asyncio.gather(*(step(state, name, None) for name in names))
        tries += await asyncio.gather(*(step(state, None, name) for name in names[:remove]))
        print(
            f"process {index}: {len(tries)} changes in {state.appends} appends; "
            f"{sum(tries) - len(tries)} changes refused and tried again, "
            f"{state.conflicts} batches decided again after another process wrote first",
            flush=True,
        )
    return 0


def run_agent(log: Connection, index: int, workers: int, remove: int, cas: bool) -> None:
    try:
        sys.exit(asyncio.run(agent(log, index, workers, remove, cas)))
    except RlogError as exc:
        print(f"process {index}: {exc}", file=sys.stderr)
        sys.exit(1)


async def final(log: Connection) -> list[str]:
    async with log.state() as state:
        return _decode(await state.fetch("registry"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoints", required=True, metavar="H:P[,H:P...]")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--workers", type=int, default=10)
    parser.add_argument("--remove", type=int, default=3)
    parser.add_argument("--strict", action="store_true")
    parser.add_argument(
        "--cas", action="store_true", help="fetch + store with versions instead of operations"
    )
    parser.add_argument(
        "--patience", type=float, default=30.0, metavar="S",
        help="seconds to wait for a leader before giving up (default 30)",
    )  # fmt: skip
    add_security_arguments(parser)
    args = parser.parse_args()
    try:
        log = Connection(args.endpoints, credentials_of(args), args.strict, args.patience)
        before = set(asyncio.run(final(log)))
    except (ConfigError, RlogError) as exc:
        print(f"worker_registry: {exc}", file=sys.stderr)
        return 1
    # Spawned, not forked: this process has used gRPC already, and gRPC does not support a
    # forked child going on with the parent's gRPC state (it may hang or die in the child).
    spawn = multiprocessing.get_context("spawn")
    processes = [
        spawn.Process(target=run_agent, args=(log, i, args.workers, args.remove, args.cas))
        for i in range(args.processes)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join()
    if any(p.exitcode != 0 for p in processes):
        print("a process failed", file=sys.stderr)
        return 1
    expected = before | {
        f"p{i}-worker-{j}" for i in range(args.processes) for j in range(args.remove, args.workers)
    }
    expected -= {f"p{i}-worker-{j}" for i in range(args.processes) for j in range(args.remove)}
    registry = set(asyncio.run(final(log)))
    print(f"registry: {len(registry)} workers")
    if registry != expected:
        print(
            f"MISMATCH: missing {sorted(expected - registry)}, extra {sorted(registry - expected)}",
            file=sys.stderr,
        )
        return 1
    print("registry holds exactly the workers admitted and not removed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
