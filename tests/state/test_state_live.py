"""Replicated state (rlog.state) on a real 3-replica log: writers in several processes with
random conflicts, a writer SIGKILLed mid-batch, the leader SIGKILLed during stores, recovery
after a restart of every replica and after compaction, strict mode, bad entries.

The model check of no lost update: every writer increments counters with fetch + store, so
in the log each counter's values must run 1, 2, 3, ... with no value twice (two stores
decided against the same version would write the same value), versions must grow, every
acknowledged store must be in the log as acknowledged, and the final state must be the last
store of each counter."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rlog.client import AsyncClient, Client
from rlog.state import (
    AsyncState,
    CorruptEntry,
    State,
    StateLost,
    UnknownFormat,
    Variable,
)
from rlog.state.format import FORMAT_VERSION, Diff, OpKind, decode, encode_diff
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

WORKER = Path(__file__).with_name("state_worker.py")
Acked = dict[str, object]


@pytest.fixture
def cluster(tmp_path):
    with DevCluster(3, tmp_path, distinct_hosts=True, election_timeout=0.5) as c:
        c.wait_for_leader()
        yield c


def joined(cluster: DevCluster) -> str:
    return ",".join(cluster.endpoints)


def log_sets(endpoints: str) -> list[tuple[int, str, int, int]]:
    """Every SET in the log, in log order: (position, name, version, value)."""
    sets = []
    with Client(endpoints) as client:
        for _ in range(100):  # a leader first: the read is a linearizable one
            if client.status().leader:
                break
            time.sleep(0.1)
        for entry in client.read():
            decoded = decode(entry.value, entry.position)
            if isinstance(decoded, Diff):
                for op in decoded.ops:
                    assert op.kind == OpKind.SET
                    sets.append((entry.position, op.name, op.version, counter_of(op.value)))
    return sets


def counter_of(value: bytes) -> int:
    """A counter's value: "N", or "N/tag" (a tag makes every stored value unique)."""
    return int(value.split(b"/")[0] or b"0")


def check_no_lost_update(
    sets: list[tuple[int, str, int, int]], acked: list[Acked], final: dict[str, Variable]
) -> None:
    by_name: dict[str, list[tuple[int, int]]] = {}
    for _, name, version, value in sets:
        by_name.setdefault(name, []).append((version, value))
    for name, history in by_name.items():
        values = [value for _, value in history]
        assert values == list(range(1, len(values) + 1)), f"{name}: lost update in {values}"
        versions = [version for version, _ in history]
        assert versions == sorted(set(versions)), f"{name}: versions do not grow: {versions}"
        assert final[name].version == versions[-1]
        assert counter_of(final[name].value) == values[-1]
    in_log = {(name, version): value for _, name, version, value in sets}
    for record in acked:
        key = (str(record["name"]), int(record["version"]))  # type: ignore[call-overload]
        assert in_log.get(key) == record["value"], f"acknowledged store {record} not in the log"


