"""Recovery: a replica that is not VOTING asks its peers' recover info until a round decides
(`protocol.recover.RecoverRound`), then acts on the decision, until it is VOTING:

- a quorum answered VOTING: catch up on their [begin, end] (`catchup.catch_up`), then adopt
  their highest promise and turn VOTING in one durable batch;
- auto-initialization (with the permit): EMPTY -> STARTING once every replica answered EMPTY
  or STARTING, then STARTING -> VOTING once every replica answered STARTING or VOTING.

An undecided round says why (`RecoverRound.reason()`); recovery reports that reason and the
catch-up's progress to the replica (`Report`) instead of keeping state of its own.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.peer_version import PROTOCOL
from rlog.protocol.recover import Decision, Next, RecoverRound
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.catchup import Progress, catch_up
from rlog.runtime.journal import Journal
from rlog.runtime.peers import Peer, Peers
from rlog.wire import ErrorDetails, Reason

log = logging.getLogger("rlog.node")


@dataclass(frozen=True)
class Report:
    """What recovery tells the replica as it goes (shown by `Status` and the metrics)."""

    reason: Callable[[str], None]  # why the replica is not VOTING yet
    progress: Progress  # how far the catch-up is
    changed: Callable[[], None]  # the replica's status changed (after each decision)
    undecided: Callable[[], None] = lambda: None  # a round ended undecided


async def recover(
    core: ReplicaCore,
    journal: Journal,
    peers: Peers,
    config: ReplicaConfig,
    permit: Callable[[], bool],
    report: Report,
) -> None:
    """Return once this replica is VOTING: recover rounds until one decides, then act on the
    decision. `permit` is read at each round (the operator grants it at any time)."""
    while core.status != pb.VOTING:
        decision = await _recover_round(core, peers, config, permit(), report)
        if decision is None:
            await asyncio.sleep(random.uniform(0.5, 1.0))
            continue
        if decision.next == Next.STARTING:
            log.info("auto-initialization: EMPTY -> STARTING")
            await journal.persist(core.set_status(pb.STARTING))
        elif decision.next == Next.VOTING:
            log.info("auto-initialization: STARTING -> VOTING")
            await journal.persist(core.set_status(pb.VOTING))
        else:
            await _catch_up(core, journal, peers, config, decision, report)
        report.changed()


async def _recover_round(
    core: ReplicaCore, peers: Peers, config: ReplicaConfig, permit: bool, report: Report
) -> Decision | None:
    round_ = RecoverRound(len(config.peers), core.status, permit, config.log_id)
    decision = round_.add(config.id, recover_info(core, config.log_id))
    if decision is not None:
        return decision
    request = pb.RecoverRequest(log_id=config.log_id, protocol=PROTOCOL)

    async def ask(peer: Peer) -> tuple[int, pb.RecoverResponse | None]:
        try:
            return peer.id, await peer.replica.Recover(request, timeout=2.0)
        except grpc.aio.AioRpcError as exc:
            details = ErrorDetails.from_metadata(exc.trailing_metadata())
            if details is not None and details.reason == Reason.LOG_ID_MISMATCH:
                round_.foreign[peer.id] = exc.details() or "another log"  # it refused us
            elif details is not None and details.reason == Reason.PROTOCOL_TOO_OLD:
                round_.newer[peer.id] = exc.details() or "a newer build"  # it refused us
            return peer.id, None

    for next_reply in asyncio.as_completed([ask(p) for p in peers.values()]):
        replica, response = await next_reply
        if response is not None:
            decision = round_.add(replica, response)
            if decision is not None:
                return decision
    reason = round_.reason()
    report.reason(reason)
    report.undecided()
    log.info("recover round undecided (%s): %s", pb.Status.Name(core.status), reason)
    return None


async def _catch_up(
    core: ReplicaCore,
    journal: Journal,
    peers: Peers,
    config: ReplicaConfig,
    decision: Decision,
    report: Report,
) -> None:
    if core.status != pb.RECOVERING:
        await journal.persist(core.set_status(pb.RECOVERING))
    report.reason(f"catching up [{decision.begin}, {decision.end}]")
    report.changed()
    await catch_up(core, peers, config, decision, report.progress, journal.durable)
    await journal.persist(core.finish_recovery(decision.promised))
    log.info("caught up to %d: RECOVERING -> VOTING (promised %d)", decision.end, core.promised)


def recover_info(core: ReplicaCore, log_id: str) -> pb.RecoverResponse:
    """This replica's answer to a recover round: its status, and its [begin, end] and
    promise if it is VOTING (only a VOTING replica's log is complete enough to copy)."""
    response = pb.RecoverResponse(status=core.status, log_id=log_id)
    if core.status == pb.VOTING:
        response.begin = core.begin
        response.end = core.end
        response.promised = core.promised
    return response
