"""The archiver: follows a log's learned entries and writes them to an object store in
segments listed by a manifest (docs/backup.md).

Only learned entries are ever archived: the archiver reads through the client
(`read_columns`, linearizable reads bounded by a learned position the log reported), and
a read returns chosen entries only. It resumes after any restart from the manifest alone:
what it had read but not yet listed in the manifest is read again from the log.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rlog.archive import metrics
from rlog.archive.format import (
    MANIFEST_NAME,
    SEGMENTS_DIR,
    ArchiveError,
    Manifest,
    SegmentInfo,
    encode_segment,
    sha256,
)
from rlog.archive.store import ObjectStore
from rlog.client import AsyncClient
from rlog.client.errors import PastEnd, RlogError, Truncated
from rlog.packed import run_count, run_last
from rlog.proto import rlog_pb2 as pb

log = logging.getLogger("rlog.archive")


class ArchiveFatal(ArchiveError):
    """An error retrying cannot fix: the archive belongs to another log, the log was
    truncated past it, or another archiver writes the same manifest."""


@dataclass
class Retention:
    """Which segments to delete (`expired`): by position, those wholly below `keep_from`;
    by age, those older than `max_age` seconds of the archive's own clock. The newest
    `keep_newest` segments are always kept (the newest carries the archived position)."""

    max_age: float | None = None
    keep_from: int | None = None
    keep_newest: int = 1

    def expired(self, manifest: Manifest, clock: float, log_begin: int) -> list[SegmentInfo]:
        """The oldest segments to delete, a pure function of the manifest, the archive's
        clock now (`Manifest.clock` as advanced by this archiver) and the log's first
        position. A segment is old only by the archive's clock, measured back from the
        newest segment's listing (never past `clock`), and only once the log no longer
        holds any of its positions: neither a stepped wall clock nor a clock the archive
        did not see pass can age it. A segment archived before the archive kept a clock
        counts as listed just now."""
        segments = manifest.segments
        keep = max(self.keep_newest, 1)
        if len(segments) <= keep:
            return []
        newest = segments[-1].archived_at
        reference = clock if newest is None else min(clock, newest)
        doomed: list[SegmentInfo] = []
        for s in segments[:-keep]:  # a prefix: segments are contiguous and in order
            listed = reference if s.archived_at is None else s.archived_at
            old = (
                self.max_age is not None
                and reference - listed > self.max_age
                and s.last < log_begin
            )
            below = self.keep_from is not None and s.last < self.keep_from
            if not (old or below):
                break
            doomed.append(s)
        return doomed


@dataclass
class ArchiverConfig:
    segment_bytes: int = 8 << 20  # cut a segment once this many value bytes are pending
    flush_interval: float = 10.0  # ... or once news is this old (bounds the archive's lag)
    poll_interval: float = 0.5  # how often to ask the log for news when caught up
    retention: Retention = field(default_factory=Retention)


@dataclass
class _Pending:
    """Read from the log, not yet in a segment: runs at [first, covered_through]."""

    first: int
    covered_through: int
    runs: list[pb.Run] = field(default_factory=list)
    bytes: int = 0
    since: float | None = None  # when the first uncovered news arrived (monotonic clock)

    def add(self, runs: list[pb.Run]) -> None:
        self.runs += runs
        self.bytes += sum(len(r.data) + len(r.offsets) for r in runs)
        self.covered_through = max(self.covered_through, run_last(runs[-1]))


class Archiver:
    """`store` writes; `deleter` (default: `store`) deletes, so that the writing
    credentials may lack the right to delete (docs/backup.md). `wall` stamps what people
    read (`SegmentInfo.created`, `Manifest.updated`); `monotonic` measures every interval
    the archiver acts on (flush interval, the archive's clock for retention)."""

    def __init__(
        self,
        client: AsyncClient,
        store: ObjectStore,
        config: ArchiverConfig | None = None,
        *,
        deleter: ObjectStore | None = None,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.store = store
        self.deleter = deleter or store
        self.config = config or ArchiverConfig()
        self.wall = wall
        self.monotonic = monotonic
        self.manifest: Manifest | None = None
        self.log_learned = 0
        self.log_begin = 0  # the log's first position (retention keeps what it holds)
        self._clock_mark: float | None = None  # `monotonic()` when the clock last advanced
        # "Archive now" (`request_flush`): cut segments, whatever is pending, until the
        # archive covers this position; -1 when nobody asked.
        self.flush_through = -1
        self._wake = asyncio.Event()

    # ---- the manifest ------------------------------------------------------------------

    async def load_manifest(self) -> Manifest | None:
        raw = await self.store.get(MANIFEST_NAME)
        return None if raw is None else Manifest.from_json(raw, self.store.where(MANIFEST_NAME))

    async def open(self) -> Manifest:
        """Load the manifest (or start one at the log's beginning), check that it is this
        log's, and delete segment objects it does not list (left by a crash between a
        segment's upload and the manifest's update, or by a retention cut)."""
        await self.store.check_bucket()
        status = await self.client.status()
        manifest = await self.load_manifest()
        if manifest is None:
            manifest = Manifest(log_id=status.log_id, begin=status.begin)
            await self._write_manifest(manifest, expect_generation=None)
            log.info(
                "started a new archive at %s from position %d", self.store.where(), status.begin
            )
        elif manifest.log_id != status.log_id:
            raise ArchiveFatal(
                f"the archive at {self.store.where()} belongs to log {manifest.log_id!r}, not to "
                f"this log ({status.log_id!r}): use another bucket or prefix"
            )
        self.manifest = manifest
        self._clock_mark = self.monotonic()  # the time before this open is not counted
        listed = {s.key for s in manifest.segments}
        unlisted = [key for key in await self.store.list(SEGMENTS_DIR) if key not in listed]
        await self._delete(unlisted, "not in the manifest (an interrupted upload or delete)")
        self._observe()
        return manifest

    async def _delete(self, keys: list[str], why: str) -> None:
        """Delete unlisted segment objects. A refusal is not fatal: the manifest no
        longer lists them (they are garbage, never read), and the next `open` tries again."""
        for key in keys:
            log.info("deleting %s: %s", key, why)
            try:
                await self.deleter.delete(key)
            except ArchiveError as exc:
                metrics.ERRORS.inc()
                log.warning("cannot delete %s (left for the next start): %s", key, exc)

    def _advance_clock(self, manifest: Manifest) -> None:
        """Add the monotonic time since the last advance to the archive's clock."""
        t = self.monotonic()
        if self._clock_mark is not None:
            manifest.clock += max(0.0, t - self._clock_mark)
        self._clock_mark = t

    async def _write_manifest(self, manifest: Manifest, expect_generation: int | None) -> None:
        """Write the manifest, first checking that nobody else wrote it since we read it
        (two archivers on one prefix would lose segments)."""
        if expect_generation is not None:
            stored = await self.load_manifest()
            found = None if stored is None else stored.generation
            if found != expect_generation:
                raise ArchiveFatal(
                    f"the manifest at {self.store.where(MANIFEST_NAME)} changed under this "
                    f"archiver (generation {found}, expected {expect_generation}): another "
                    "archiver writes this prefix; run one archiver per archive"
                )
        manifest.generation += 1
        manifest.updated = self.wall()
        self._advance_clock(manifest)
        await self.store.put(MANIFEST_NAME, manifest.to_json())

    # ---- archiving ---------------------------------------------------------------------

    async def _cut(self, pending: _Pending, last: int) -> _Pending:
        """Upload the pending runs up to `last` as one segment, list it, return the rest."""
        manifest = self.manifest
        assert manifest is not None and pending.first == manifest.next_position
        runs = [r for r in pending.runs if r.first <= last]
        rest = [r for r in pending.runs if r.first > last]
        assert all(run_last(r) <= last for r in runs), "segments cut between runs only"
        body = encode_segment(runs)
        info = SegmentInfo(
            key=SegmentInfo.key_for(pending.first, last),
            first=pending.first,
            last=last,
            entries=sum(run_count(r) for r in runs),
            bytes=len(body),
            sha256=sha256(body),
            created=self.wall(),
        )
        # The segment first, then the manifest that lists it: a crash in between leaves
        # an unlisted object, deleted by the next `open`.
        await self.store.put(info.key, body, info.sha256)
        generation = manifest.generation
        self._advance_clock(manifest)
        info.archived_at = manifest.clock
        manifest.segments.append(info)
        manifest.archived_through = last
        try:
            await self._write_manifest(manifest, expect_generation=generation)
        except BaseException:
            manifest.segments.pop()  # reloaded by the caller's retry anyway
            raise
        metrics.SEGMENTS.inc()
        metrics.BYTES.inc(info.bytes)
        metrics.ENTRIES.inc(info.entries)
        metrics.LAST_SEGMENT_TIMESTAMP.set(info.created)
        log.info(
            "archived [%d, %d]: %d entries, %d bytes", info.first, last, info.entries, info.bytes
        )
        await self._apply_retention()
        self._observe()
        left = _Pending(first=last + 1, covered_through=max(pending.covered_through, last))
        if rest:
            left.add(rest)
        left.since = pending.since if left.covered_through > last else None
        return left

    async def _apply_retention(self) -> None:
        manifest = self.manifest
        assert manifest is not None
        self._advance_clock(manifest)
        doomed = self.config.retention.expired(manifest, manifest.clock, self.log_begin)
        if not doomed:
            return
        generation = manifest.generation
        manifest.segments = manifest.segments[len(doomed) :]
        manifest.begin = doomed[-1].last + 1
        # The manifest first: a segment it no longer lists is garbage even if the deletes
        # below are cut short (the next `open` finishes them).
        await self._write_manifest(manifest, expect_generation=generation)
        await self._delete([s.key for s in doomed], "retention")
        metrics.DELETED_SEGMENTS.inc(len(doomed))
        log.info(
            "retention: deleted %d segments, the archive begins at %d", len(doomed), manifest.begin
        )

    def _observe(self) -> None:
        manifest = self.manifest
        archived = (
            -1
            if manifest is None or manifest.archived_through is None
            else manifest.archived_through
        )
        metrics.ARCHIVED_POSITION.set(archived)
        metrics.LOG_LEARNED_POSITION.set(self.log_learned)
        metrics.LAG_POSITIONS.set(max(self.log_learned - archived, 0))

    async def _learned_end(self) -> int:
        status = await self.client.status()
        self.log_learned = status.learned
        self.log_begin = status.begin
        return int(status.learned)

    async def _read_into(self, pending: _Pending, to: int) -> _Pending:
        """Read the log's APPEND entries in [pending.covered_through + 1, to] into
        `pending`, cutting segments whenever enough bytes are pending."""
        start = pending.covered_through + 1
        columns = self.client.read_columns(start, to)
        try:
            async for runs in columns:
                if pending.since is None:
                    pending.since = self.monotonic()
                pending.add(runs)
                if pending.bytes >= self.config.segment_bytes:
                    pending = await self._cut(pending, pending.covered_through)
        except Truncated as exc:
            raise ArchiveFatal(
                f"the log was truncated to {exc.begin}, past the archive's next position "
                f"{start}: positions {start}..{(exc.begin or start) - 1} can no longer be "
                "archived; start a new archive under another prefix"
            ) from None
        finally:
            await columns.aclose()
        if to > pending.covered_through:
            pending.covered_through = to
            if pending.since is None:
                pending.since = self.monotonic()
        return pending

    async def step(self, pending: _Pending, flush: bool) -> _Pending:
        """One round: read what the log learned since, cut a segment if one is due (or if
        `flush`, whatever is pending)."""
        to = await self._learned_end()
        if self.flush_through > to:
            # Nothing past the learned end can be archived: asking for it means "all the
            # log learned now", one cut, not a cut on every poll until the log gets there.
            log.info("flush through %d: taken as the log's learned end %d", self.flush_through, to)
            self.flush_through = to
        if to >= pending.covered_through + 1:
            try:
                pending = await self._read_into(pending, to)
            except PastEnd:
                pass  # the replica that answered the read has not learned `to` yet
        metrics.POLLS.inc()
        self._observe()
        due = (
            pending.since is not None
            and self.monotonic() - pending.since >= self.config.flush_interval
        )
        if pending.covered_through >= pending.first and (flush or due):
            pending = await self._cut(pending, pending.covered_through)
        return pending

    @property
    def archived_through(self) -> int:
        """The last position the archive covers (-1: none yet)."""
        manifest = self.manifest
        if manifest is None or manifest.archived_through is None:
            return -1
        return manifest.archived_through

    def request_flush(self, through: int) -> int:
        """Ask `run` to archive through position `through` now instead of when a segment
        fills or `flush_interval` passes; returns the position archived so far. Asking
        again (or for less) is harmless: the largest position asked for stands, clamped
        to the log's learned end at the next step. Call it on the event loop's thread."""
        if through < 0:
            raise ValueError(f"position {through} is negative")
        if through > self.archived_through:
            self.flush_through = max(self.flush_through, through)
            self._wake.set()
        return self.archived_through

    def _flush_due(self) -> bool:
        if self.flush_through < 0:
            return False
        if self.archived_through >= self.flush_through:
            log.info("archived through %d as asked (flush)", self.archived_through)
            self.flush_through = -1
            return False
        return True

    async def archive_now(self) -> Manifest:
        """Archive everything the log has learned by now, then return the manifest."""
        manifest = self.manifest or await self.open()
        pending = _Pending(first=manifest.next_position, covered_through=manifest.next_position - 1)
        await self.step(pending, flush=True)
        assert self.manifest is not None
        return self.manifest

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Archive until `stop` is set (then flush what is pending). Failures of the log
        or the store are retried with a back-off, each time from the manifest as stored;
        `ArchiveFatal` ends the run."""
        stop = stop or asyncio.Event()
        backoff = self.config.poll_interval
        pending: _Pending | None = None
        while True:
            try:
                if pending is None:
                    manifest = await self.open()
                    pending = _Pending(
                        first=manifest.next_position,
                        covered_through=manifest.next_position - 1,
                    )
                self._wake.clear()  # a request from now on wakes the wait below
                stopping = stop.is_set()
                pending = await self.step(pending, flush=stopping or self._flush_due())
                if stopping:
                    return
                self._flush_due()  # forgets a request this step satisfied
                backoff = self.config.poll_interval
            except ArchiveFatal:
                raise
            except (RlogError, OSError) as exc:
                metrics.ERRORS.inc()
                log.warning("archiving failed, retrying in %.1fs: %s", backoff, exc)
                pending = None  # start again from the manifest as stored
                if stop.is_set():
                    raise
                backoff = min(backoff * 2, 30.0)
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(self._wake.wait())]
            try:
                await asyncio.wait(waits, timeout=backoff, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
