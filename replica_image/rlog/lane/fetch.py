"""The fetch lane: a catching-up replica's Fetch calls on a peer's lane instead of gRPC
(docs/data-path.md, "Fetch and catch-up").

A catch-up moves the whole log through Fetch answers of a few megabytes each. On gRPC every
answer is received into gRPC's buffers, joined into one new bytes object (a copy, and fresh
pages for the joined bytes) and parsed; on a lane (`LaneHello.kind` = LANE_FETCH) the
answers a span needs arrive as one frame, read straight into the connection's buffer
(`FrameBuffer`) and parsed where they lie. A request is a `FetchRequest` with an id and a
`max_bytes`; its answer a `FetchAnswers` with that id: the answers a Fetch call would
stream, up to `max_bytes` of values, and `cut` when it stopped there.

As the write lane: it opens in the background and is used only while open (the copy uses
the gRPC call until then, and whenever the lane is down or refused: a replica without fetch
lanes refuses the kind); TLS and the roles as on the gRPC port (`Fetch` needs the peer
role). The serving replica builds an answer whole on its event loop, as it streams a Fetch
call's, and reads no further request from that connection while answers of more than
`server.FETCH_UNSENT` bytes wait unsent.
"""

from __future__ import annotations

import functools
import ssl
from collections.abc import Callable

from rlog.lane.framed import KINDS_VERSION, CallingLane, Destination, FramedCaller, parse
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.peer_version import PROTOCOL
from rlog.runtime.fetch import LANE_MAX_BYTES

# An answer frame holds at most LANE_MAX_BYTES of values past its first answer (4 MiB of
# values, FETCH_CHUNK_BYTES) and their framing; a frame over this is refused.
MAX_ANSWER = LANE_MAX_BYTES + 16 * 1024 * 1024


class FetchLane(CallingLane[pb.FetchAnswers]):
    """A catching-up replica's fetch lane to one peer."""

    def __init__(
        self,
        host: str,
        port: int,
        log_id: str,
        replica_id: int,
        connect_timeout: float,
        tls: Callable[[], ssl.SSLContext | None] = lambda: None,
    ) -> None:
        self.host, self.port = host, port
        self._log_id = log_id
        hello = pb.LaneHello(
            version=KINDS_VERSION, log_id=log_id, replica_id=replica_id, kind=pb.LANE_FETCH
        )

        async def locate() -> Destination:
            return Destination(host, port, hello, tls())  # a fresh TLS context each time

        self._caller: FramedCaller[pb.FetchAnswers] = FramedCaller(
            locate,
            functools.partial(parse, pb.FetchAnswers),
            connect_timeout,
            max_answer=MAX_ANSWER,
            # The connection keeps a buffer this large for the next answer (a span's
            # answers arrive as one frame of megabytes each time).
            answer_keep=MAX_ANSWER,
        )

    async def fetch(
        self, first: int, last: int, max_actions: int, max_bytes: int, time_limit: float
    ) -> pb.FetchAnswers:
        """The answers to Fetch(first, last, max_actions), up to `max_bytes` of values.
        Raises TimeoutError or ConnectionBroken (the request may have been served). Only
        while `usable()`."""
        request_id = self._caller.next_id()
        request = pb.FetchRequest(
            to=last,
            max_actions=max_actions,
            id=request_id,
            max_bytes=max_bytes,
            log_id=self._log_id,
            protocol=PROTOCOL,
        )
        setattr(request, "from", first)  # a Python keyword
        return await self._caller.send(request_id, [request.SerializeToString()], time_limit)
