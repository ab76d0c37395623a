"""One run: a fresh cluster, concurrent clients, the nemesis, healing, then the verdicts."""

from __future__ import annotations

import json
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from jepsen import checks, linearizability
from jepsen.history import FAIL, INFO, OK, History, Op, now
from jepsen.nemesis import Nemesis
from jepsen.network import Netns
from rlog.client import Client
from rlog.client.errors import OutcomeUnknown, RlogError
from rlog.tools.dev import DevCluster

FINAL_PROCESS = 1000  # the read after healing


@dataclass
class RunConfig:
    seed: int
    seconds: float
    nemesis: list[str]
    out: Path
    clients: int = 3  # appending and reading; client i uses replica i mod N
    readers: int = 3  # reading only; reader i uses replica i mod N
    replicas: int = 3
    append_ratio: float = 0.5
    network: Netns | None = None
    election_timeout: float | None = None
    read_timeout: float = 3.0  # a read stuck at a paused or cut-off replica gives up
    append_timeout: float = 4.0


@dataclass
class RunResult:
    seed: int
    out: Path
    operations: int = 0
    faults: int = 0
    verdict: linearizability.Verdict | None = None
    problems: dict[str, list[str]] = field(default_factory=dict)
    stale_reads: int = 0
    first_stale_read_s: float | None = None  # since the run began
    first_stale_after_fault_s: float | None = None  # since the fault in force began
    error: str = ""

    @property
    def violation(self) -> bool:
        porcupine = self.verdict is not None and self.verdict.status == linearizability.VIOLATION
        return porcupine or any(self.problems.values())

    @property
    def ok(self) -> bool:
        return (
            not self.error
            and self.verdict is not None
            and self.verdict.linearizable
            and not (any(self.problems.values()))
        )


def _client_loop(
    process: int,
    endpoint: str,
    history: History,
    rng: random.Random,
    stop_at: float,
    append_ratio: float,
    config: RunConfig,
) -> None:
    """One client: one operation at a time until `stop_at`, through one endpoint."""
    client = Client(
        [endpoint],
        timeout=2.0,
        append_timeout=config.append_timeout,
        read_timeout=config.read_timeout,
    )
    counter = 0
    last_seen: int | None = None  # the highest position this client saw
    try:
        while time.monotonic() < stop_at:
            if rng.random() < append_ratio:
                size = 1 if rng.random() < 0.6 else rng.randint(2, 4)
                values = [f"{process}.{counter + k}" for k in range(size)]
                counter += size
                op = Op(process, "append", now(), values=values, endpoint=endpoint)
                try:
                    positions = client.append(values)
                except OutcomeUnknown as error:
                    op.result, op.error = INFO, f"{type(error).__name__}: {error}"
                except RlogError as error:
                    op.result, op.error = FAIL, f"{type(error).__name__}: {error}"
                except Exception as error:  # unexpected: it may have reached a server
                    op.result, op.error = INFO, f"{type(error).__name__}: {error}"
                else:
                    op.result, op.position, op.positions = OK, positions[0], list(positions)
                    last_seen = max(last_seen or 0, positions[-1])
            else:
                # Mostly the recent end of the log as this client last saw it (histories
                # stay small), sometimes all of it.
                from_ = None if last_seen is None or rng.random() < 0.05 else max(0, last_seen - 16)
                op = Op(process, "read", now(), endpoint=endpoint, from_=from_)
                try:
                    entries = [(e.position, e.text) for e in client.read(from_=from_)]
                except Exception as error:  # a read that failed did not happen
                    op.result, op.error = FAIL, f"{type(error).__name__}: {error}"
                else:
                    op.result, op.entries = OK, entries
                    if entries:
                        last_seen = max(last_seen or 0, entries[-1][0])
            op.complete = now()
            history.add(op)
            # A little slower after a failure: a killed replica refuses at once.
            time.sleep(rng.uniform(0.0, 0.05) + (0.2 if op.result == FAIL else 0.0))
    finally:
        client.close()


def _final_read(cluster: DevCluster, leader: int, history: History) -> list[tuple[int, str]] | None:
    """A non-stale read through the leader after healing, recorded like any other."""
    endpoint = cluster.addresses[leader]
    for _ in range(5):
        op = Op(FINAL_PROCESS, "read", now(), endpoint=endpoint)
        try:
            with Client([endpoint], timeout=5.0, read_timeout=10.0) as client:
                entries = [(e.position, e.text) for e in client.read()]
        except RlogError as error:
            op.result, op.error, op.complete = FAIL, str(error), now()
            history.add(op)
            time.sleep(1.0)
            continue
        op.result, op.entries, op.complete = OK, entries, now()
        history.add(op)
        return entries
    return None


