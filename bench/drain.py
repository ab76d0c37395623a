"""What stopping the leader costs a continuous writer, with and without the step-down drain.

A real 3-replica log (`rlog dev` processes); one writer appends one small value at a time
through every endpoint (the blocking client, exactly-once sessions, as an application does)
and counts the appends that failed. Mid-run the leader gets SIGTERM, as the kubelet sends it
on a drain or an eviction: with `--drain-timeout` it steps down first and serves until
another replica leads (rlog.runtime.process.drain); with 0 it stops at once. The writer goes
on until another replica has led for a while; then every acknowledged append is read back.

    python bench/drain.py [--rounds 3] [--drain-timeout 10]

prints one JSON line per run (interleaved A/B: drain, no drain, drain, ...).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rlog.client import Client
from rlog.client.errors import RlogError
from rlog.tools.dev import DevCluster

AFTER = 3.0  # seconds the writer goes on once another replica leads


@dataclass
class DrainRun:
    drain_timeout: float
    acked: int = 0
    failed: int = 0
    errors: dict[str, int] = field(default_factory=dict)  # failure class -> count
    first: dict[str, str] = field(default_factory=dict)  # failure class -> its first message
    stop_seconds: float = 0.0  # SIGTERM to the process's exit
    drained: bool = False  # the old leader saw another replica lead before it exited
    missing: int = 0  # acknowledged appends not read back (must be 0)


def run(directory: Path, drain_timeout: float, before: float = 2.0) -> DrainRun:
    """One run: start, write, SIGTERM the leader, write on, check every acked append."""
    result = DrainRun(drain_timeout)
    cluster = DevCluster(3, directory, replica_args=["--drain-timeout", str(drain_timeout)])
    with cluster:  # started (and a leader elected) on entry
        leader = cluster.wait_for_leader()
        acked: list[tuple[int, bytes]] = []
        stop = threading.Event()

        def write() -> None:
            with Client(cluster.addresses, timeout=5.0) as client:
                n = 0
                while not stop.is_set():
                    value = f"v{n}".encode()
                    n += 1
                    try:
                        (position,) = client.append([value])
                        acked.append((position, value))
                    except RlogError as e:
                        result.failed += 1
                        kind = type(e).__name__
                        result.errors[kind] = result.errors.get(kind, 0) + 1
                        result.first.setdefault(kind, str(e)[:200])
                        time.sleep(0.01)

        writer = threading.Thread(target=write)
        writer.start()
        time.sleep(before)
        started = time.monotonic()
        cluster.kill(leader, signal.SIGTERM, wait=True)
        result.stop_seconds = round(time.monotonic() - started, 2)
        cluster.wait_for_leader(exclude=[leader])
        time.sleep(AFTER)
        stop.set()
        writer.join()
        result.acked = len(acked)
        result.drained = "leads now: stopping" in cluster.log_file(leader).read_text()
        with Client([a for i, a in enumerate(cluster.addresses) if i != leader]) as reader:
            stored = {e.position: e.value for e in reader.read(from_=acked[0][0] if acked else 1)}
        result.missing = sum(1 for position, value in acked if stored.get(position) != value)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--drain-timeout", type=float, default=10.0)
    args = p.parse_args(argv)
    for _ in range(args.rounds):
        for timeout in (args.drain_timeout, 0.0):
            with tempfile.TemporaryDirectory(prefix="rlog-drain-") as tmp:
                print(json.dumps(asdict(run(Path(tmp), timeout))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
