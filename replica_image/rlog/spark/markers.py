"""The sink's batch markers: how a replayed Spark task finds what it already appended.

Every append call of the sink ends with a marker entry naming (sink, batch, partition,
chunk); the driver's commit of a streaming batch appends a commit marker. A replay scans the
log for its markers and skips the chunks already there. The guarantee and its limits are in
docs/spark.md ("Exactly-once stream sink"). Pure: encoding, decoding and the search's
bookkeeping; reading the log is the sink's job (`rlog.spark.sink.find_markers`).

A marker is signed: its "tag" is an HMAC-SHA256 of its fields under the sink's key
(`secret_key`, `random_key`, `open_key`), and the search counts only markers whose tag
checks out. The sink id is in
the clear in the log, so without the tag any writer could append a marker for another
sink's (batch, partition, chunk) and make the task that replays it skip its chunk: rows
acknowledged to Spark, never in the log. Unsigned markers (`v` 1, from sinks before the
tag) are ignored like forged ones: a replay then appends those chunks again (duplicates,
never a skip). Rejected: signing with the writer's session secret, which every replay (a
new task, a new client, a new session) would have lost.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# 21 bytes no text value starts with: the source hides entries that start with them.
MARKER_MAGIC = b"\x00\xffrlog-spark-marker\x00"
MARKER_VERSION = 2  # 2: signed (the "tag")
TAG_HEX = 32  # the tag: the first 128 bits of the HMAC, in hex


def secret_key(sink_key: str | None, token: str | None, client_key: bytes | None) -> bytes | None:
    """A key to sign a sink's markers with that only this writer can make, the same again
    after a restart of the query: from the option `sinkKey` if given, else from the
    writer's own credentials (its bearer token, else its client certificate's private key:
    another writer with other credentials cannot sign). None if it has neither."""
    if sink_key:
        return hashlib.sha256(b"rlog-spark-sink-key\0" + sink_key.encode()).digest()
    material = token.encode() if token else client_key
    if material:
        return hmac.new(material, b"rlog-spark-sink-key", hashlib.sha256).digest()
    return None


def random_key() -> bytes:
    """A key for one writer only (the batch writer's, for one write: its tasks' retries
    share the writer, a new write has a new id anyway)."""
    return secrets.token_bytes(32)


def open_key(sink: str) -> bytes:
    """The stream sink's key without a secret (no `sinkKey`, no credentials): anyone can
    make it from the sink id, so it protects nothing, as the log itself protects nothing
    from a writer without credentials; it keeps a replay after a restart of the query
    exactly once (docs/spark.md, "Exactly-once stream sink")."""
    return hashlib.sha256(b"rlog-spark-open-sink-key\0" + sink.encode()).digest()


def _tag(key: bytes, body: dict[str, Any]) -> str:
    fields = json.dumps(body, separators=(",", ":"), sort_keys=True).encode()
    return hmac.new(key, MARKER_MAGIC + fields, hashlib.sha256).hexdigest()[:TAG_HEX]


def encode_marker(
    sink: str,
    batch: int,
    part: int = -1,
    chunk: int = -1,
    rows: int = 0,
    kind: str = "data",
    *,
    key: bytes,
) -> bytes:
    """The value of a marker: MARKER_MAGIC + compact JSON {"v", "kind", "sink", "batch"} and,
    for a data marker, "part", "chunk" and "rows" (the values appended before it), and
    "tag", their signature under `key`."""
    body: dict[str, Any] = {"v": MARKER_VERSION, "kind": kind, "sink": sink, "batch": batch}
    if kind == "data":
        body.update(part=part, chunk=chunk, rows=rows)
    body["tag"] = _tag(key, body)
    return MARKER_MAGIC + json.dumps(body, separators=(",", ":")).encode()


def signed(marker: dict[str, Any], key: bytes) -> bool:
    """Whether a decoded marker carries a tag made with `key` over its fields."""
    tag = marker.get("tag")
    if not isinstance(tag, str):
        return False
    fields = {name: value for name, value in marker.items() if name != "tag"}
    return hmac.compare_digest(tag, _tag(key, fields))


def decode_marker(value: bytes) -> dict[str, Any] | None:
    """The marker's fields, or None if `value` is not a marker."""
    if not value.startswith(MARKER_MAGIC):
        return None
    try:
        body = json.loads(value[len(MARKER_MAGIC) :])
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def is_marker(value: bytes) -> bool:
    return value.startswith(MARKER_MAGIC)


@dataclass
class MarkerSearch:
    """The chunks of (sink, batch, part) found so far, among the values shown to `look`:
    only markers signed with `key` count."""

    sink: str
    batch: int
    part: int
    key: bytes
    found: set[int] = field(default_factory=set)

    def look(self, values: Iterable[bytes]) -> bool:
        """Collect the chunk numbers of (sink, batch, part) among `values`. True if one of
        them is a marker of this sink for an earlier batch: micro-batches run one after the
        other, so everything an attempt of this batch appended lies above it."""
        earlier = False
        for value in values:
            marker = decode_marker(value) if is_marker(value) else None
            if marker is None or marker.get("sink") != self.sink or not signed(marker, self.key):
                continue
            if marker.get("batch") == self.batch and marker.get("part") == self.part:
                self.found.add(int(marker["chunk"]))
            elif isinstance(marker.get("batch"), int) and marker["batch"] < self.batch:
                earlier = True
        return earlier
