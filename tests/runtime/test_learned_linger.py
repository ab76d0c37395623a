"""A leader's learned ranges for a peer wait up to `LEARNED_LINGER` for the next write to
that peer and ride on it (`Peers._hold_learned`, `_learned_for`); only a range no write
takes within the linger goes alone, as a Learned call.

The linger's timer must belong to the range it was set for. It used to outlive it: a range
that rode on a write left its timer running, and when it fired it sent whatever range was
held by then, one the next append had held only a moment before. Serial appends a few
milliseconds apart sent over half their learned ranges as separate Learned calls (counted
on a 3-replica log: 1.13 unary calls from the leader per serial append, docs/performance.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest

from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.runtime import peers as peers_module
from rlog.runtime.peers import Peers

LINGER = 0.5  # seconds; each check below has 0.2 s or more either side of the timers it tells apart


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """A leader's `Peers` (id 0, never connected) whose background sends are recorded."""
    monkeypatch.setattr(peers_module, "LEARNED_LINGER", LINGER)
    spawned: list[Any] = []

    def spawn(coro: Coroutine[Any, Any, None]) -> None:
        # `Peers.send(send, learned)`: what it would have sent, then drop the coroutine.
        spawned.append(coro.cr_frame.f_locals["send"].message)
        coro.close()

    config = ReplicaConfig(
        id=0, peers=["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], data_dir=tmp_path
    )
    peers = Peers(
        config,
        None,  # type: ignore[arg-type]  # core and local replica: unused by these calls
        None,  # type: ignore[arg-type]
        spawn=spawn,
        on_reply=lambda send, response: None,
        on_failure=lambda send: None,
        promise_timeout=1.0,
    )
    return peers, spawned


def learned(first: int, last: int) -> pb.LearnedRequest:
    return pb.LearnedRequest(
        proposal=7, leader=0, ranges=[pb.PositionRange(first=first, last=last)]
    )


def write() -> pb.WriteRequest:
    """A write of the same proposal (its content does not matter here)."""
    return pb.WriteRequest(proposal=7)


async def test_a_range_that_rode_on_a_write_leaves_no_timer_to_send_the_next_early(sent):
    peers, spawned = sent
    peers._hold_learned(1, learned(1, 1))  # append 1 chosen: its range waits for a write
    await asyncio.sleep(LINGER * 0.05)
    rode = peers._learned_for(1, write())  # append 2's write takes it
    assert rode is not None and [(r.first, r.last) for r in rode.ranges] == [(1, 1)]
    await asyncio.sleep(LINGER * 0.45)
    peers._hold_learned(1, learned(2, 2))  # append 2 chosen (0.5 lingers in)
    await asyncio.sleep(LINGER * 0.6)  # past append 1's linger, within append 2's
    assert spawned == [], "append 1's timer sent append 2's range on its own"
    rode = peers._learned_for(1, write())  # append 3's write takes append 2's range
    assert rode is not None and [(r.first, r.last) for r in rode.ranges] == [(2, 2)]
    await asyncio.sleep(LINGER * 0.6)  # past append 2's linger
    assert spawned == []


async def test_a_range_no_write_takes_goes_alone_after_the_linger(sent):
    peers, spawned = sent
    peers._hold_learned(1, learned(1, 1))
    peers._hold_learned(1, learned(2, 3))  # held together: one message
    await asyncio.sleep(LINGER * 1.5)
    assert len(spawned) == 1
    assert [(r.first, r.last) for r in spawned[0].ranges] == [(1, 1), (2, 3)]
    assert peers._learned_for(1, write()) is None  # nothing held any more


async def test_a_range_of_another_proposal_is_sent_at_once(sent):
    peers, spawned = sent
    peers._hold_learned(1, learned(1, 1))
    newer = learned(2, 2)
    newer.proposal = 8
    peers._hold_learned(1, newer)  # the proposal changed: the older range goes now
    assert len(spawned) == 1 and spawned[0].proposal == 7
    await asyncio.sleep(LINGER * 1.5)
    assert len(spawned) == 2 and spawned[1].proposal == 8  # the newer one after its linger
