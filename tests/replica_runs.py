"""Runs on a pure replica core (rlog.protocol.replica), for the rule tests: a run of values,
written at a proposal, its range learned, each persisted as the rule asks."""

from __future__ import annotations

from rlog.packed import make_run, pack
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore, Reply
from rlog.storage import WriteBatch


def apply(replica: ReplicaCore, batch: WriteBatch | None) -> None:
    if batch is not None:
        replica.storage.apply(batch)
        replica.persisted(batch)


def run_of(first: int, values: list[bytes], origin: int = 1) -> pb.Run:
    data, offsets = pack(values)
    last = first + len(values) - 1
    head = pb.Action(
        type=pb.APPEND,
        origin_proposal=origin,
        origin_leader=0,
        batch_first=first if len(values) > 1 else 0,
        batch_last=last if len(values) > 1 else 0,
    )
    return make_run(first, head, data, offsets)


def write_run(replica: ReplicaCore, proposal: int, run: pb.Run, persist: bool = True) -> Reply:
    reply = replica.on_write(pb.WriteRequest(proposal=proposal, runs=[run]))
    if persist:
        apply(replica, reply.persist)
    return reply


def learn_range(replica: ReplicaCore, proposal: int, first: int, last: int) -> None:
    request = pb.LearnedRequest(
        proposal=proposal, ranges=[pb.PositionRange(first=first, last=last)]
    )
    apply(replica, replica.on_learned(request))
