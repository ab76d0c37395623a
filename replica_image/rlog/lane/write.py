"""The write lane, the leader's side (docs/data-path.md, "The write lane"): a leader's
`WriteRequest`s to one follower on the follower's lane (`server`) instead of its
`WriteStream`, the same encoded requests (with their ids) one way and `WriteResponse`s the
other.

The leader opens a lane in the background and writes on it only once it is open; until
then, and whenever it is down (the peer is down, serves no lane, refuses, or a network
policy drops the port), the writes go on the gRPC stream, and the lane is tried again
after a back-off. No write ever waits for a lane to open. A connection that breaks fails
the writes sent on it with `StreamBroken`, as a broken stream does.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Callable

from rlog.lane.framed import VERSION, CallingLane, Destination, FramedCaller, parse
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.write_stream import StreamBroken, with_id


class WriteLane(CallingLane[pb.WriteResponse]):
    """The leader's write lane to one peer, with the `start`/`write`/`close` of a
    `WriteStream`. Writes go on it only while it is open (`usable()`); opening happens in
    the background (`FramedCaller`), so no write ever waits for a connection: until the
    lane is open (and while it is down) the caller uses the gRPC stream."""

    RETRY_FIRST = FramedCaller.RETRY_FIRST
    RETRY_MAX = FramedCaller.RETRY_MAX
    MAX_UNSENT = FramedCaller.MAX_UNSENT

    def __init__(
        self,
        host: str,
        port: int,
        log_id: str,
        replica_id: int,
        connect_timeout: float,
        on_open: Callable[[], None],
        max_unsent: int = MAX_UNSENT,
        tls: Callable[[], ssl.SSLContext | None] = lambda: None,
    ) -> None:
        self.host, self.port = host, port
        hello = pb.LaneHello(version=VERSION, log_id=log_id, replica_id=replica_id)

        async def locate() -> Destination:
            return Destination(host, port, hello, tls())  # a fresh TLS context each time

        self._caller: FramedCaller[pb.WriteResponse] = FramedCaller(
            locate,
            functools.partial(parse, pb.WriteResponse),
            connect_timeout,
            lambda _: on_open(),
            max_unsent,
            StreamBroken,
        )

    async def write(
        self, encoded: bytes, time_limit: float, suffix: bytes = b""
    ) -> pb.WriteResponse:
        """Send one encoded WriteRequest (no id; `suffix`: more of its fields, encoded) and
        wait for its response. Raises TimeoutError or StreamBroken. Only while `usable()`."""
        return await self.start(encoded, time_limit, suffix)

    def start(
        self, encoded: bytes, time_limit: float, suffix: bytes = b""
    ) -> asyncio.Future[pb.WriteResponse]:
        """Send one encoded WriteRequest (no id; `suffix`: more of its fields, encoded) now;
        its response, or the error `write` would raise, in the future returned. Only while
        `usable()`. The parts go to the connection as they are (no joined copy)."""
        request_id = self._caller.next_id()
        parts = [encoded, suffix + with_id(b"", request_id)]
        return self._caller.send(request_id, parts, time_limit)
