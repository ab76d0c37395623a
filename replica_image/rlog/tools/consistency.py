"""A consistency checker for tests and e2e runs: compares what every replica has learned with
the history of acknowledged appends.

Invariants (the project's definition of "consistent"):
- no position holds two different values on any two replicas;
- every acknowledged append is readable at its position from every VOTING replica (unless
  truncated away: below that replica's begin);
- every replica's learned entries form no gaps up to what it reports learned.
Each replica is read with a stale (local) read, so the check sees each replica's own disk,
not the leader's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

import grpc

from rlog.client.packing import pairs_of
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.wire import CLIENT_CHANNEL_OPTIONS


@dataclass
class ReplicaView:
    endpoint: str
    status: pb.Status.ValueType
    begin: int
    learned: int
    entries: dict[int, bytes] = field(default_factory=dict)


@dataclass
class Report:
    replicas: list[ReplicaView]
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def __str__(self) -> str:
        lines = [
            f"{r.endpoint}: {pb.Status.Name(r.status)} begin={r.begin} learned={r.learned} "
            f"entries={len(r.entries)}"
            for r in self.replicas
        ]
        return "\n".join(lines + [f"PROBLEM: {p}" for p in self.problems[:20]])


async def read_replica(endpoint: str, rpc_timeout: float = 60.0) -> ReplicaView:
    """Status and every learned APPEND entry held by one replica (a stale, local read)."""
    async with grpc.aio.insecure_channel(endpoint, options=CLIENT_CHANNEL_OPTIONS) as channel:
        stub = pbg.LogStub(channel)
        status = await stub.Status(pb.StatusRequest(), timeout=rpc_timeout)
        view = ReplicaView(endpoint, status.status, status.begin, status.learned)
        if status.status != pb.VOTING:
            return view
        request = pb.ReadRequest(stale=True, to=status.learned)
        setattr(request, "from", status.begin)
        async for response in stub.Read(request, timeout=rpc_timeout):
            for position, value in pairs_of(response):
                view.entries[position] = value
        return view


def compare(views: list[ReplicaView], acknowledged: Mapping[int, bytes]) -> list[str]:
    """The invariants over replica views and acknowledged appends {position: value}."""
    problems: list[str] = []
    seen: dict[int, tuple[bytes, str]] = {}
    for view in views:
        for position, value in view.entries.items():
            other = seen.setdefault(position, (value, view.endpoint))
            if other[0] != value:
                problems.append(
                    f"position {position} holds two values: {other[1]} and {view.endpoint}"
                )
    for view in views:
        if view.status != pb.VOTING:
            continue
        for position, value in acknowledged.items():
            if position < view.begin:
                continue
            if position > view.learned:
                problems.append(
                    f"{view.endpoint} has not learned acknowledged position {position} "
                    f"(learned {view.learned})"
                )
                continue
            held = view.entries.get(position)
            if held != value:
                problems.append(
                    f"{view.endpoint} holds {'nothing' if held is None else 'another value'} "
                    f"at acknowledged position {position}"
                )
    return problems


async def check(
    endpoints: list[str],
    acknowledged: Mapping[int, bytes],
    settle_timeout: float = 30.0,
) -> Report:
    """Wait (up to `settle_timeout`) until every VOTING replica has learned the highest
    acknowledged position, then compare. Returns the report of the last attempt."""
    target = max(acknowledged, default=0)
    deadline = time.monotonic() + settle_timeout
    while True:
        results = await asyncio.gather(
            *(read_replica(e) for e in endpoints), return_exceptions=True
        )
        views = [r for r in results if isinstance(r, ReplicaView)]
        problems = compare(views, acknowledged)
        problems += [
            f"{endpoint} unreachable: {result}"
            for endpoint, result in zip(endpoints, results, strict=True)
            if isinstance(result, BaseException)
        ]
        settled = all(v.learned >= target for v in views if v.status == pb.VOTING)
        if (not problems and settled) or time.monotonic() > deadline:
            return Report(views, problems)
        await asyncio.sleep(0.5)


def check_sync(
    endpoints: list[str], acknowledged: Mapping[int, bytes], settle_timeout: float = 30.0
) -> Report:
    return asyncio.run(check(endpoints, acknowledged, settle_timeout))
