"""`AsyncState`: named, versioned variables kept in an rlog log, shared by any number of
processes.

Correctness comes from conditional appends, never from a single writer: a batch of
mutations is decided against the state as of the log's next position P (every state entry
below P applied) and appended with `if_next=P`. If another writer got there first the
append fails with `ConditionFailed`, which names the log's new next position; the writer
reads the entries in between, applies them and decides again. So every diff in the log was
decided against exactly the state before it, which makes the stores linearizable
compare-and-set operations.

Batching follows the Registrar: at most one append of this process is in flight; the
mutations that arrive meanwhile wait, and then go out together as the next single append.
Each caller gets its own outcome.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from rlog.client import AsyncClient
from rlog.client.errors import (
    ConditionFailed,
    OutcomeUnknown,
    PastEnd,
    PermissionDenied,
    RlogError,
    Truncated,
    Unavailable,
)
from rlog.client.security import Credentials
from rlog.state.format import (
    NO_SNAPSHOT,
    Diff,
    OpKind,
    StateError,
    decode,
    encode_diff,
    snapshot_chunks,
)
from rlog.state.image import Image, Mutation, MutationResult, Update, Variable

DEFAULT_SNAPSHOT_EVERY = 10_000  # mutations
DEFAULT_SNAPSHOT_BYTES = 64 * 1024 * 1024  # bytes of diffs
MAX_BATCH_BYTES = 1024 * 1024  # one diff entry
MAX_CHUNK_BYTES = 1024 * 1024  # one snapshot chunk entry
MAX_CHUNKS_PER_APPEND = 4
_UNKNOWN_RETRY_SECONDS = 60.0
_LOAD_TRIES = 5
_POINTER_WINDOW = 4  # grows x4: a snapshot's chunks near the end are read at most once more

log = logging.getLogger("rlog.state")


class StateLost(StateError):
    """Strict mode: the log holds no state although it was used (truncated) before."""


class StateRecoveryFailed(StateError):
    """The state could not be read back from the log."""


class _Patience:
    """Waits between tries of a call that failed with `Unavailable` (no leader for now),
    for up to `seconds` in all; then re-raises the error."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds
        self.tries = 0

    async def or_raise(self, error: Unavailable) -> None:
        if time.monotonic() >= self.deadline:
            raise error
        self.tries += 1
        await asyncio.sleep(min(0.05 * self.tries, 0.5))


class _BatchTooLarge(Exception):
    """A batch's diff came out over MAX_BATCH_BYTES once decided (an update's value is known
    only then: `update` functions can write far more than the mutation's own size)."""


@dataclass
class _Pending:
    mutation: Mutation
    future: asyncio.Future[MutationResult]
    size: int = field(init=False)

    def __post_init__(self) -> None:
        self.size = len(self.mutation.name) + len(self.mutation.value) + 16


