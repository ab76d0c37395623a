"""One run: a fresh cluster, concurrent clients, the nemesis, healing, then the verdicts.

The workload's operation kinds are the history's `f` (jepsen/history.py), drawn by
`_operation` in the shares of `Mix`: appends of one value or a batch of up to MAX_BATCH,
"append" (plain: no session), "append-idempotent" (the default client's session, which
retries unknown outcomes itself), "append-if-next" (at the next position the client
believes), "append-epoch" (fenced by the writer epoch the client took with "take-epoch");
reads "read" (linearizable: `stale=False`) and "read-min-position" (stale, at the client's
own replica, bound by the client's last acknowledged position). See docs/jepsen.md.
"""

from __future__ import annotations

import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from jepsen import checks, disk, linearizability
from jepsen.history import (
    APPEND,
    APPEND_EPOCH,
    APPEND_IDEMPOTENT,
    APPEND_IF_NEXT,
    APPENDS,
    FAIL,
    INFO,
    OK,
    READ,
    READ_MIN_POSITION,
    TAKE_EPOCH,
    History,
    Op,
    now,
)
from jepsen.nemesis import POWER, Nemesis
from jepsen.network import Netns
from jepsen.powerfs import PowerFS, mount_data_dirs, unmount_all
from rlog.client import Client
from rlog.client.errors import ConditionFailed, OutcomeUnknown, RlogError, from_rpc_error
from rlog.config import SEGMENT_BYTES_ENV, UNSAFE_NO_SYNC_ENV
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.tools.dev import DevCluster

FINAL_PROCESS = 1000  # the read after healing
MAX_BATCH = 5  # values per append: 1 (half of them), else 2 to MAX_BATCH
# Test-only: the replicas settle a batch's positions one by one in a fill, as before atomic
# batches (read by the replicas; on a branch without atomic batches it changes nothing).
UNSAFE_SPLIT_FILL_ENV = "RLOG_UNSAFE_SPLIT_FILL"


@dataclass
class Mix:
    """The shares of the operation kinds a writing client draws (its `append_ratio` splits
    appends from reads; these split each further)."""

    idempotent: float = 0.0  # of appends: through the session client
    if_next: float = 0.0  # of appends: conditional on the next position
    epoch: float = 0.0  # of appends: fenced by the client's writer epoch (take-epoch first)
    take_epoch: float = 0.0  # of epoch appends: take a new epoch instead
    min_position: float = 0.0  # of reads: stale, at the client's own replica, bound by it


# The default mix: every kind, plain and linearizable ones still the larger part.
ALL_KINDS = Mix(idempotent=0.3, if_next=0.15, epoch=0.15, take_epoch=0.15, min_position=0.3)
PLAIN_ONLY = Mix()
# Every append through the session client (the dedupe proof: as many retries as can be).
IDEMPOTENT_ONLY = Mix(idempotent=1.0)
MIXES = {"all": ALL_KINDS, "plain": PLAIN_ONLY, "idempotent": IDEMPOTENT_ONLY}


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
    write_lane_offset: int = 0  # the leader's writes on the write lane (0: the gRPC stream)
    client_lane: bool = False  # clients append on the replicas' lane (with write_lane_offset)
    catchup_rate: int = 0  # rlog replica --catchup-rate: catch-ups and pulls capped (0: not)
    read_timeout: float = 3.0  # a read stuck at a paused or cut-off replica gives up
    append_timeout: float = 4.0
    hold: tuple[float, float] = (3.0, 6.0)  # how long a fault lasts
    interval: tuple[float, float] = (1.0, 3.0)  # healthy time between faults
    recovery_timeout: float = 60.0  # after healing: every replica VOTING and caught up
    mix: Mix = field(default_factory=lambda: ALL_KINDS)  # the writers' operation kinds
    # Test-only: the replicas skip each batch's fdatasync (RLOG_UNSAFE_NO_SYNC=1, theirs
    # alone: the suite's own `initialize` of the data dirs still syncs).
    unsafe_no_sync: bool = False


@dataclass
class RunResult:
    seed: int
    out: Path
    operations: int = 0  # checked by Porcupine (failed operations dropped)
    recorded: int = 0  # every operation of the history
    faults: int = 0
    faults_by_kind: dict[str, int] = field(default_factory=dict)
    skipped: int = 0  # wipes skipped: the others were not a VOTING quorum in time
    exited: int = 0  # replicas that exited by themselves (restarted at the next heal)
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


