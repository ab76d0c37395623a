"""`rlog archive verify`: check an archive end to end, writing nothing (docs/backup.md).

The manifest parses and its segments chain from `begin` to `archived_through` without a gap
or an overlap; every segment it lists is in the store, of its size and SHA-256, framed and
holding the positions and entries the manifest says. Every problem is listed, not only the
first, so that one run says what a restore from the archive would meet. Segments in the
store that the manifest does not list are counted, not problems: the archiver writes a
segment before listing it and deletes the ones it never listed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rlog.archive.format import (
    MANIFEST_NAME,
    SEGMENTS_DIR,
    ArchiveError,
    CorruptSegment,
    Manifest,
    decode_segment,
)
from rlog.archive.store import ObjectStore
from rlog.packed import run_count


@dataclass
class ScrubReport:
    where: str
    begin: int | None = None
    archived_through: int | None = None
    segments: int = 0  # listed in the manifest
    checked: int = 0  # found and sound
    entries: int = 0  # in the sound segments
    bytes: int = 0
    unlisted: int = 0  # segment objects the manifest does not list
    problems: list[str] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {"sound": self.sound, **vars(self)}


async def scrub(store: ObjectStore) -> ScrubReport:
    """Check the archive in `store`; ArchiveError only when the store cannot be read at all
    (no bucket, refused credentials, unreachable)."""
    report = ScrubReport(store.where())
    await store.check_bucket()
    raw = await store.get(MANIFEST_NAME)
    if raw is None:
        report.problems.append(f"no archive at {store.where()} (no {MANIFEST_NAME} there)")
        return report
    try:
        manifest = Manifest.from_json(raw, store.where(MANIFEST_NAME), check=False)
    except ArchiveError as exc:
        report.problems.append(str(exc))
        return report
    report.begin, report.archived_through = manifest.begin, manifest.archived_through
    report.segments = len(manifest.segments)
    report.problems += [
        f"the manifest at {store.where(MANIFEST_NAME)} {p}" for p in manifest.chain_problems()
    ]
    for info in manifest.segments:
        where = store.where(info.key)
        body = await store.get(info.key)
        if body is None:
            report.problems.append(f"segment {where} is listed in the manifest but missing")
            continue
        try:
            runs = await asyncio.to_thread(decode_segment, body, info, where)
        except CorruptSegment as exc:
            report.problems.append(str(exc))
            continue
        report.checked += 1
        report.entries += sum(run_count(r) for r in runs)
        report.bytes += info.bytes
    listed = {s.key for s in manifest.segments}
    report.unlisted = len([k for k in await store.list(SEGMENTS_DIR) if k not in listed])
    return report
