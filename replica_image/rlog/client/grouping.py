"""Exactly-once appends without conditions, coalesced above the session layer into groups
(`AppendGroups`, docs/protocol.md, "Coalescing above the session")."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import grpc

from rlog.client.append_stream import AppendStream
from rlog.client.errors import (
    InvalidArgument,
    OutcomeUnknown,
    OutcomeUnknownTimeout,
    RlogError,
    Timeout,
)
from rlog.client.packing import Payload, joined
from rlog.proto import rlog_pb2 as pb

# An append in the client's session (values, its session fields, deadline): its positions.
SendInSession = Callable[[Payload, pb.AppendRequest, float | None], Awaitable[Sequence[int]]]


@dataclass(slots=True)
class _Waiting:
    """An append waiting for a group: its values, its caller's deadline, its result."""

    values: Payload
    deadline: float | None
    future: asyncio.Future[Sequence[int]]
    group_deadline: float | None = None  # set when its group is formed


class AppendGroups:
    """Exactly-once appends without conditions, coalesced above the session layer.

    Appends from concurrent callers that are waiting to be sent are merged into one group;
    a group takes ONE (session, sequence) and travels as ONE AppendRequest (unary or on the
    stream): one atomic batch and one dedupe unit, re-sent whole with the same sequence
    while its outcome is unknown; the answer's positions are split back to each caller in
    order. Groups form under back-pressure: at most `MAX_IN_FLIGHT` are in flight, and
    appends arriving meanwhile wait and form the next ones. A group refused as invalid
    (nothing appended: a bad value) is re-sent part by part with fresh sequences, so one
    caller's bad value never fails another's append.

    Deadlines: a group retries until the latest deadline of its callers (the last to
    arrive); each caller waits until its own, then raises `OutcomeUnknownTimeout` while the
    group goes on for the others. A caller that stops waiting before its group is sent is
    taken out of the queue (never sent)."""

    MAX_IN_FLIGHT = 4
    MAX_VALUES = AppendStream.MAX_COALESCED_VALUES
    MAX_BYTES = AppendStream.MAX_COALESCED_BYTES

    def __init__(self, send: SendInSession) -> None:
        self._send_in_session = send  # one append in the client's session, retried as needed
        self._waiting: collections.deque[_Waiting] = collections.deque()
        self._in_flight = 0
        self._forming = False  # a `_send_more` is scheduled for the end of this loop turn
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        # Groups sent (a group re-sent after an unknown outcome counts once).
        self.groups = 0

    async def append(self, values: Payload, deadline: float | None) -> Sequence[int]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Sequence[int]] = loop.create_future()
        # Retrieve the outcome even if the caller stopped waiting (no "never retrieved").
        future.add_done_callback(lambda f: f.cancelled() or f.exception())
        waiting = _Waiting(values, deadline, future)
        self._waiting.append(waiting)
        self._send_soon()
        # The caller's deadline is a timer that settles its future, not a `wait_for` (a
        # waiter future, a shield and their callbacks per append: a tenth of the client's
        # CPU with 64 writers). Whoever settles the future first wins; the group skips a
        # caller whose future is done.
        expiry = None
        if deadline is not None:
            remaining = max(deadline - loop.time(), 0.001)
            expiry = loop.call_later(remaining, self._expire, waiting, remaining)
        try:
            return await future
        except asyncio.CancelledError:
            self._withdraw(waiting)
            raise
        finally:
            if expiry is not None:
                expiry.cancel()

    def _expire(self, waiting: _Waiting, remaining: float) -> None:
        """The caller's deadline passed before its group answered."""
        if waiting.future.done():
            return
        if self._withdraw(waiting):
            waiting.future.set_exception(
                Timeout(
                    f"the append timed out after {remaining:g} s waiting to be sent: nothing sent",
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
            )
        elif waiting.group_deadline != waiting.deadline:
            waiting.future.set_exception(
                OutcomeUnknownTimeout(
                    f"the append timed out after {remaining:g} s while its group was still "
                    "being retried: outcome unknown",
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
            )
        # Else the group's deadline is this caller's: its verdict (the server's error, its
        # endpoint) is due now and says more than a bare timeout; the group settles it.

    def _withdraw(self, waiting: _Waiting) -> bool:
        """Take a waiting append out of the queue; False if its group was already formed."""
        try:
            self._waiting.remove(waiting)
        except ValueError:
            return False
        return True

    def _send_soon(self) -> None:
        """Form groups at the end of this loop turn, not now: callers woken together (the
        writers a finished group answered) append one after the other within one turn, and
        forming a group at the first of them sent it alone and left the rest to wait a whole
        round trip for the next."""
        if not self._forming:
            self._forming = True
            asyncio.get_running_loop().call_soon(self._send_more)

    def _send_more(self) -> None:
        self._forming = False
        while not self._closed and self._waiting and self._in_flight < self.MAX_IN_FLIGHT:
            group = [self._waiting.popleft()]
            count, size = group[0].values.count, group[0].values.size
            while self._waiting:
                following = self._waiting[0]
                extra = following.values.size
                if count + following.values.count > self.MAX_VALUES or (
                    size + extra > self.MAX_BYTES
                ):
                    break
                group.append(self._waiting.popleft())
                count += following.values.count
                size += extra
            self._in_flight += 1
            self.groups += 1
            task = asyncio.get_running_loop().create_task(self._send(group))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _send(self, group: list[_Waiting]) -> None:
        try:
            await self._send_group(group)
        finally:
            self._in_flight -= 1
            self._send_soon()

    async def _send_group(self, group: list[_Waiting]) -> None:
        deadlines = [w.deadline for w in group]
        deadline = None if None in deadlines else max(d for d in deadlines if d is not None)
        for waiting in group:
            waiting.group_deadline = deadline
        values = joined([w.values for w in group])
        try:
            positions = await self._send_in_session(values, pb.AppendRequest(), deadline)
            if len(positions) != values.count:
                raise RlogError(
                    f"the server returned {len(positions)} positions for {values.count} values"
                )
        except InvalidArgument as error:
            if len(group) == 1 or isinstance(error, OutcomeUnknown):
                _fail(group, error)
                return
            # Nothing of the group was appended: each part alone, in a fresh sequence.
            await asyncio.gather(*(self._send_group([w]) for w in group))
            return
        except asyncio.CancelledError:
            _fail(group, RlogError("the client is closed"))
            raise
        except Exception as error:
            _fail(group, error)
            return
        for waiting in group:
            count = waiting.values.count
            taken, positions = positions[:count], positions[count:]
            if not waiting.future.done():
                waiting.future.set_result(taken)

    async def close(self) -> None:
        self._closed = True
        tasks, self._tasks = self._tasks, set()
        for task in list(tasks):
            task.cancel()
        for task in list(tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        waiting, self._waiting = self._waiting, collections.deque()
        _fail(list(waiting), RlogError("the client is closed"))


def _fail(group: list[_Waiting], error: BaseException) -> None:
    for waiting in group:
        if not waiting.future.done():
            waiting.future.set_exception(error)


__all__ = ["AppendGroups"]