@dataclass
class _Writer:
    """What one client believes and holds between operations."""

    plain: Client  # exactly_once=False
    session: Client  # the default: a session, unknown outcomes retried in it
    endpoint: str
    last_seen: int | None = None  # the highest position this client saw
    next_hint: int | None = None  # the log's next position as last reported to it
    epoch: int | None = None  # the writer epoch it took last


def _client_loop(
    process: int,
    endpoint: str,
    others: list[str],
    history: History,
    rng: random.Random,
    stop_at: float,
    append_ratio: float,
    config: RunConfig,
) -> None:
    """One client: one operation at a time until `stop_at`, through one endpoint (the
    session client may retry through the others)."""

    def client(endpoints: list[str], exactly_once: bool) -> Client:
        return Client(
            endpoints,
            timeout=2.0,
            append_timeout=config.append_timeout,
            read_timeout=config.read_timeout,
            exactly_once=exactly_once,
            lane=config.client_lane,
        )

    writer = _Writer(client([endpoint], False), client([endpoint, *others], True), endpoint)
    counter = 0
    try:
        while time.monotonic() < stop_at:
            f = _operation(rng, append_ratio, config.mix, writer)
            if f in APPENDS:
                size = 1 if rng.random() < 0.5 else rng.randint(2, MAX_BATCH)
                values = [f"{process}.{counter + k}" for k in range(size)]
                counter += size
                op = Op(process, f, now(), values=values, endpoint=endpoint)
                _append(writer, op)
            elif f == TAKE_EPOCH:
                op = Op(process, f, now(), endpoint=endpoint)
                _take_epoch(writer, op, config.append_timeout)
            else:
                op = Op(process, f, now(), endpoint=endpoint)
                _read(writer, op, rng)
            op.complete = now()
            history.add(op)
            # A little slower after a failure: a killed replica refuses at once.
            time.sleep(rng.uniform(0.0, 0.05) + (0.2 if op.result == FAIL else 0.0))
    finally:
        writer.plain.close()
        writer.session.close()


def _operation(rng: random.Random, append_ratio: float, mix: Mix, writer: _Writer) -> str:
    """The next operation's kind (the history's `f`), drawn from the seeded stream."""
    if rng.random() < append_ratio:
        draw = rng.random()
        if draw < mix.idempotent:
            return APPEND_IDEMPOTENT
        draw -= mix.idempotent
        if draw < mix.if_next:
            return APPEND_IF_NEXT
        draw -= mix.if_next
        if draw < mix.epoch:
            take = writer.epoch is None or rng.random() < mix.take_epoch
            return TAKE_EPOCH if take else APPEND_EPOCH
        return APPEND
    if writer.last_seen is not None and rng.random() < mix.min_position:
        return READ_MIN_POSITION
    return READ


def _append(writer: _Writer, op: Op) -> None:
    """Perform an append of any kind and record its outcome in `op`: ok with the positions
    it got (an idempotent one: the positions its session finally got, after its own
    retries), info if it may or may not have happened, fail if it certainly did not."""
    assert op.values is not None
    try:
        if op.f == APPEND_IDEMPOTENT:
            positions = writer.session.append(op.values)
        elif op.f == APPEND_IF_NEXT:
            # The next position as this client believes it: what the log last reported,
            # else one past the highest position it saw.
            believed = writer.next_hint
            if believed is None or (writer.last_seen is not None and believed <= writer.last_seen):
                believed = (writer.last_seen or 0) + 1
            op.if_next = believed
            positions = writer.plain.append(op.values, if_next=believed)
        elif op.f == APPEND_EPOCH:
            op.epoch = writer.epoch
            positions = writer.plain.append(op.values, epoch=writer.epoch or 0)
        else:
            positions = writer.plain.append(op.values)
    except OutcomeUnknown as error:
        op.result, op.error = INFO, f"{type(error).__name__}: {error}"
    except ConditionFailed as error:
        op.result, op.error = FAIL, f"{type(error).__name__}: {error}"
        if error.next_position is not None:
            writer.next_hint = error.next_position
    except RlogError as error:
        op.result, op.error = FAIL, f"{type(error).__name__}: {error}"
    except Exception as error:  # unexpected: it may have reached a server
        op.result, op.error = INFO, f"{type(error).__name__}: {error}"
    else:
        op.result, op.position, op.positions = OK, positions[0], list(positions)
        writer.last_seen = max(writer.last_seen or 0, positions[-1])
        writer.next_hint = positions[-1] + 1


