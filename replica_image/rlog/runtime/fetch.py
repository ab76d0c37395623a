"""Serving `Fetch`: a peer's learned records, answered as serialized `FetchResponse` bytes.

An answer holds up to FETCH_CHUNK_BYTES of values (a few stored runs when values are large).
Protobuf serializes a message of several megabytes slowly (it grows its buffer as it goes,
and copies every run into the message first); a repeated field is, on the wire, only its
elements one after another, each a tag, a length and the element's bytes. So each record is
serialized on its own and the answer is the records' bytes joined: the same bytes a parser
reads as the `FetchResponse` with those records, at the cost of one copy. The server passes
bytes answers through as they are (`runtime/server.py`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from rlog.packed import run_bytes, run_count
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.protowire import varint

FETCH_METHOD = "/rlog.v1.Replica/Fetch"  # what a fetch lane stands in for, to the roles
FETCH_CHUNK_BYTES = 4 * 1024 * 1024  # values per answer (at least one record), as a Read's
# The position bound of an answer is high: runs of small values cost per run, not per
# position, and catch-up moves whole logs.
FETCH_CHUNK_POSITIONS = 16384
DEFAULT_MAX_ACTIONS = 4096

_ACTIONS_TAG = b"\x0a"  # FetchResponse.actions = 1, length-delimited
_RUNS_TAG = b"\x1a"  # FetchResponse.runs = 3, length-delimited


def answer_parts(begin: int, records: list[pb.Action | pb.Run]) -> list[bytes]:
    """The serialized FetchResponse(begin, actions and runs = `records`, in order), in
    parts (their concatenation is the message)."""
    parts = [pb.FetchResponse(begin=begin).SerializeToString()]
    for record in records:
        body = record.SerializeToString()
        tag = _RUNS_TAG if isinstance(record, pb.Run) else _ACTIONS_TAG
        parts += (tag, varint(len(body)), body)
    return parts


def answer(begin: int, records: list[pb.Action | pb.Run]) -> bytes:
    """The serialized FetchResponse(begin, actions and runs = `records`, in order)."""
    return b"".join(answer_parts(begin, records))


def value_bytes(records: Iterable[pb.Action | pb.Run]) -> int:
    """Bytes of values the records hold (what a copy bounds its spans by)."""
    return sum(run_bytes(r) if isinstance(r, pb.Run) else len(r.value) for r in records)


def answer_bytes(chunk: pb.FetchResponse) -> int:
    """Bytes of values a Fetch answer holds."""
    return value_bytes(itertools.chain(chunk.runs, chunk.actions))


def _answer_records(
    core: ReplicaCore, request: pb.FetchRequest
) -> Iterator[tuple[list[pb.Action | pb.Run], bool]]:
    """The records of each answer to `request`, and whether it is the last the request
    allows (its range or `max_actions` reached; False may also end at the first position
    this replica has not learned, found by the next read). Nothing if there is nothing."""
    first = max(getattr(request, "from"), core.begin)
    last = min(request.to, core.end)
    limit = request.max_actions or DEFAULT_MAX_ACTIONS
    sent = 0
    while first <= last and sent < limit:
        records = core.learned_records(
            first, last, min(FETCH_CHUNK_POSITIONS, limit - sent), FETCH_CHUNK_BYTES
        )
        if not records:
            break
        for record in records:
            count = run_count(record) if isinstance(record, pb.Run) else 1
            first = (record.first if isinstance(record, pb.Run) else record.position) + count
            sent += count
        yield records, not (first <= last and sent < limit)


def fetch_answers(core: ReplicaCore, request: pb.FetchRequest) -> Iterator[bytes]:
    """Learned records from `from` to `to` held here, in answers bounded in positions and
    bytes, up to `max_actions` positions and the first position this replica has not
    learned: stored runs go as runs (their bytes as stored), other positions as actions.
    An empty answer (its `begin` only) if there is nothing to send."""
    sent = False
    for records, _ in _answer_records(core, request):
        sent = True
        yield answer(core.begin, records)
    if not sent:
        yield answer(core.begin, [])


# A fetch lane's answer holds at most this many bytes of values past its first answer,
# whatever the request asks (`max_bytes` 0 or more): one frame, built whole in memory.
LANE_MAX_BYTES = 32 * 1024 * 1024
_ID_TAG = b"\x08"  # FetchAnswers.id = 1, varint
_ANSWERS_TAG = b"\x12"  # FetchAnswers.answers = 2, length-delimited
_CUT = b"\x18\x01"  # FetchAnswers.cut = 3, true


def lane_answers(core: ReplicaCore, request: pb.FetchRequest) -> list[bytes]:
    """A fetch lane's answer to `request`: the serialized FetchAnswers holding the answers
    `fetch_answers` would stream, up to `max_bytes` of values (LANE_MAX_BYTES at most), in
    parts for the connection to send as they are (no joined copy)."""
    bound = min(request.max_bytes or LANE_MAX_BYTES, LANE_MAX_BYTES)
    parts = [_ID_TAG, varint(request.id)] if request.id else []

    def add(records: list[pb.Action | pb.Run]) -> None:  # one FetchAnswers.answers field
        body = answer_parts(core.begin, records)
        parts.extend((_ANSWERS_TAG, varint(sum(len(p) for p in body)), *body))

    held, sent, done = 0, False, True
    for records, final in _answer_records(core, request):
        done = final
        add(records)
        held += value_bytes(records)
        sent = True
        if held >= bound:
            break
    if not sent:
        add([])
    elif held >= bound and not done:
        parts.append(_CUT)
    return parts
