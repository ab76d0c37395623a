"""The byte budgets of clients' appends (rlog/runtime/budgets.py): first come first served,
an append larger than the budget goes alone, a cancelled wait takes nothing and lets the
next in, a stream's budget holds its stream back before the replica's, and a unary append
that finds no room in time is refused LIMIT_EXCEEDED, saying which flag."""

from __future__ import annotations

import asyncio
import time

import pytest

from rlog.runtime.budgets import ANSWER_COST, ByteBudget, ReplicaBudget
from rlog.runtime.errors import RpcError
from rlog.wire import Reason


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_first_come_first_served() -> None:
    budget = ByteBudget(10)
    await budget.take(6)
    first = asyncio.ensure_future(budget.take(6))
    await settle()
    assert not first.done()
    # A small request that would fit does not pass the one waiting before it.
    assert not budget.try_take(1)
    second = asyncio.ensure_future(budget.take(4))
    await settle()
    assert not second.done()
    budget.release(6)
    await settle()
    assert first.done() and second.done()
    assert budget.in_flight == 10


async def test_larger_than_the_budget_goes_alone() -> None:
    budget = ByteBudget(10)
    assert budget.try_take(25)  # nothing in flight: it goes, or it never would
    later = asyncio.ensure_future(budget.take(1))
    await settle()
    assert not later.done()
    budget.release(25)
    await settle()
    assert later.done() and budget.in_flight == 1


async def test_a_cancelled_wait_takes_nothing_and_lets_the_next_in() -> None:
    seen: list[int] = []
    budget = ByteBudget(10, seen.append)
    await budget.take(8)
    stuck = asyncio.ensure_future(budget.take(8))
    behind = asyncio.ensure_future(budget.take(2))
    await settle()
    assert not behind.done()
    stuck.cancel()
    await settle()
    assert behind.done() and budget.in_flight == 10
    budget.release(8)
    budget.release(2)
    assert budget.in_flight == 0 and seen[-1] == 0


async def test_a_stream_is_held_back_by_its_own_budget_first() -> None:
    waits: list[str] = []
    replica = ReplicaBudget(0, 1000 * ANSWER_COST, 8 * ANSWER_COST, on_wait=waits.append)
    stream, other = replica.stream(), replica.stream()
    ticket = await stream.admit(3 * ANSWER_COST)  # 4 x ANSWER_COST with its answer
    assert stream.try_admit(3 * ANSWER_COST) is not None  # 8 x: full
    assert stream.try_admit(1) is None
    assert other.try_admit(ANSWER_COST) is not None  # another stream is not held back
    held = asyncio.ensure_future(stream.admit(ANSWER_COST))
    await settle()
    assert not held.done() and waits == ["stream"]
    ticket.answered()  # the request's bytes go as the append is answered
    await settle()
    assert held.done()
    assert replica.budget.in_flight == 9 * ANSWER_COST  # the answer's part until it is sent
    ticket.sent()
    assert replica.budget.in_flight == 8 * ANSWER_COST


async def test_a_unary_append_without_room_in_time_is_refused_saying_which_flag() -> None:
    refusals: list[None] = []
    replica = ReplicaBudget(3, 10_000, 10_000, on_refusal=lambda: refusals.append(None))
    held = await replica.admit_unary(9_000, time.monotonic() + 1)
    with pytest.raises(RpcError) as refused:
        await replica.admit_unary(2_000, time.monotonic() + 0.05)
    assert refused.value.reason == Reason.LIMIT_EXCEEDED
    assert "--max-inflight-bytes" in refused.value.message
    assert "replica 3" in refused.value.message
    assert len(refusals) == 1
    assert replica.budget.in_flight == 9_000 + ANSWER_COST  # the refused one took nothing
    waiting = asyncio.ensure_future(replica.admit_unary(2_000, time.monotonic() + 10))
    await settle()
    held.sent()
    (await waiting).sent()
    assert replica.budget.in_flight == 0


async def test_announced_bytes_hold_at_most_half_the_replica_budget() -> None:
    # Lane appends admitted on their length alone (their bytes still to come) cannot take
    # the whole budget: appends that are here find the other half.
    waits: list[str] = []
    replica = ReplicaBudget(0, 64 * ANSWER_COST, 64 * ANSWER_COST, on_wait=waits.append)
    first = replica.stream().try_admit(20 * ANSWER_COST, announced=True)
    assert first is not None
    assert replica.stream().try_admit(20 * ANSWER_COST, announced=True) is None
    late = asyncio.ensure_future(replica.stream().admit(20 * ANSWER_COST, announced=True))
    await settle()
    assert not late.done() and waits == ["announced"]
    here = replica.stream().try_admit(10 * ANSWER_COST)
    assert here is not None  # the half of what is here
    first.arrived()  # its bytes came: the announced half has room again
    await settle()
    assert late.done()
    (await late).sent()
    first.sent()
    here.sent()
    assert replica.budget.in_flight == 0 and replica.announced.in_flight == 0