def _take_epoch(writer: _Writer, op: Op, timeout: float) -> None:
    """Take a new writer epoch through a bare Log stub: its answer says where the EPOCH
    entry went, which the fencing check needs (the client returns the epoch alone)."""
    with grpc.insecure_channel(writer.endpoint) as channel:
        try:
            response = pbg.LogStub(channel).TakeEpoch(pb.TakeEpochRequest(), timeout=timeout)
        except grpc.RpcError as exc:
            error = from_rpc_error(exc, writer.endpoint, mutating=True)
            unknown = isinstance(error, OutcomeUnknown)
            op.result, op.error = (INFO if unknown else FAIL), f"{type(error).__name__}: {error}"
            return
    op.result, op.epoch, op.position = OK, int(response.epoch), int(response.position)
    writer.epoch = op.epoch
    writer.last_seen = max(writer.last_seen or 0, op.position)


def _read(writer: _Writer, op: Op, rng: random.Random) -> None:
    """A linearizable read (stale=False), or a stale one at the client's own replica that
    must hold the client's last acknowledged position (read-your-writes)."""
    last_seen = writer.last_seen
    # Mostly the recent end of the log as this client last saw it (histories stay small),
    # sometimes all of it.
    op.from_ = None if last_seen is None or rng.random() < 0.05 else max(0, last_seen - 16)
    try:
        if op.f == READ_MIN_POSITION:
            client = writer.session
            op.min_position = max(client.last_appended, writer.plain.last_appended)
            op.from_ = max(0, (op.min_position or writer.last_seen or 0) - 16)
            found = client.read(
                from_=op.from_, stale=True, endpoint=writer.endpoint, min_position=op.min_position
            )
        else:
            found = writer.plain.read(from_=op.from_)
        entries = [(e.position, e.text) for e in found]
    except Exception as error:  # a read that failed did not happen
        op.result, op.error = FAIL, f"{type(error).__name__}: {error}"
    else:
        op.result, op.entries = OK, entries
        if entries:
            writer.last_seen = max(writer.last_seen or 0, entries[-1][0])


def _final_read(cluster: DevCluster, leader: int, history: History) -> list[tuple[int, str]] | None:
    """A non-stale read through the leader after healing, recorded like any other."""
    endpoint = cluster.addresses[leader]
    for _ in range(5):
        op = Op(FINAL_PROCESS, READ, now(), endpoint=endpoint)
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


def _not_voting(cluster: DevCluster, wiped: set[int]) -> list[str]:
    """Every wiped (or disk-damaged) replica that is not VOTING after healing (it must have
    recovered: the others never let it lose a value, see Nemesis)."""
    statuses = cluster.statuses(timeout=5.0)
    problems = []
    for i in sorted(wiped):
        status = statuses[i]
        if status is None:
            problems.append(f"replica {i} was wiped or damaged and is down")
        elif status.status != pb.VOTING:
            name = pb.Status.Name(status.status)
            problems.append(
                f"replica {i} was wiped or damaged and is {name}: {status.reason} "
                f"{status.storage_fault}".strip()
            )
    return problems


