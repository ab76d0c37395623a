"""Hostile peer messages against the pure replica core (docs/faults.md, "Hostile input").

The peer service trusts its callers for content (a forged write may change the log), but no
message may break the replica: each request gets an answer, and whatever it stores can be
read back afterwards. Before `well_formed`, a learned run with bad offsets or a position past
uint64 was stored as it came and every later promise, write or read over it raised.
"""

from __future__ import annotations

from fuzzlib import examples, message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rlog.proto import rlog_pb2 as pb
from rlog.protocol.records import MAX_POSITION
from rlog.protocol.replica import ReplicaCore
from rlog.storage.base import WriteBatch
from rlog.storage.memory import MemoryStorage


def voting_core() -> ReplicaCore:
    replica = ReplicaCore(MemoryStorage())
    persist(replica, replica.set_status(pb.VOTING))
    return replica


def persist(replica: ReplicaCore, batch: WriteBatch | None) -> None:
    if batch is not None:
        replica.storage.apply(batch)
        replica.persisted(batch)


def handle(
    replica: ReplicaCore, request: pb.PromiseRequest | pb.WriteRequest | pb.LearnedRequest
) -> None:
    if isinstance(request, pb.PromiseRequest):
        reply = replica.on_promise(request)
        assert isinstance(reply.response, pb.PromiseResponse)
        persist(replica, reply.persist)
    elif isinstance(request, pb.WriteRequest):
        reply = replica.on_write(request)
        assert isinstance(reply.response, pb.WriteResponse)
        persist(replica, reply.persist)
    else:
        persist(replica, replica.on_learned(request))


def readable(replica: ReplicaCore) -> None:
    """Every record the replica holds reads back, position by position."""
    lo, hi = replica.begin, min(replica.end, replica.begin + 64)
    for record in replica.records(lo, hi):
        assert isinstance(record, (pb.Action, pb.Run))
    for position in range(lo, hi + 1):
        replica.get(position)


requests = st.one_of(
    message(pb.PromiseRequest.DESCRIPTOR),
    message(pb.WriteRequest.DESCRIPTOR),
    message(pb.LearnedRequest.DESCRIPTOR),
)


@given(sequence=st.lists(requests, min_size=1, max_size=8))
@settings(
    max_examples=examples(200),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
def test_random_peer_messages_never_break_the_core(
    sequence: list[pb.PromiseRequest | pb.WriteRequest | pb.LearnedRequest],
) -> None:
    replica = voting_core()
    for request in sequence:
        handle(replica, request)
        readable(replica)


def run(first: int, values: list[bytes], proposal: int = 1) -> pb.Run:
    offsets = [0]
    for value in values:
        offsets.append(offsets[-1] + len(value))
    return pb.Run(
        first=first,
        head=pb.Action(type=pb.APPEND, performed=proposal, promised=proposal),
        data=b"".join(values),
        offsets=b"".join(o.to_bytes(4, "little") for o in offsets),
    )


def test_a_learned_run_with_bad_offsets_is_not_taken() -> None:
    replica = voting_core()
    bad = run(1, [b"a", b"b"])
    bad.offsets = bad.offsets[:-1]  # 11 bytes: not count+1 uint32 values
    assert replica.on_learned(pb.LearnedRequest(proposal=1, runs=[bad])) is None
    # Nothing was held: a promise over those positions reads them as empty.
    reply = replica.on_promise(pb.PromiseRequest(proposal=5, positions=[1, 2]))
    assert reply.response.verdict == pb.ACCEPT
    assert [a.value for a in reply.response.actions] == [b"", b""]


def test_positions_past_uint64_are_not_taken() -> None:
    replica = voting_core()
    begin = replica.begin
    over = run(MAX_POSITION, [b"a", b"b"])  # its last position would be 2**64 - 1
    write = replica.on_write(pb.WriteRequest(proposal=1, runs=[over]))
    assert write.response.verdict == pb.IGNORED and write.persist is None
    last = pb.Action(position=MAX_POSITION + 1, type=pb.NOP, tombstone=True)
    assert replica.on_learned(pb.LearnedRequest(proposal=1, actions=[last])) is None
    assert replica.begin == begin
    # The highest position allowed is taken, and a tombstone there moves begin past it.
    stone = pb.Action(position=MAX_POSITION, type=pb.NOP, tombstone=True)
    persist(replica, replica.on_learned(pb.LearnedRequest(proposal=1, actions=[stone])))
    assert replica.begin == MAX_POSITION + 1