def _replica_logs(cluster: DevCluster) -> list[list[tuple[int, str]] | None]:
    """Every replica's own learned entries (stale reads), after catch-up."""
    logs: list[list[tuple[int, str]] | None] = []
    for address in cluster.addresses:
        try:
            with Client([address], timeout=5.0, read_timeout=10.0) as client:
                logs.append([(e.position, e.text) for e in client.read(stale=True)])
        except RlogError:
            logs.append(None)
    return logs


def run_once(config: RunConfig, log: bool = True) -> RunResult:
    out = config.out
    out.mkdir(parents=True, exist_ok=True)
    result = RunResult(config.seed, out)
    rng = random.Random(config.seed)
    network = config.network
    cluster = DevCluster(
        config.replicas,
        out / "cluster",
        election_timeout=config.election_timeout,
        python=(str(network.python_wrapper(out, sys.executable)) if network else sys.executable),
    )
    if network is not None:
        network.heal()
        cluster.addresses = network.endpoints()
    history = History()
    nemesis = Nemesis(cluster, config.nemesis, random.Random(rng.random()), history, network)
    final: list[tuple[int, str]] | None = None
    replica_logs: list[list[tuple[int, str]] | None] = []

    def say(text: str) -> None:
        if log:
            print(f"  [seed {config.seed}] {text}", flush=True)

    try:
        cluster.start(timeout=60)
        history.start = now()
        stop_at = time.monotonic() + config.seconds
        # Every replica gets writers and readers of its own: a replica cut off by the
        # nemesis keeps being read while the others take appends.
        roles = [(p, p, config.append_ratio) for p in range(config.clients)] + [
            (config.clients + r, r, 0.0) for r in range(config.readers)
        ]
        threads = [
            threading.Thread(
                target=_client_loop,
                args=(
                    p,
                    cluster.addresses[slot % config.replicas],
                    history,
                    random.Random(rng.random()),
                    stop_at,
                    ratio,
                    config,
                ),
                name=f"client-{p}",
            )
            for p, slot, ratio in roles
        ]
        for thread in threads:
            thread.start()
        if config.nemesis:
            # In this thread, which outlives the run: a replica the nemesis restarts dies
            # with the thread that started it (DevCluster's die-with-parent signal).
            nemesis.run(stop_at - 0.5)
        for thread in threads:
            thread.join()
        nemesis.heal()
        say(f"{len(history.ops)} operations, {len(nemesis.faults)} faults; healing")
        leader = cluster.wait_for_leader(60)
        try:
            cluster.wait_for(
                lambda sts: all(s is not None for s in sts) and len({s.learned for s in sts}) == 1,
                timeout=10,
                what="every replica caught up",
            )
        except RlogError as error:  # the direct checks take a lagging log as a prefix
            say(str(error).splitlines()[0])
        final = _final_read(cluster, leader, history)
        replica_logs = _replica_logs(cluster)
    except Exception as error:  # still judge what was recorded
        result.error = f"{type(error).__name__}: {error}"
        say(f"run error: {result.error}")
    finally:
        nemesis.stop()
        nemesis.heal()
        cluster.stop()

    ops = history.snapshot()
    history.write(out / "history.jsonl")
    nemesis.write(out / "nemesis.jsonl")
    result.faults = len(nemesis.faults)
    result.problems = checks.all_problems(ops, final, replica_logs)
    stale = checks.stale_reads(ops)
    result.stale_reads = len(stale)
    if stale:
        first = min(stale, key=lambda s: s.read.invoke)
        result.first_stale_read_s = (first.read.invoke - history.start) / 1e9
        started = [f.start for f in nemesis.faults if f.start <= first.read.invoke]
        if started:
            result.first_stale_after_fault_s = (first.read.invoke - max(started)) / 1e9
    result.verdict = linearizability.check(out / "history.jsonl", visualize=out / "violation.html")
    result.operations = result.verdict.operations
    (out / "checks.json").write_text(
        json.dumps(
            {
                "verdict": result.verdict.verdict,
                "check_seconds": result.verdict.seconds,
                "problems": result.problems,
                "first_stale_read_s": result.first_stale_read_s,
                "first_stale_after_fault_s": result.first_stale_after_fault_s,
                "error": result.error,
            },
            indent=1,
        )
        + "\n"
    )
    return result
