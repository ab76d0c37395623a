"""Where one serial append's time goes: `bench/latency_budget.py [--count 500]`.

Starts a 3-replica `DevCluster` (default engine, data on the real disk) whose replicas run
with probes (this file, `--as-replica`), then appends 1 KiB values one at a time from an
in-process `AsyncClient` (exactly-once, as `rlog bench --mode serial`), and prints, per stage
of an append, the median time since the client sent it (p10 and p90 beside it).

The probes wrap functions of the replica from outside (nothing is added to rlog's own hot
path): each records `time.monotonic_ns()`, which is one clock for every process on the
machine, into a list written out when the replica stops. An append's events are those of
every process between its client send and its client receive (appends are serial, so the
windows do not overlap); the n-th event of a kind in a window is `kind#n`.

    C = the client, L = the leader, F = the follower whose write finished first (with the
    leader's own write, the quorum), G = the other follower

Also measured in the same run, for the floor: a `Status(local=True)` unary round trip to
the leader from the same client (no protocol work on the server).

The replicas and the client run with this process's environment (RLOG_EVENT_LOOP=asyncio
before the command compares event loops), plus `--replica-env NAME=VALUE` for the replicas.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import functools
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness

HERE = Path(__file__).resolve().parents[1]
if "--as-replica" not in sys.argv[1:2]:  # a replica takes rlog from its PYTHONPATH (--tree)
    sys.path.insert(0, str(HERE / "replica_image"))

EVENTS_ENV = "RLOG_BUDGET_EVENTS"  # where a probed replica writes its events

_events: list[tuple[int, str]] = []


def _mark(name: str) -> None:
    _events.append((time.monotonic_ns(), name))


def _wrap_async(owner: Any, attr: str, name: str, when: Callable[..., bool] | None = None) -> None:
    original = getattr(owner, attr)

    @functools.wraps(original)
    async def probed(*args: Any, **kwargs: Any) -> Any:
        probe = when is None or when(*args, **kwargs)
        if probe:
            _mark(name + ".enter")
        try:
            return await original(*args, **kwargs)
        finally:
            if probe:
                _mark(name + ".exit")

    setattr(owner, attr, probed)


def _wrap_sync(owner: Any, attr: str, name: str) -> None:
    original = getattr(owner, attr)

    @functools.wraps(original)
    def probed(*args: Any, **kwargs: Any) -> Any:
        _mark(name + ".enter")
        try:
            return original(*args, **kwargs)
        finally:
            _mark(name + ".exit")

    setattr(owner, attr, probed)


def _wrap_future(owner: Any, attr: str, name: str) -> None:
    """A call that returns a future at once: its stage ends when the future is done."""
    original = getattr(owner, attr)

    @functools.wraps(original)
    def probed(*args: Any, **kwargs: Any) -> Any:
        _mark(name + ".enter")
        future = original(*args, **kwargs)
        future.add_done_callback(lambda _: _mark(name + ".exit"))
        return future

    setattr(owner, attr, probed)


def install_probes() -> None:
    """Wrap the replica's stages of an append (run in the replica process, before it starts)."""
    import grpc.aio._call as grpc_call

    from rlog.proto import rlog_pb2 as pb
    from rlog.runtime import journal, node, peers, server
    from rlog.storage.records import RecordStorage

    # The acceptor/learner and the coordinator's driver: in the node itself on older builds.
    acceptor: Any = node.Node
    driver: Any = node.Node
    on_reply = "_on_reply"
    with contextlib.suppress(ImportError):
        from rlog.runtime import coordinator, replica

        acceptor, driver, on_reply = (
            replica.ReplicaDriver,
            coordinator.CoordinatorDriver,
            "on_reply",
        )

    _wrap_async(server.LogService, "Append", "append")  # the client's call, in the handler
    # The acceptor's write (the leader's: its own) and its batch handed to the journal; the
    # names differ between builds (a build that decides a write without a task per write).
    if hasattr(acceptor, "start_write"):
        _wrap_sync(acceptor, "start_write", "write")
        _wrap_sync(journal.Journal, "submit", "persist")
    else:
        _wrap_async(acceptor, "handle_write", "write")
        _wrap_async(journal.Journal, "persist", "persist")
    _wrap_sync(RecordStorage, "apply", "disk")  # in the storage thread: plan, write, sync
    _wrap_sync(driver, "_pump", "pump")  # the coordinator places the appends queued
    _wrap_async(
        peers.Peers,
        "send",
        "send",
        lambda self, send, *_: (
            isinstance(send.message, pb.WriteRequest) and send.to != self.config.id
        ),
    )
    _wrap_async(grpc_call.StreamStreamCall, "write", "grpc_write")  # leader -> follower
    # The same stages on the lanes (`--lanes`): a client's append on the append lane, the
    # leader's write to a peer on its write lane (named as the gRPC ones: the same places on
    # the path).
    from rlog.lane import append, write

    _wrap_async(append.AppendLaneHandler, "_one", "append")
    _wrap_sync(write.WriteLane, "start", "grpc_write")
    _wrap_async(grpc_call.StreamStreamCall, "read", "grpc_read")  # follower's answer read
    original_reply = getattr(driver, on_reply)

    def reply(self: Any, send: Any, response: Any) -> None:
        _mark("reply")
        original_reply(self, send, response)

    setattr(driver, on_reply, reply)
    path = os.environ[EVENTS_ENV]

    def dump() -> None:
        with open(path, "w") as out:
            for ns, name in _events:
                out.write(f"{ns} {name}\n")

    # The driver asks for them with SIGUSR1 (a leader's stop may outlast its grace).
    signal.signal(signal.SIGUSR1, lambda *_: dump())
    atexit.register(dump)