def start_worker(endpoints: str, *args: str) -> subprocess.Popen[str]:
    env = dict(os.environ)
    return subprocess.Popen(
        [sys.executable, str(WORKER), endpoints, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def acked_lines(output: str) -> list[Acked]:
    return [json.loads(line) for line in output.splitlines() if line.strip()]


def final_state(endpoints: str) -> dict[str, Variable]:
    with State(endpoints) as state:
        return state.variables()


def test_writers_in_four_processes_lose_no_update(cluster):
    endpoints = joined(cluster)
    workers = [
        start_worker(
            endpoints, "--names", "3", "--ops", "40", "--coroutines", "3", "--seed", str(i)
        )
        for i in range(4)
    ]
    acked: list[Acked] = []
    for worker in workers:
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
        acked += acked_lines(out)
    sets = log_sets(endpoints)
    # Four processes on three counters: there were conflicts, and some stores won.
    assert len(acked) == len(sets) > 0
    assert len(acked) < 4 * 3 * 40
    check_no_lost_update(sets, acked, final_state(endpoints))


def test_writer_killed_mid_batch_leaves_a_readable_state(cluster):
    endpoints = joined(cluster)
    victim = start_worker(endpoints, "--names", "2", "--ops", "0", "--coroutines", "16")
    survivor = start_worker(endpoints, "--names", "2", "--ops", "60", "--coroutines", "2")
    # Kill the batching writer while its appends are in flight.
    assert victim.stdout is not None
    for _ in range(30):
        victim.stdout.readline()
    victim.send_signal(signal.SIGKILL)
    victim_out, _ = victim.communicate(timeout=30)
    survivor_out, survivor_err = survivor.communicate(timeout=120)
    assert survivor.returncode == 0, survivor_err
    acked = acked_lines(survivor_out)
    assert acked
    # The victim's unread output lines are acknowledged stores too.
    acked += acked_lines(victim_out)
    check_no_lost_update(log_sets(endpoints), acked, final_state(endpoints))


async def _increment_until(
    state: AsyncState,
    names: list[str],
    stop: asyncio.Event,
    acked: list[Acked],
    process: int,
    history: list[dict[str, object]],
) -> None:
    """Increment counters until `stop`; every fetch and store goes into `history` (the
    registers model of the linearizability checker)."""
    rng = random.Random(process)
    sequence = 0
    while not stop.is_set():
        name = rng.choice(names)
        invoke = time.monotonic_ns()
        try:
            current = await state.fetch(name)
        except Exception as error:  # no quorum for long: the fetch did nothing
            history.append(_op(process, "fetch", name, invoke, "fail", error=str(error)))
            await asyncio.sleep(0.1)
            continue
        history.append(
            _op(
                process,
                "fetch",
                name,
                invoke,
                "ok",
                version=current.version,
                value=current.value.decode(),
            )
        )
        sequence += 1
        value = f"{counter_of(current.value) + 1}/{process}-{sequence}"
        invoke = time.monotonic_ns()
        try:
            stored = await state.store(Variable(name, value.encode(), current.version))
        except Exception as error:  # an outcome unknown after the retries
            history.append(
                _op(
                    process,
                    "store",
                    name,
                    invoke,
                    "info",
                    expect=current.version,
                    value=value,
                    error=str(error),
                )
            )
            await asyncio.sleep(0.1)
            continue
        history.append(
            _op(
                process,
                "store",
                name,
                invoke,
                "ok",
                expect=current.version,
                value=value,
                stored=stored is not None,
                **({"version": stored.version} if stored is not None else {}),
            )
        )
        if stored is not None:
            acked.append(
                {"name": name, "version": stored.version, "value": counter_of(stored.value)}
            )


def _op(
    process: int, f: str, name: str, invoke: int, result: str, **fields: object
) -> dict[str, object]:
    return {
        "process": process,
        "f": f,
        "name": name,
        "invoke": invoke,
        "complete": time.monotonic_ns(),
        "result": result,
        **fields,
    }


def test_leader_killed_during_stores(cluster, tmp_path):
    endpoints = joined(cluster)
    names = ["a", "b"]
    acked: list[Acked] = []
    history: list[dict[str, object]] = []

    stop = threading.Event()

    async def writers() -> None:
        states = [AsyncState(AsyncClient(endpoints, append_timeout=20)) for _ in range(3)]
        halt = asyncio.Event()
        tasks = [
            asyncio.create_task(_increment_until(s, names, halt, acked, 2 * i + k, history))
            for i, s in enumerate(states)
            for k in range(2)
        ]
        await asyncio.to_thread(stop.wait)
        halt.set()
        await asyncio.gather(*tasks)
        for s in states:
            await s.close()
            await s.client.close()

    # The writers run on a thread of their own; this thread kills and restarts replicas:
    # a replica dies with the thread that started it (PR_SET_PDEATHSIG), so never start one
    # from a short-lived worker thread.
    thread = threading.Thread(target=asyncio.run, args=(writers(),))
    thread.start()
    try:
        for _ in range(2):
            time.sleep(1.0)
            leader = cluster.wait_for_leader()
            before = len(acked)
            cluster.kill(leader, signal.SIGKILL)
            time.sleep(1.5)
            cluster.start_replica(leader)
            cluster.wait_for_leader()
            for _ in range(300):  # progress after the restart, for up to 30 s
                if len(acked) > before + 5:
                    break
                time.sleep(0.1)
    finally:
        stop.set()
        thread.join()
    cluster.wait_for_leader()
    assert len(acked) > 10
    check_no_lost_update(log_sets(endpoints), acked, final_state(endpoints))
    # The fetches and stores as registers, judged by Porcupine.
    from jepsen import linearizability

    path = tmp_path / "registers.jsonl"
    path.write_text("".join(json.dumps(op) + "\n" for op in history))
    verdict = linearizability.check(path, model="registers", timeout_s=60)
    assert verdict.linearizable, verdict.verdict
    assert verdict.operations == len([op for op in history if op["result"] != "fail"])


def test_recovery_after_compaction_and_a_restart_of_every_replica(cluster):
    endpoints = joined(cluster)
    lagging = State(endpoints)  # reads once now, then not until after the compactions
    assert lagging.names() == []
    with State(endpoints, snapshot_every=25) as state:
        expected: dict[str, bytes] = {}
        for i in range(120):
            name = f"worker-{i % 30}"
            current = state.fetch(name)
            value = f"{name}@{i}".encode()
            assert state.store(Variable(name, value, current.version)) is not None
            expected[name] = value
        assert state.expunge(state.fetch("worker-0"))
        del expected["worker-0"]
        assert state.asynchronous.snapshots_written >= 3
    with Client(endpoints) as client:
        begin = client.status().begin
    assert begin > 0, "compaction truncated nothing"
    # The lagging reader's position is truncated: it restarts from the newest snapshot.
    assert lagging.asynchronous.position < begin
    assert {n: v.value for n, v in lagging.variables().items()} == expected
    assert lagging.asynchronous.recoveries == 2
    lagging.close()
    for i in range(3):
        cluster.stop_replica(i)
    for i in range(3):
        cluster.start_replica(i)
    cluster.wait_for_leader()
    with State(endpoints, strict=True) as recovered:
        assert recovered.initialized
        # Recovery started at a snapshot, not at the (truncated) beginning.
        assert recovered.asynchronous.snapshot_position >= begin
        assert {n: v.value for n, v in recovered.variables().items()} == expected
        assert recovered.fetch("worker-0").version == 0


def test_strict_mode_refuses_an_emptied_log(cluster):
    endpoints = joined(cluster)
    with State(endpoints) as state:
        assert not state.initialized
        state.store(Variable("registry", b"3 workers", 0))
        assert state.initialized
    with Client(endpoints) as client:
        end = client.status().end
        client.truncate(end + 1)
    with pytest.raises(StateLost, match="strict mode: the log holds no state"):
        State(endpoints, strict=True)
    with State(endpoints) as lenient:
        assert not lenient.initialized
        assert lenient.names() == []


def test_unknown_format_and_corrupted_entries_are_refused(cluster):
    endpoints = joined(cluster)
    with State(endpoints) as state:
        state.store(Variable("x", b"1", 0))
    with Client(endpoints) as client:
        corrupted = bytearray(encode_diff(Diff(-1, b"n" * 16, ())))
        corrupted[-1] ^= 1  # one bit of the body: the checksum no longer matches
        (corrupt_at,) = client.append([bytes(corrupted)])
    with pytest.raises(CorruptEntry, match=f"position {corrupt_at} is corrupted"):
        State(endpoints)
    with Client(endpoints) as client:
        client.truncate(corrupt_at + 1)
        (foreign_at,) = client.append([bytes([FORMAT_VERSION + 6]) + b"from the future"])
    with pytest.raises(UnknownFormat, match=f"position {foreign_at} has state format 7"):
        State(endpoints)


def test_the_state_command_line(cluster, capsys):
    from cli_runs import RLOG

    from rlog.tools.cli import main

    endpoints = joined(cluster)

    def run(*args: str) -> tuple[int, str, str]:
        code = main(["state", *args, "-e", endpoints])
        captured = capsys.readouterr()
        return code, captured.out, captured.err

    def ok(*args: str) -> str:
        code, out, err = run(*args)
        assert code == 0, err
        return out

    assert ok("get", "leader") == "0\t\n"
    first = int(ok("set", "leader", "node-1", "--if-version", "0"))
    assert ok("get", "leader") == f"{first}\tnode-1\n"
    code, _, err = run("set", "leader", "node-2", "--if-version", "0")
    assert code == 1
    assert err == f"rlog: error: leader is not at version 0 (it is at {first}): nothing stored\n"
    second = int(ok("set", "leader", "node-2"))  # no condition: against the newest version
    assert second > first
    ok("set", "workers", "AAE=", "--base64")
    listed = [json.loads(line) for line in ok("list", "--json").splitlines()]
    assert [(v["name"], v["value"]) for v in listed] == [
        ("leader", "bm9kZS0y"),
        ("workers", "AAE="),
    ]
    assert json.loads(ok("compact", "--json"))["snapshot"] > 0
    code, _, err = run("get")
    assert (code, err) == (2, "rlog state: error: state get needs a NAME\n")
    # watch follows the log until killed: a real process.
    watcher = subprocess.Popen(
        [RLOG, "state", "watch", "leader", "--json", "-e", endpoints],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watcher.stdout is not None
        assert json.loads(watcher.stdout.readline())["version"] == second
        third = int(ok("set", "leader", "node-3"))
        update = json.loads(watcher.stdout.readline())
        assert (update["version"], update["value"]) == (third, "bm9kZS0z")
    finally:
        watcher.kill()
        watcher.communicate()


def test_the_worker_registry_example(cluster):
    example = Path(__file__).parents[2] / "examples" / "worker_registry.py"
    result = subprocess.run(
        [sys.executable, str(example), "--endpoints", joined(cluster), "--processes", "3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "registry holds exactly the workers admitted and not removed" in result.stdout
    with State(joined(cluster)) as state:
        registry = json.loads(state.fetch("registry").value)
    assert len(registry) == 3 * (10 - 3)


def test_updates_whose_values_outgrow_one_entry_are_split_into_batches(cluster):
    """250 concurrent `update`s, each setting one of four variables to a 20 kB value: one
    batch of them would be a 5 MB entry, over the replicas' 4 MiB entry limit (the batch's
    size is known only once the functions ran). Every update succeeds, no state entry is
    over MAX_BATCH_BYTES, and the final values are the last update of each variable."""
    from rlog.state.store import MAX_BATCH_BYTES

    def setter(i: int):
        return lambda current: b"%d:" % i + b"x" * 20_000

    async def scenario() -> tuple[list[Variable], int]:
        async with AsyncState(joined(cluster)) as state:
            done = await asyncio.gather(*(state.update(f"v{i % 4}", setter(i)) for i in range(250)))
            return list(done), state.appends

    done, appends = asyncio.run(scenario())
    assert appends > 5, appends  # split, not one append
    with Client(joined(cluster)) as client:
        end = client.status().end
        sizes = [len(e.value) for e in client.read(1, end)]
    assert max(sizes) <= MAX_BATCH_BYTES, max(sizes)
    with State(joined(cluster)) as state:
        for k in range(4):
            last = max((v for v in done if v.name == f"v{k}"), key=lambda v: v.version)
            assert state.fetch(f"v{k}") == last
