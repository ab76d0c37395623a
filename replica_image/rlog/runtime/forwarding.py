"""Forwarding: a replica that does not lead passes appends, truncations and consistent reads
to the leader it hears from, marked `FORWARDED` so the leader never forwards them again.

The caller's retry rule must stay exact across the extra hop: a forwarded call that broke
after it may have reached the leader has an unknown outcome (reason OUTCOME_UNKNOWN, see
`RpcError.from_leader`), never a plain UNAVAILABLE that a client would retry into a
duplicate append.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass

import grpc

from rlog.client.packing import answered_positions
from rlog.client.wire import FORWARDED, Reason
from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import NO_CONDITIONS, Conditions
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.errors import RpcError
from rlog.runtime.peers import Peer


@dataclass(frozen=True)
class KnownLeader:
    """What this replica knows of the leader right now (the election keeps it current)."""

    leading: bool  # this replica leads
    leader_id: int | None  # the leader last heard from, if any
    heard_ago: float  # seconds of election time since it was last heard from
    reason: str  # why this replica cannot serve, if it says


class Forwarding:
    def __init__(
        self,
        config: ReplicaConfig,
        core: ReplicaCore,
        peers: Mapping[int, Peer],
        known_leader: Callable[[], KnownLeader],
    ) -> None:
        self.config = config
        self.core = core
        self.peers = peers
        self.known_leader = known_leader

    async def await_leader(self, forwarded: bool) -> Peer | None:
        """None if this replica leads; else the leader's peer. Waits for an election."""
        deadline = time.monotonic() + 3 * self.config.election_timeout + 1
        while True:
            known = self.known_leader()
            if known.leading:
                return None
            if self.core.status != pb.VOTING and not forwarded and known.leader_id is None:
                raise RpcError(
                    Reason.NO_LEADER,
                    f"no leader: this replica is {pb.Status.Name(self.core.status)}"
                    + (f" ({known.reason})" if known.reason else ""),
                )
            if (
                not forwarded
                and known.leader_id is not None
                and known.leader_id != self.config.id
                and known.heard_ago < 2 * self.config.election_timeout
            ):
                return self.peers[known.leader_id]
            if time.monotonic() > deadline:
                raise RpcError(
                    Reason.NOT_LEADER if forwarded else Reason.NO_LEADER,
                    "this replica is not the leader"
                    if forwarded
                    else "no leader elected: a quorum of VOTING replicas may be unreachable",
                )
            await asyncio.sleep(0.02)

    async def append(
        self,
        leader: Peer,
        data: bytes,
        offsets: bytes,
        conditions: Conditions = NO_CONDITIONS,
    ) -> list[int]:
        """Forward an append (packed values) to the leader, with its conditions and
        session; its positions."""
        request = pb.AppendRequest(
            data=data,
            offsets=offsets,
            session=conditions.session,
            sequence=conditions.sequence,
            acked_below=conditions.acked_below,
            epoch=conditions.epoch,
        )
        if conditions.if_next is not None:
            request.if_next = conditions.if_next
        result = await self._forwarded_call(
            leader.log.Append(
                request,
                metadata=((FORWARDED, "1"),),
                timeout=self.config.append_timeout + 5,
            )
        )
        return list(answered_positions(result))

    async def truncate(self, leader: Peer, to: int) -> int:
        """Forward a truncation to the leader; the position of its TRUNCATE entry."""
        response = await self._forwarded_call(
            leader.log.Truncate(
                pb.TruncateRequest(to=to),
                metadata=((FORWARDED, "1"),),
                timeout=self.config.append_timeout + 5,
            )
        )
        return int(response.position)

    async def take_epoch(self, leader: Peer) -> pb.TakeEpochResponse:
        response: pb.TakeEpochResponse = await self._forwarded_call(
            leader.log.TakeEpoch(
                pb.TakeEpochRequest(),
                metadata=((FORWARDED, "1"),),
                timeout=self.config.append_timeout + 5,
            )
        )
        return response

    async def open_session(self, leader: Peer) -> pb.OpenSessionResponse:
        response: pb.OpenSessionResponse = await self._forwarded_call(
            leader.log.OpenSession(
                pb.OpenSessionRequest(),
                metadata=((FORWARDED, "1"),),
                timeout=self.config.append_timeout + 5,
            )
        )
        return response

    @staticmethod
    async def _forwarded_call(call):  # type: ignore[no-untyped-def]
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise RpcError.from_leader(exc, mutating=True) from None

    async def read(
        self, leader: Peer, request: pb.ReadRequest, time_limit: float | None = None
    ) -> AsyncIterator[pb.ReadResponse]:
        """Stream a consistent read from the leader, within `time_limit` seconds if given (a
        read changes nothing: any error is passed on as it is)."""
        try:
            call = leader.log.Read(request, metadata=((FORWARDED, "1"),), timeout=time_limit)
            async for response in call:
                yield response
        except grpc.aio.AioRpcError as exc:
            raise RpcError.from_leader(exc, mutating=False) from None
