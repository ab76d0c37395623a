"""The client's append lane, the replica's side (docs/data-path.md, "The client's append
lane"): a client's `AppendRequest`s on a lane connection (`framed`), each answered
with the `AppendResponse` the `AppendStream` would send (its id, its positions or its
error's code, message and reason), in the order they finish.

An append on the lane is an `Append` call in all but its transport: the same packed
values, conditions and session, the same `CoordinatorDriver.append` (a follower forwards it
to the leader), the same errors. What the lane saves is gRPC's cost per call on both sides,
about half a millisecond of a serial append's round trip.

A client that sends faster than its appends finish is held back: past `MAX_IN_FLIGHT`
appends pending on one connection the replica stops reading it until half of them are
answered (the socket's buffers then push back on the client), as gRPC's flow control and
`--max-concurrent-rpcs` bound a stream.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rlog.lane.framed import parse
from rlog.proto import rlog_pb2 as pb
from rlog.runtime import appends

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
    ) -> None:
        self._node = node
        self._transport = transport
        self._send = send
        self._on_append = on_append
        self._pending: set[asyncio.Task[None]] = set()
        self._paused = False

    def frame(self, raw: bytes | memoryview) -> str:
        """Take one frame (parsed at once: a view of the connection's buffer is valid only
        during the call); returns why the connection must close ("" to go on)."""
        try:
            request = parse(pb.AppendRequest, raw)
        except Exception as exc:
            return f"a frame does not parse as AppendRequest: {exc}"
        self._on_append()
        task = asyncio.get_running_loop().create_task(self._one(request))
        self._pending.add(task)
        task.add_done_callback(self._finished)
        if len(self._pending) >= self.MAX_IN_FLIGHT and not self._paused:
            self._paused = True
            self._transport.pause_reading()
        return ""

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
            if not self._transport.is_closing():
                self._transport.resume_reading()

    async def _one(self, request: pb.AppendRequest) -> None:
        response = await appends.answer(self._node, request, False)
        self._send(response.SerializeToString())

    def lost(self) -> None:
        """The connection is gone: appends still running go on to their outcome (as a
        cancelled gRPC call's do not; the client re-sends an unknown outcome in its session
        either way), their answers dropped."""
        self._pending.clear()