def as_replica(argv: list[str]) -> int:
    install_probes()
    from rlog.tools.cli import main as rlog_main

    return rlog_main(argv)


# ---- the driver ----------------------------------------------------------------------------


def load_events(path: Path) -> list[tuple[int, str]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        ns, name = line.split(" ", 1)
        rows.append((int(ns), name))
    rows.sort()
    return rows


async def drive(
    endpoint: str, count: int, warmup: int, batch: int = 1, lanes: bool = False
) -> tuple[list[tuple[int, int]], list[int]]:
    import grpc.aio._call as grpc_call

    from rlog.client import AsyncClient
    from rlog.lane import client as client_lane
    from rlog.proto import rlog_pb2 as pb

    _wrap_async(grpc_call.UnaryUnaryCall, "_invoke", "call")  # the client's unary call
    _wrap_future(client_lane.AppendLane, "append", "call")  # or its append on the lane
    values = [os.urandom(1024)] * batch
    windows: list[tuple[int, int]] = []
    async with AsyncClient(endpoint, timeout=10, lane=lanes) as client:
        for _ in range(warmup):
            await client.append(values)
        for _ in range(count):
            t0 = time.monotonic_ns()
            await client.append(values)
            windows.append((t0, time.monotonic_ns()))
        stub = client._endpoints.endpoint(0).log  # the floor: a unary call with no protocol work
        status: list[int] = []
        for _ in range(count):
            t0 = time.monotonic_ns()
            await stub.Status(pb.StatusRequest(local=True), timeout=10)
            status.append(time.monotonic_ns() - t0)
    return windows, status


# The first stage of an append in each process: the client's call, the leader's Append
# handler, a follower's write.
STARTS = {"call.enter", "append.enter", "write.enter"}

# The critical path of a serial append, as (from, to) stages of one append: F is the
# follower whose write finished first (with the leader's own write, the quorum; the quorum
# is the later of the two answers, usually F's).
PATH = [
    ("client send -> client gRPC call starts", "C send", "C call.enter#1"),
    ("client call -> leader Append handler", "C call.enter#1", "L append.enter#1"),
    ("leader: handler -> pump (propose, a loop turn)", "L append.enter#1", "L pump.enter#1"),
    ("leader: pump (coordinator, post the sends)", "L pump.enter#1", "L pump.exit#1"),
    ("leader: pump -> gRPC write to a peer starts", "L pump.exit#1", "L grpc_write.enter#1"),
    ("leader gRPC write -> follower write handler", "L grpc_write.enter#1", "F write.enter#1"),
    ("follower: on_write (+ learned) to persist", "F write.enter#1", "F persist.enter#1"),
    ("follower: journal hop to storage thread", "F persist.enter#1", "F disk.enter#1"),
    ("follower: storage apply (write+sync)", "F disk.enter#1", "F disk.exit#1"),
    ("follower: back on its loop, reply -> leader", "F disk.exit#1", "L reply@F"),
    ("leader: quorum -> Append handler returns", "L quorum", "L append.exit#1"),
    ("leader Append return -> client call returns", "L append.exit#1", "C call.exit#1"),
    ("client call returns -> append returns", "C call.exit#1", "C recv"),
]
# Off the path, for comparison: the leader's own write, and the floor's gaps.
SIDE = [
    ("leader: own write, journal hop", "L persist.enter#1", "L disk.enter#1"),
    ("leader: own storage apply", "L disk.enter#1", "L disk.exit#1"),
    ("leader: own write, hop back (-> its reply)", "L disk.exit#1", "L reply@L"),
    ("leader: gRPC write to 1st follower", "L grpc_write.enter#1", "L grpc_write.exit#1"),
    ("leader: 2nd follower's write starts", "L grpc_write.enter#1", "L grpc_write.enter#2"),
]


def stages_of(
    t0: int, t1: int, events: dict[str, list[tuple[int, str]]], cursors: dict[str, int]
) -> dict[str, int]:
    """One append's stages: "ROLE kind#n" -> ns (the n-th event of a kind in the window)."""
    found: dict[str, int] = {"C send": t0, "C recv": t1}
    for role, rows in events.items():
        i = cursors[role]
        while i < len(rows) and rows[i][0] < t0:
            i += 1
        seen: dict[str, int] = {}
        started = False  # events before this process's first stage are the last append's
        while i < len(rows) and rows[i][0] <= t1:
            ns, name = rows[i]
            i += 1
            started = started or name in STARTS
            kind, _, phase = name.rpartition(".")
            if phase == "exit" and seen.get(f"{kind}.enter", 0) <= seen.get(name, 0):
                continue  # the end of a stage that began before this append's
            if started:
                seen[name] = seen.get(name, 0) + 1
                found[f"{role} {name}#{seen[name]}"] = ns
        cursors[role] = i
    # The follower whose disk write finished first is "F", the other "G".
    done = sorted(
        (found.get(f"{role} disk.exit#1", 1 << 62), role) for role in events if role[0] == "F"
    )
    renamed = {}
    for label, ns in found.items():
        role, _, rest = label.partition(" ")
        if role[0] == "F":
            role = "F" if role == done[0][1] else "G"
        renamed[f"{role} {rest}"] = ns
    # The leader's reply events (its own write's, each follower's) that follow each disk
    # write: the first reply after it.
    replies = sorted(ns for label, ns in renamed.items() if label.startswith("L reply#"))
    for role in ("F", "L"):
        written = renamed.get(f"{role} disk.exit#1")
        later = [ns for ns in replies if written is not None and ns >= written]
        if later:
            renamed[f"L reply@{role}"] = later[0]
    if "L reply@F" in renamed and "L reply@L" in renamed:  # both answers make the quorum
        renamed["L quorum"] = max(renamed["L reply@F"], renamed["L reply@L"])
    return renamed


def budget(
    windows: list[tuple[int, int]], events: dict[str, list[tuple[int, str]]]
) -> list[dict[str, int]]:
    cursors = dict.fromkeys(events, 0)
    return [stages_of(t0, t1, events, cursors) for t0, t1 in windows]


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def segments(appends: list[dict[str, int]], path: list[tuple[str, str, str]]) -> list[str]:
    lines = []
    for what, first, last in path:
        deltas = [(a[last] - a[first]) / 1000 for a in appends if first in a and last in a]
        if len(deltas) < len(appends) / 2:
            lines.append(f"  {what:46} (seen in {len(deltas)} appends)")
            continue
        lines.append(
            f"  {what:46} {statistics.median(deltas):7.0f} {quantile(deltas, 0.1):7.0f} "
            f"{quantile(deltas, 0.9):7.0f}"
        )
    return lines


def report(appends: list[dict[str, int]], status: list[int], batch: int = 1) -> str:
    n = len(appends)
    what = "1 KiB" if batch == 1 else f"{batch} x 1 KiB"
    lines = [f"{n} serial appends of {what}; µs; columns p50, p10, p90", "the critical path:"]
    lines += segments(appends, PATH)
    total = [(a["C recv"] - a["C send"]) / 1000 for a in appends]
    lines.append(
        f"  {'total (client send -> append returns)':46} {statistics.median(total):7.0f} "
        f"{quantile(total, 0.1):7.0f} {quantile(total, 0.9):7.0f}"
    )
    lines.append("beside it:")
    lines += segments(appends, SIDE)
    floor = [s / 1000 for s in status]
    lines.append(
        f"floor: Status(local) unary round trip {statistics.median(floor):7.0f} "
        f"{quantile(floor, 0.1):7.0f} {quantile(floor, 0.9):7.0f}"
    )
    lines.append("every stage, µs since the client's send (seen in at least half the appends):")
    labels: dict[str, list[float]] = {}
    for a in appends:
        for label, ns in a.items():
            labels.setdefault(label, []).append((ns - a["C send"]) / 1000)
    rows = sorted(
        (statistics.median(v), label, v) for label, v in labels.items() if len(v) >= n / 2
    )
    for median, label, values in rows:
        lines.append(
            f"  {label:30} {median:7.0f} {quantile(values, 0.1):7.0f} {quantile(values, 0.9):7.0f}"
        )
    return "\n".join(lines)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--as-replica":
        return as_replica(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--batch", type=int, default=1, help="1 KiB values per append")
    parser.add_argument("--dir", help="cluster dir (default: a new temporary dir)")
    parser.add_argument("--replica-env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--json", metavar="FILE", help="also write the stages as JSON")
    parser.add_argument(
        "--tree", type=Path, default=HERE, help="the replicas' source tree (default this one)"
    )
    parser.add_argument(
        "--lanes",
        action="store_true",
        help="the kit's shape: replicas with write lanes, the client on its append lane",
    )
    args = parser.parse_args()

    from rlog import allocator, event_loop

    # The driver is the client: its large buffers kept in the heap as in every `rlog` process
    # (`rlog bench` included), so that its stages are not page faults the CLI never pays.
    allocator.keep_large_buffers()

    base = Path(args.dir or tempfile.mkdtemp(prefix="rlog-budget-"))
    env = harness.tree_env(args.tree)
    for item in args.replica_env:
        name, _, value = item.partition("=")
        env[name] = value

    def env_of(i: int) -> dict[str, str]:
        return {**env, EVENTS_ENV: str(base / f"events-{i}.txt")}

    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    lane_offset = 1 if args.lanes else 0
    with harness.wrapped_cluster(__file__, base / "cluster", env_of, lane_offset) as cluster:
        leader = cluster.wait_for_leader()
        windows, status = event_loop.run(
            drive(cluster.endpoints[leader], args.count, args.warmup, args.batch, args.lanes)
        )
        for i in range(3):
            pid = cluster.pid(i)
            if pid is not None:
                os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)
    shutil.rmtree(base / "cluster", ignore_errors=True)  # the log's data, no longer needed
    events = {}
    followers = [i for i in range(3) if i != leader]
    for i in range(3):
        events[i] = load_events(base / f"events-{i}.txt")
    labelled = {"L": events[leader]}
    for n, i in enumerate(followers):
        labelled[f"F{n}"] = events[i]
    labelled["C"] = sorted(_events)
    appends = budget(windows, labelled)
    end = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"load average at the start: {load}, at the end: {end}; leader replica {leader}")
    print(report(appends, status, args.batch))
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load, "appends": appends, "status": status}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