def _cluster_setup(config: RunConfig) -> tuple[dict[str, str] | None, list[str], str]:
    """The replicas' environment, extra arguments and storage engine for the run's kinds."""
    env: dict[str, str] | None = None
    if config.unsafe_no_sync:
        env = {**os.environ, UNSAFE_NO_SYNC_ENV: "1"}
    args = ["--catchup-rate", str(config.catchup_rate)] if config.catchup_rate else []
    engine = "auto"
    if set(disk.DISK) & set(config.nemesis):
        # The segment engine, whose files the faults damage. Odd seeds: small segments
        # (many, so one can be lost from the middle, and index snapshots, so that damage
        # in an older segment is met on reads); even seeds: the default size (one
        # segment, replayed at every open: damage left in it is met at each open).
        engine = "segment"
        if config.seed % 2:
            env = {**(env or os.environ), SEGMENT_BYTES_ENV: str(disk.SEGMENT_BYTES)}
    if disk.EIO in config.nemesis:
        env = disk.eio_env(env or dict(os.environ))
    if disk.DISK_FULL in config.nemesis:
        args += ["--min-free-bytes", str(disk.MIN_FREE_BYTES)]
    return env, args, engine


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
    env, replica_args, engine = _cluster_setup(config)
    cluster = DevCluster(
        config.replicas,
        out / "cluster",
        election_timeout=config.election_timeout,
        python=(str(network.python_wrapper(out, sys.executable)) if network else sys.executable),
        write_lane_offset=config.write_lane_offset,
        # In network namespaces the replicas listen on 10.213.x.y, beyond loopback.
        replica_args=[*replica_args, *(["--insecure"] if network else ())],
        env=env,
        storage_engine=engine,
    )
    # A full disk needs a small file system under every data dir (under powerfs's backing
    # dir with power cuts), mounted before the cluster initializes them.
    power = bool(POWER & set(config.nemesis))
    tmpfs: list[Path] = []
    try:
        if disk.DISK_FULL in config.nemesis:
            for i in range(config.replicas):
                where = cluster.replica_dir(i) / "backing" if power else cluster.data_dir(i)
                disk.mount_tmpfs(where)
                tmpfs.append(where)
        # Power cuts need every data dir on powerfs, from before the cluster initializes them.
        mounts: list[PowerFS] | None = mount_data_dirs(cluster) if power else None
    except BaseException:
        for where in tmpfs:
            disk.unmount(where)
        raise
    if network is not None:
        network.heal()
        cluster.addresses = network.endpoints()
    history = History()
    nemesis = Nemesis(
        cluster,
        config.nemesis,
        rng.random(),
        history,
        network,
        mounts,
        tmpfs=bool(tmpfs),
        interval=config.interval,
        hold=config.hold,
    )
    final: list[tuple[int, str]] | None = None
    replica_logs: list[list[tuple[int, str]] | None] = []
    recovered: list[str] = []

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
                    [a for k, a in enumerate(cluster.addresses) if k != slot % config.replicas],
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
            # A wiped replica recovers (EMPTY -> RECOVERING -> VOTING) before it counts.
            cluster.wait_for(
                lambda sts: (
                    all(s is not None and s.status == pb.VOTING for s in sts)
                    and len({s.learned for s in sts if s is not None}) == 1
                ),
                timeout=config.recovery_timeout if nemesis.wiped | nemesis.damaged else 10,
                what="every replica VOTING and caught up",
            )
        except RlogError as error:  # the direct checks take a lagging log as a prefix
            say(str(error).splitlines()[0])
        recovered = _not_voting(cluster, nemesis.wiped | nemesis.damaged)
        final = _final_read(cluster, leader, history)
        replica_logs = _replica_logs(cluster)
        recovered += [
            f"replica {i} was wiped or damaged and holds {len(replica_logs[i] or [])} of "
            f"the {len(final)} entries after healing"
            for i in sorted(nemesis.wiped | nemesis.damaged)
            if final is not None and replica_logs[i] != final
        ]
    except Exception as error:  # still judge what was recorded
        result.error = f"{type(error).__name__}: {error}"
        say(f"run error: {result.error}")
    finally:
        nemesis.stop()
        nemesis.heal()
        cluster.stop()
        if mounts is not None:
            unmount_all(mounts)
        for where in tmpfs:
            disk.unmount(where)

    ops = history.snapshot()
    history.write(out / "history.jsonl")
    nemesis.write(out / "nemesis.jsonl")
    result.faults = len(nemesis.faults)
    result.faults_by_kind = nemesis.by_kind()
    result.skipped = len(nemesis.skipped)
    result.exited = len(nemesis.exited)
    result.recorded = len(ops)
    result.problems = checks.all_problems(ops, final, replica_logs)
    result.problems["wiped replicas recovered"] = recovered
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
                "faults": result.faults_by_kind,
                "skipped_faults": result.skipped,
                "exited": nemesis.exited,
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
