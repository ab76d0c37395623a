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

from collections.abc import Iterator

from rlog.packed import run_count
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.protowire import varint

FETCH_CHUNK_BYTES = 4 * 1024 * 1024  # values per answer (at least one record), as a Read's
# The position bound of an answer is high: runs of small values cost per run, not per
# position, and catch-up moves whole logs.
FETCH_CHUNK_POSITIONS = 16384
DEFAULT_MAX_ACTIONS = 4096

_ACTIONS_TAG = b"\x0a"  # FetchResponse.actions = 1, length-delimited
_RUNS_TAG = b"\x1a"  # FetchResponse.runs = 3, length-delimited


def answer(begin: int, records: list[pb.Action | pb.Run]) -> bytes:
    """The serialized FetchResponse(begin, actions and runs = `records`, in order)."""
    parts = [pb.FetchResponse(begin=begin).SerializeToString()]
    for record in records:
        body = record.SerializeToString()
        tag = _RUNS_TAG if isinstance(record, pb.Run) else _ACTIONS_TAG
        parts += (tag, varint(len(body)), body)
    return b"".join(parts)


def fetch_answers(core: ReplicaCore, request: pb.FetchRequest) -> Iterator[bytes]:
    """Learned records from `from` to `to` held here, in answers bounded in positions and
    bytes, up to `max_actions` positions and the first position this replica has not
    learned: stored runs go as runs (their bytes as stored), other positions as actions.
    An empty answer (its `begin` only) if there is nothing to send."""
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
        yield answer(core.begin, records)
    if sent == 0:
        yield answer(core.begin, [])
