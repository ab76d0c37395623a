"""The client's append lane, the replica's side (docs/data-path.md, "The client's append
lane"): a client's `AppendRequest`s on a lane connection (`framed`), each answered
with the `AppendResponse` the `AppendStream` would send (its id, its positions or its
error's code, message and reason), in the order they finish.

An append on the lane is an `Append` call in all but its transport: the same packed
values, conditions and session, the same `CoordinatorDriver.append` (a follower forwards it
to the leader), the same errors. What the lane saves is gRPC's cost per call on both sides,
about half a millisecond of a serial append's round trip.

A client that sends faster than its appends finish is held back: the replica stops reading
its connection (the socket's buffers then push back on the client) while its appends in
flight are over its budget or the replica's (runtime/budgets.py: the bytes of a frame are
held as soon as its length is read, before the buffer grows to it), past `MAX_IN_FLIGHT`
appends pending on it (until half of them are answered), and while answers wait unsent
(the client does not read them).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from rlog.lane.framed import parse
from rlog.proto import rlog_pb2 as pb
from rlog.runtime import appends
from rlog.runtime.budgets import StreamBudget, Ticket

log = logging.getLogger("rlog.lane")

APPEND_METHOD = "/rlog.v1.Log/Append"  # what the lane stands in for, to the roles


class AppendLaneHandler:
    """One client's append lane connection, after its welcome."""

    MAX_IN_FLIGHT = 1024

    def __init__(
        self,
        node: appends.Appender,
        transport: asyncio.Transport,
        send: Callable[[bytes], None],
        on_append: Callable[[], None],
        budget: StreamBudget,
        frame_timeout: float = 10.0,
        close: Callable[[str], None] | None = None,
    ) -> None:
        self._node = node
        self._transport = transport
        self._send = send
        self._on_append = on_append
        self._budget = budget
        self._pending: set[asyncio.Task[None]] = set()
        self._paused = False
        self._holds: dict[str, int] = {}  # why the connection is not read (each a count)
        self._reserved: Ticket | None = None  # the bytes of the frame being received
        self._reserving = False  # waiting for them (the connection is not read meanwhile)
        self._waiting: set[asyncio.Task[None]] = set()  # for room in the budgets
        # A frame whose bytes are reserved must arrive whole this soon, or the connection is
        # closed: a client that sends lengths and no bodies holds no budget for long.
        self._frame_timeout = frame_timeout
        self._close = close if close is not None else lambda _: transport.close()
        self._deadline: asyncio.TimerHandle | None = None

    def hold(self, why: str) -> None:
        """Stop reading the connection (until `unhold(why)` as often)."""
        if not self._holds and not self._transport.is_closing():
            self._transport.pause_reading()
        self._holds[why] = self._holds.get(why, 0) + 1

    def unhold(self, why: str) -> None:
        left = self._holds.get(why, 0) - 1
        if left > 0:
            self._holds[why] = left
            return
        self._holds.pop(why, None)
        if not self._holds and not self._transport.is_closing():
            self._transport.resume_reading()

    def expect(self, length: int) -> None:
        """A frame of `length` bytes is being received: its bytes are taken from the budgets
        before the connection's buffer grows to hold it; if they do not fit, the
        connection is not read until they do."""
        if self._reserved is not None or self._reserving:
            return
        if not self._waiting:  # (else behind the frames that wait: the connection is held)
            self._reserved = self._budget.try_admit(length, announced=True)
        if self._reserved is None:
            self._reserving = True
            self._wait(self._reserve(length))
        else:
            self._arm(length)

    def _arm(self, length: int) -> None:
        self._deadline = asyncio.get_running_loop().call_later(
            self._frame_timeout,
            self._close,
            f"an append of {length} bytes did not arrive "
            f"whole within {self._frame_timeout:g} s of its length (--lane-frame-timeout)",
        )

    def _wait(self, waiting: Coroutine[Any, Any, None]) -> None:
        self.hold("budget")
        task = asyncio.get_running_loop().create_task(waiting)
        self._waiting.add(task)
        task.add_done_callback(self._waited)

    def _waited(self, task: asyncio.Task[None]) -> None:
        self._waiting.discard(task)
        self.unhold("budget")

    async def _reserve(self, length: int) -> None:
        try:
            self._reserved = await self._budget.admit(length, announced=True)
        finally:
            self._reserving = False
        self._arm(length)

    def frame(self, raw: bytes | memoryview) -> str:
        """Take one frame (parsed at once: a view of the connection's buffer is valid only
        during the call); returns why the connection must close ("" to go on)."""
        try:
            request = parse(pb.AppendRequest, raw)
        except Exception as exc:
            return f"a frame does not parse as AppendRequest: {exc}"
        self._on_append()
        ticket, self._reserved = self._reserved, None
        if ticket is not None:
            ticket.arrived()
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        if ticket is None:  # it came whole with its length (within one read)
            ticket = self._budget.try_admit(len(raw))
        if ticket is None:
            self._wait(self._admitted(request, len(raw)))
        else:
            self._start(request, ticket)
        return ""

    async def _admitted(self, request: pb.AppendRequest, size: int) -> None:
        self._start(request, await self._budget.admit(size))

    def _start(self, request: pb.AppendRequest, ticket: Ticket) -> None:
        task = asyncio.get_running_loop().create_task(self._one(request, ticket))
        self._pending.add(task)
        task.add_done_callback(self._finished)
        if len(self._pending) >= self.MAX_IN_FLIGHT and not self._paused:
            self._paused = True
            self.hold("count")

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            # A bug (refusals and storage faults are answered): there is no answer to give,
            # so close the connection, which fails every append pending on it at the client
            # at once (as the AppendStream ends with INTERNAL) instead of at its deadline.
            log.error("an append on a lane failed, closing the lane", exc_info=exc)
            self._transport.close()
            return
        if self._paused and len(self._pending) <= self.MAX_IN_FLIGHT // 2:
            self._paused = False
            self.unhold("count")

    async def _one(self, request: pb.AppendRequest, ticket: Ticket) -> None:
        try:
            response = await appends.answer(self._node, request, False)
            ticket.answered()
            self._send(response.SerializeToString())
        finally:
            ticket.sent()

    def lost(self) -> None:
        """The connection is gone: appends still running go on to their outcome (as a
        cancelled gRPC call's do not; the client re-sends an unknown outcome in its session
        either way), their answers dropped; those still waiting for room never start."""
        self._pending.clear()
        if self._deadline is not None:
            self._deadline.cancel()
        for task in list(self._waiting):
            task.cancel()
        if self._reserved is not None:
            self._reserved.sent()
            self._reserved = None
