"""The archive's objects (docs/backup.md): segments of learned APPEND entries and the
manifest that lists them.

A segment holds every APPEND entry of a position range [first, last] (positions in the range
without one held a NOP, SESSION, EPOCH or TRUNCATE entry, which readers never see): the
bytes `SEGMENT_MAGIC` then one serialized `ReadResponse` whose runs (head unset) are the
packed values, in position order, inside the range. Its SHA-256 is in the manifest; a
segment whose bytes do not hash to it is refused.

The manifest (`manifest.json`) is the archive's only index: a segment exists for readers
only once the manifest lists it, and the manifest is rewritten (one PUT, atomic in S3) only
after the segment's upload finished, so a segment half written or never listed is ignored
and later deleted. Segments are contiguous: each starts one past the previous one's last.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rlog.client.errors import RlogError
from rlog.packed import PackedError, offsets_of, run_count, run_last
from rlog.proto import rlog_pb2 as pb

FORMAT_VERSION = 1
MANIFEST_KIND = "rlog-archive-manifest"
SEGMENT_MAGIC = b"RLOGSEG1"
MANIFEST_NAME = "manifest.json"
SEGMENTS_DIR = "segments/"


class ArchiveError(RlogError):
    """The archive cannot be used as asked: unreachable, misconfigured, corrupt, or not the
    log's. The message says which, for people."""


class CorruptSegment(ArchiveError):
    """A segment's bytes do not match the manifest (checksum, size, framing, positions)."""


@dataclass
class SegmentInfo:
    key: str  # relative to the archive's prefix
    first: int
    last: int  # inclusive
    entries: int  # APPEND entries in it
    bytes: int  # size of the object
    sha256: str
    created: float  # unix time the segment was cut (for people: retention never reads it)
    # The archive's clock (`Manifest.clock`) when the manifest first listed the segment:
    # what retention measures its age by. None: archived by an rlog that kept no clock.
    archived_at: float | None = None

    @staticmethod
    def key_for(first: int, last: int) -> str:
        return f"{SEGMENTS_DIR}{first:020d}-{last:020d}.seg"


@dataclass
class Manifest:
    log_id: str
    begin: int  # the first position the archive covers
    archived_through: int | None = None  # the last position covered (None: nothing yet)
    segments: list[SegmentInfo] = field(default_factory=list)
    generation: int = 0  # +1 on every write: a second writer is detected by a mismatch
    format: int = FORMAT_VERSION
    updated: float = 0.0
    # The archive's own clock: seconds the archivers of this archive have run, each adding
    # what its monotonic clock measured between its manifest writes (never the wall clock:
    # a clock stepped forward must not age the archive). Time no archiver ran is not
    # counted, so retention errs on keeping.
    clock: float = 0.0

    @property
    def next_position(self) -> int:
        return self.begin if self.archived_through is None else self.archived_through + 1

    @property
    def total_bytes(self) -> int:
        return sum(s.bytes for s in self.segments)

    @property
    def total_entries(self) -> int:
        return sum(s.entries for s in self.segments)

    def to_json(self) -> bytes:
        body = {"kind": MANIFEST_KIND, **asdict(self)}
        return json.dumps(body, indent=1, sort_keys=True).encode() + b"\n"

    @staticmethod
    def from_json(raw: bytes, where: str, check: bool = True) -> Manifest:
        """The manifest in `raw`; with `check`, refused unless its segments are chained
        (`rlog archive verify` reads it unchecked to list every break)."""
        try:
            body = json.loads(raw)
        except ValueError as exc:
            raise ArchiveError(f"the manifest at {where} is not JSON: {exc}") from None
        if not isinstance(body, dict) or body.get("kind") != MANIFEST_KIND:
            raise ArchiveError(f"{where} is not an rlog archive manifest")
        if body.get("format") != FORMAT_VERSION:
            raise ArchiveError(
                f"the archive at {where} has format version {body.get('format')}; this rlog "
                f"reads version {FORMAT_VERSION}"
            )
        try:
            segments = [SegmentInfo(**s) for s in body["segments"]]
            manifest = Manifest(
                log_id=str(body["log_id"]),
                begin=int(body["begin"]),
                archived_through=body["archived_through"],
                segments=segments,
                generation=int(body["generation"]),
                updated=float(body.get("updated", 0.0)),
                clock=float(body.get("clock", 0.0)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ArchiveError(f"the manifest at {where} is malformed: {exc!r}") from None
        if check:
            manifest.check(where)
        return manifest

    def check(self, where: str) -> None:
        """The segments are contiguous from `begin` to `archived_through`."""
        problems = self.chain_problems()
        if problems:
            raise ArchiveError(f"the manifest at {where} {problems[0]}")

    def chain_problems(self) -> list[str]:
        """Each break in the chain of segments from `begin` to `archived_through` (a gap, an
        overlap, a wrong end), as the end of a sentence about the manifest."""
        problems = []
        expected = self.begin
        for s in self.segments:
            if s.first != expected or s.last < s.first:
                problems.append(
                    f"is inconsistent: segment {s.key} covers [{s.first}, {s.last}], "
                    f"expected one starting at {expected}"
                )
            expected = max(expected, s.last + 1)
        if self.segments and self.archived_through != expected - 1:
            problems.append(
                f"says archived through {self.archived_through} but its segments end at "
                f"{expected - 1}"
            )
        return problems

    def summary(self) -> dict[str, Any]:
        return {
            "log_id": self.log_id,
            "format": self.format,
            "begin": self.begin,
            "archived_through": self.archived_through,
            "segments": len(self.segments),
            "entries": self.total_entries,
            "bytes": self.total_bytes,
            "generation": self.generation,
            "updated": self.updated,
        }


def encode_segment(runs: list[pb.Run]) -> bytes:
    return SEGMENT_MAGIC + pb.ReadResponse(runs=runs).SerializeToString()


def sha256(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def decode_segment(raw: bytes, info: SegmentInfo, where: str) -> list[pb.Run]:
    """The segment's runs, after checking every byte against the manifest's entry."""
    if len(raw) != info.bytes:
        raise CorruptSegment(
            f"segment {where} is {len(raw)} bytes, the manifest says {info.bytes}: refusing it"
        )
    digest = sha256(raw)
    if digest != info.sha256:
        raise CorruptSegment(
            f"segment {where} fails its checksum (sha256 {digest[:16]}..., the manifest "
            f"says {info.sha256[:16]}...): refusing it"
        )
    if not raw.startswith(SEGMENT_MAGIC):
        raise CorruptSegment(f"segment {where} does not start with {SEGMENT_MAGIC!r}")
    response = pb.ReadResponse()
    try:
        response.ParseFromString(raw[len(SEGMENT_MAGIC) :])
    except Exception as exc:  # protobuf raises DecodeError, a plain Exception subclass
        raise CorruptSegment(f"segment {where} does not parse: {exc}") from None
    runs = list(response.runs)
    previous = info.first - 1
    entries = 0
    for run in runs:
        try:
            offsets_of(run.data, run.offsets)
        except PackedError as exc:
            raise CorruptSegment(f"segment {where}: run at {run.first}: {exc}") from None
        if run.first <= previous or run_last(run) > info.last or run_count(run) == 0:
            raise CorruptSegment(
                f"segment {where}: a run at [{run.first}, {run_last(run)}] is out of order "
                f"or outside [{info.first}, {info.last}]"
            )
        previous = run_last(run)
        entries += run_count(run)
    if entries != info.entries:
        raise CorruptSegment(
            f"segment {where} holds {entries} entries, the manifest says {info.entries}"
        )
    return runs


def now() -> float:
    return time.time()
