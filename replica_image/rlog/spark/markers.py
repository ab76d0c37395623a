"""The sink's batch markers: how a replayed Spark task finds what it already appended.

Every append call of the sink ends with a marker entry naming (sink, batch, partition,
chunk); the driver's commit of a streaming batch appends a commit marker. A replay scans the
log for its markers and skips the chunks already there. The guarantee and its limits are in
docs/spark.md ("Exactly-once stream sink"). Pure: encoding, decoding and the search's
bookkeeping; reading the log is the sink's job (`rlog.spark.sink.find_markers`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# 21 bytes no text value starts with: the source hides entries that start with them.
MARKER_MAGIC = b"\x00\xffrlog-spark-marker\x00"
MARKER_VERSION = 1


def encode_marker(
    sink: str, batch: int, part: int = -1, chunk: int = -1, rows: int = 0, kind: str = "data"
) -> bytes:
    """The value of a marker: MARKER_MAGIC + compact JSON {"v", "kind", "sink", "batch"} and,
    for a data marker, "part", "chunk" and "rows" (the values appended before it)."""
    body: dict[str, Any] = {"v": MARKER_VERSION, "kind": kind, "sink": sink, "batch": batch}
    if kind == "data":
        body.update(part=part, chunk=chunk, rows=rows)
    return MARKER_MAGIC + json.dumps(body, separators=(",", ":")).encode()


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
    """The chunks of (sink, batch, part) found so far, among the values shown to `look`."""

    sink: str
    batch: int
    part: int
    found: set[int] = field(default_factory=set)

    def look(self, values: Iterable[bytes]) -> bool:
        """Collect the chunk numbers of (sink, batch, part) among `values`. True if one of
        them is a marker of this sink for an earlier batch: micro-batches run one after the
        other, so everything an attempt of this batch appended lies above it."""
        earlier = False
        for value in values:
            marker = decode_marker(value) if is_marker(value) else None
            if marker is None or marker.get("sink") != self.sink:
                continue
            if marker.get("batch") == self.batch and marker.get("part") == self.part:
                self.found.add(int(marker["chunk"]))
            elif isinstance(marker.get("batch"), int) and marker["batch"] < self.batch:
                earlier = True
        return earlier