class AsyncState:
    """Named, versioned variables in the log behind `client` (an `AsyncClient` or endpoints).

    - `fetch(name)` -> `Variable(name, value, version)` (version 0: it does not exist),
      linearizable: it first reads every entry acknowledged before it.
    - `store(variable)` -> the stored `Variable` with its new version, or None when the
      variable's version is no longer `variable.version`.
    - `update(name, function)` -> the variable after `function` changed it, decided within
      the batch (never refused: re-run on a newer state after a conflict).
    - `expunge(variable)` -> whether it was removed (False: its version moved on, or gone).
    - `names()`, `watch(name)` (each new version, as the log learns it).
    - `batching=False`: every mutation is its own append (for comparison).
    - `strict=True`: refuse to start on a log that was truncated but holds no state (the
      state was lost), instead of starting afresh.
    - every `snapshot_every` mutations or `snapshot_bytes` bytes of diffs since the newest
      snapshot, this process appends a snapshot and truncates the log below the previous one.
      Truncating needs the `owner` role on a log with roles (docs/security.md): with role
      `append` the snapshots are written and the log is not truncated (`truncation_refused`
      says why, and the logger `rlog.state` warns once).
    - `credentials` (with endpoints only): TLS / client certificate / token for a secured log.
    """

    def __init__(
        self,
        client: AsyncClient | str,
        *,
        strict: bool = False,
        batching: bool = True,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        snapshot_bytes: int = DEFAULT_SNAPSHOT_BYTES,
        compact: bool = True,
        unavailable_patience: float = 30.0,
        credentials: Credentials | None = None,
    ) -> None:
        if credentials is not None and not isinstance(client, str):
            raise TypeError("credentials go with endpoints; a client brings its own")
        self._own_client = isinstance(client, str)
        self.client = (
            AsyncClient(client, credentials=credentials) if isinstance(client, str) else client
        )
        self.strict = strict
        self.batching = batching
        self.snapshot_every = snapshot_every
        self.snapshot_bytes = snapshot_bytes
        self.compact_automatically = compact
        # How long reads and appends wait for a leader (Unavailable) before failing.
        self.unavailable_patience = unavailable_patience
        self._image: Image | None = None
        self._queue: list[_Pending] = []
        self._writer: asyncio.Task[None] | None = None
        self._sync_waiters: list[asyncio.Future[None]] = []
        self._syncer: asyncio.Task[None] | None = None
        self._io = asyncio.Lock()  # one reader/writer of the image's log position at a time
        # Counters for tests and benchmarks.
        self.appends = 0
        self.appended_bytes = 0  # bytes of the diff entries this process appended
        self.conflicts = 0
        self.snapshots_written = 0
        self.recoveries = 0
        # Why compaction could not truncate the log (the caller's role), once it could not.
        self.truncation_refused: str | None = None

    # ---- recovery ----------------------------------------------------------------------

    @property
    def initialized(self) -> bool:
        """Whether the log holds a state (a mutation was ever stored)."""
        return self._image is not None and self._image.initialized

    async def recover(self) -> None:
        """(Re)build the image from the newest snapshot forward."""
        async with self._io:
            await self._load()

    async def _load(self) -> None:
        last_error: RlogError | None = None
        tries = 0
        waited = _Patience(self.unavailable_patience)
        while tries < _LOAD_TRIES:
            try:
                self._image = await self._load_once()
                self.recoveries += 1
                return
            except Truncated as error:
                # The snapshot we started from was truncated under us: a newer one exists.
                last_error = error
                tries += 1
            except Unavailable as unavailable:
                await waited.or_raise(unavailable)
        raise StateRecoveryFailed(
            f"could not recover the state after {_LOAD_TRIES} tries: {last_error}"
        )

    async def _load_once(self) -> Image:
        status = await self.client.status()
        begin, learned = int(status.begin), int(status.learned)
        pointer, any_entry = await self._newest_snapshot(begin, learned)
        if pointer != NO_SNAPSHOT:
            image = Image(start=pointer, base_snapshot=pointer)
        elif begin > 0 and any_entry:
            raise StateRecoveryFailed(
                f"the log begins at {begin} but holds no snapshot to start from: the state "
                "below it was truncated away by something other than compaction"
            )
        else:
            image = Image(start=begin)
        await self._read_into(image, image.next)
        image.finish_loading()
        if not image.initialized and begin > 0 and self.strict:
            raise StateLost(
                f"strict mode: the log holds no state but was used before (it begins at "
                f"{begin}, everything below was truncated): refusing to start from an empty "
                "state"
            )
        return image

    async def _newest_snapshot(self, begin: int, learned: int) -> tuple[int, bool]:
        """The newest complete snapshot the last state entries point to, and whether any
        state entry was found; scans back from `learned` in growing windows."""
        high = learned
        window = _POINTER_WINDOW
        while high >= begin:
            low = max(begin, high - window + 1)
            last: tuple[int, bytes] | None = None
            try:
                async for entry in self.client.read(low, high, stale=True):
                    last = (entry.position, entry.value)
            except Truncated:
                return NO_SNAPSHOT, False
            if last is not None:
                decoded = decode(last[1], last[0])
                if isinstance(decoded, Diff):
                    return decoded.snapshot, True
                return decoded.previous, True
            high = low - 1
            window *= 4
        return NO_SNAPSHOT, False

    async def _read_into(self, image: Image, start: int, to: int | None = None) -> None:
        """Apply the entries from `start` (to `to`, inclusive, waiting for them to be
        learned; else through the last acknowledged one)."""
        if to is not None and to < start:
            return
        try:
            async for batch in self.client.read_batches(start, to):
                for entry in batch:
                    image.apply(
                        entry.position, decode(entry.value, entry.position), len(entry.value)
                    )
        except PastEnd:
            return
        if to is not None:
            image.next = max(image.next, to + 1)

    async def _image_now(self) -> Image:
        if self._image is None:
            await self._load()
        assert self._image is not None
        return self._image

    async def _catch_up(self, to: int | None = None) -> Image:
        """Read what others appended: through position `to` (inclusive) or the end."""
        image = await self._image_now()
        waited = _Patience(self.unavailable_patience)
        while True:
            try:
                await self._read_into(image, image.next, to)
                return image
            except Truncated:
                # Our position was truncated under us: restart from the newest snapshot.
                await self._load()
                return await self._image_now()
            except Unavailable as unavailable:
                # No leader for now (an election): reads are safe to send again.
                await waited.or_raise(unavailable)

    async def sync(self) -> None:
        """Read every entry acknowledged before this call. Concurrent calls share reads: the
        callers that arrive while one read is under way are served together by the next
        (which starts after they arrived, so each sees everything acknowledged before it)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sync_waiters.append(future)
        if self._syncer is None or self._syncer.done():
            self._syncer = asyncio.create_task(self._sync_queued())
        await future

    async def _sync_queued(self) -> None:
        while self._sync_waiters:
            waiters, self._sync_waiters = self._sync_waiters, []
            try:
                async with self._io:
                    await self._catch_up()
            except BaseException as error:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_exception(error)
                if isinstance(error, asyncio.CancelledError):
                    raise
                continue
            for waiter in waiters:
                if not waiter.done():
                    waiter.set_result(None)

    # ---- reading -----------------------------------------------------------------------

    async def fetch(self, name: str) -> Variable:
        await self.sync()
        assert self._image is not None
        return self._image.get(name)

    async def names(self) -> list[str]:
        await self.sync()
        assert self._image is not None
        return self._image.names()

    async def variables(self) -> dict[str, Variable]:
        await self.sync()
        assert self._image is not None
        return {name: self._image.get(name) for name in self._image.names()}

    def cached(self, name: str) -> Variable:
        """The variable as this process last read it (no log access)."""
        if self._image is None:
            return Variable(name, b"", 0)
        return self._image.get(name)

    @property
    def position(self) -> int:
        """The log position the image is at (every state entry below it applied)."""
        return 0 if self._image is None else self._image.next

    @property
    def snapshot_position(self) -> int:
        return NO_SNAPSHOT if self._image is None else self._image.snapshot

    # ---- mutations ---------------------------------------------------------------------

    async def store(self, variable: Variable) -> Variable | None:
        result = await self._submit(
            Mutation(OpKind.SET, variable.name, variable.version, bytes(variable.value))
        )
        assert result is None or isinstance(result, Variable)
        return result

    async def update(self, name: str, function: Update) -> Variable:
        """Set `name` to `function(current variable)` (None: leave it), decided against the
        state at the position the batch is appended at, so it never fails on a conflict:
        `function` runs again on the newer state (it must have no side effects). Returns
        the variable after it. This is how the Registrar applies its operations."""
        result = await self._submit(Mutation(OpKind.SET, name, 0, update=function))
        assert isinstance(result, Variable)
        return result

    async def expunge(self, variable: Variable) -> bool:
        result = await self._submit(Mutation(OpKind.EXPUNGE, variable.name, variable.version))
        return bool(result)

    async def _submit(self, mutation: Mutation) -> MutationResult:
        future: asyncio.Future[MutationResult] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(mutation, future))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write_queued())
        return await future

    def _take_batch(self, most: int | None = None) -> list[_Pending]:
        if not self.batching:
            return [self._queue.pop(0)]
        batch: list[_Pending] = []
        size = 0
        while self._queue and (not batch or size + self._queue[0].size <= MAX_BATCH_BYTES):
            if most is not None and len(batch) == most:
                break
            pending = self._queue.pop(0)
            batch.append(pending)
            size += pending.size
        return batch

    async def _write_queued(self) -> None:
        most: int | None = None  # mutations per batch, after one came out too large
        while self._queue:
            batch = self._take_batch(most)
            try:
                async with self._io:
                    results = await self._write(batch)
            except _BatchTooLarge:
                # Nothing was appended: decide half as many again, the rest after them.
                self._queue[:0] = batch
                most = max(1, len(batch) // 2)
                continue
            except BaseException as error:
                for pending in batch:
                    if not pending.future.done():
                        pending.future.set_exception(error)
                if isinstance(error, asyncio.CancelledError):
                    raise
                continue
            if most is not None:
                most *= 2  # grow back towards whole batches (values may be small again)
            for pending, result in zip(batch, results, strict=True):
                if pending.future.done():
                    continue
                if isinstance(result, Exception):
                    pending.future.set_exception(result)
                else:
                    pending.future.set_result(result)
            if self.compact_automatically:
                image = self._image
                if image is not None and (
                    image.mutations_since_snapshot >= self.snapshot_every
                    or image.bytes_since_snapshot >= self.snapshot_bytes
                ):
                    with contextlib.suppress(RlogError):
                        async with self._io:
                            await self._compact()

    async def _write(self, batch: list[_Pending]) -> list[MutationResult]:
        """Decide the batch against the state at the log's next position and append it
        there; on a conflict read what came in between and decide again."""
        mutations = [p.mutation for p in batch]
        image = await self._image_now()
        waited = _Patience(self.unavailable_patience)
        while True:
            position = image.next
            results, ops = image.decide(mutations)
            if not ops:
                # Nothing would change: each caller's answer is as of this position, which
                # must be the current one to be linearizable.
                image = await self._confirm_current(image)
                if image.next == position:
                    return results
                continue
            diff = Diff(image.snapshot, os.urandom(16), tuple(ops))
            value = encode_diff(diff)
            if len(value) > MAX_BATCH_BYTES and len(batch) > 1:
                raise _BatchTooLarge
            try:
                await self.client.append([value], if_next=position)
                self.appends += 1
                self.appended_bytes += len(value)
            except ConditionFailed as conflict:
                self.conflicts += 1
                image = await self._after_conflict(conflict)
                continue
            except Truncated:
                await self._load()
                image = await self._image_now()
                continue
            except OutcomeUnknown:
                landed, image = await self._resolve_unknown(value, diff.nonce, position)
                if not landed:
                    continue
                return results
            except Unavailable as unavailable:
                # Certainly not appended (no leader for now, e.g. during an election).
                await waited.or_raise(unavailable)
                continue
            image.apply(position, diff, len(value))
            return results

    async def _after_conflict(self, conflict: ConditionFailed) -> Image:
        if conflict.next_position is None:
            return await self._catch_up()
        return await self._catch_up(conflict.next_position - 1)

    async def _confirm_current(self, image: Image) -> Image:
        """The image, brought up to every entry acknowledged so far."""
        return await self._catch_up()

    async def _resolve_unknown(
        self, value: bytes, nonce: bytes, position: int
    ) -> tuple[bool, Image]:
        """After an append of unknown outcome at `position`: find out whether it landed, by
        sending it again under the same condition (it can land only at `position`, so at
        most once). Returns (landed, image)."""
        deadline = time.monotonic() + _UNKNOWN_RETRY_SECONDS
        attempt = 0
        watching = await self._image_now()
        watching.watched_nonces.add(nonce)
        try:
            while True:
                attempt += 1
                try:
                    await self.client.append([value], if_next=position)
                    self.appends += 1
                    self.appended_bytes += len(value)
                except ConditionFailed as conflict:
                    image = await self._after_conflict(conflict)
                    if image is not watching:
                        # Reloaded from a snapshot (our position was truncated): the entry
                        # at `position` can no longer be looked at.
                        raise OutcomeUnknown(
                            f"a state append at position {position} had an unknown outcome "
                            "and the log was truncated past it before it could be checked"
                        ) from None
                    return watching.nonces_seen.get(nonce) == position, image
                except Truncated:
                    raise OutcomeUnknown(
                        f"a state append at position {position} had an unknown outcome and "
                        "the log was truncated past it before it could be checked"
                    ) from None
                except (OutcomeUnknown, Unavailable):
                    # Unavailable: this try certainly did nothing; the first may have.
                    if time.monotonic() >= deadline:
                        raise
                    await asyncio.sleep(min(0.1 * attempt, 1.0))
                    continue
                watching.apply(position, decode(value, position), len(value))
                return True, watching
        finally:
            watching.watched_nonces.discard(nonce)
            watching.nonces_seen.pop(nonce, None)

    # ---- snapshots and compaction ------------------------------------------------------

    async def compact(self) -> int:
        """Append a snapshot of the current state and truncate the log below the previous
        snapshot. Returns the new snapshot's position (its `as_of`). Raises
        `PermissionDenied` if the caller's role may not truncate (it needs `owner`): the
        snapshot is written then, and nothing is lost."""
        async with self._io:
            await self._catch_up()
            return await self._compact(refusal_raises=True)

    async def _compact(self, refusal_raises: bool = False) -> int:
        image = await self._image_now()
        as_of = image.next
        previous = image.snapshot
        chunks = snapshot_chunks(
            as_of, previous, image.counter, image.snapshot_items(), MAX_CHUNK_BYTES
        )
        for start in range(0, len(chunks), MAX_CHUNKS_PER_APPEND):
            await self.client.append(chunks[start : start + MAX_CHUNKS_PER_APPEND])
        # An empty diff naming the new snapshot: recovery, which looks at the last entries,
        # starts from it at once instead of from the snapshot before.
        await self.client.append([encode_diff(Diff(as_of, os.urandom(16), ()))])
        self.snapshots_written += 1
        image.mutations_since_snapshot = 0
        image.bytes_since_snapshot = 0
        # The new snapshot is complete; the one before it stays, for readers in the middle
        # of loading it. Everything below the previous one goes.
        if previous != NO_SNAPSHOT:
            try:
                with contextlib.suppress(Truncated, PastEnd):
                    await self.client.truncate(previous)
            except PermissionDenied as error:
                self._truncation_was_refused(as_of, previous, error)
                if refusal_raises:
                    assert self.truncation_refused is not None
                    raise PermissionDenied(
                        self.truncation_refused, error.code, error.endpoint
                    ) from None
        return as_of

    def _truncation_was_refused(self, as_of: int, previous: int, error: RlogError) -> None:
        """The role may write snapshots but not truncate: say so once, lose nothing (the
        snapshot is in the log; only the entries below `previous` stay)."""
        message = (
            "compaction cannot truncate the log: it needs the owner role (docs/security.md); "
            f"the snapshot as of {as_of} is written and nothing is lost, but the entries "
            f"below {previous} stay in the log ({error})"
        )
        if self.truncation_refused is None:
            log.warning("%s", message)
        self.truncation_refused = message

    # ---- watching ----------------------------------------------------------------------

    async def watch(self, name: str) -> AsyncGenerator[Variable, None]:
        """The variable now, then each new version of it as the log learns it (an expunge
        yields version 0). Follows the log for ever; restarts from the newest snapshot if
        its position is truncated."""
        current = await self.fetch(name)
        yield current
        version = current.version
        assert self._image is not None
        position = self._image.next
        while True:
            try:
                async for entry in self.client.tail(position):
                    position = entry.position + 1
                    decoded = decode(entry.value, entry.position)
                    if not isinstance(decoded, Diff):
                        continue
                    for op in decoded.ops:
                        if op.name != name:
                            continue
                        if op.kind == OpKind.SET and op.version > version:
                            version = op.version
                            yield Variable(name, op.value, op.version)
                        elif op.kind == OpKind.EXPUNGE and version != 0:
                            version = 0
                            yield Variable(name, b"", 0)
            except Truncated:
                async with self._io:
                    await self._load()
                image = await self._image_now()
                latest = image.get(name)
                position = image.next
                if latest.version != version:
                    version = latest.version
                    yield latest

    # ---- life ----------------------------------------------------------------------------

    async def close(self) -> None:
        if self._writer is not None and not self._writer.done():
            with contextlib.suppress(BaseException):
                await self._writer
        if self._own_client:
            await self.client.close()

    async def __aenter__(self) -> AsyncState:
        await self.recover()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
