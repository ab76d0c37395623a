"""The in-memory image of the replicated state: the variables as of a log position, built by
applying state entries in position order, and the decisions a writer makes against it.

Versions come from one counter over the whole state: every successful SET takes the next
value. A version therefore never repeats, not even for a variable expunged and created
again, so a writer holding an old version can never overwrite a newer variable by accident.
Version 0 means "does not exist".
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from rlog.state.format import (
    NO_SNAPSHOT,
    CorruptEntry,
    Decoded,
    Diff,
    Op,
    OpKind,
    SnapshotChunk,
    StateError,
)


@dataclass(frozen=True, slots=True)
class Variable:
    """A named value and its version (0: the variable does not exist)."""

    name: str
    value: bytes
    version: int

    @property
    def exists(self) -> bool:
        return self.version != 0

    @property
    def text(self) -> str:
        return self.value.decode("utf-8", errors="backslashreplace")


Update = Callable[[Variable], bytes | None]


@dataclass(frozen=True, slots=True)
class Mutation:
    """What a caller asks: SET `name` to `value` or EXPUNGE it, if its version is still
    `version`; or, with `update`, SET it to `update(current variable)` whatever its version
    (None: leave it as it is), decided when the batch is (the Registrar's operations)."""

    kind: OpKind
    name: str
    version: int
    value: bytes = b""
    update: Update | None = None


# store: Variable or None; expunge: bool; update: Variable, or the exception it raised.
MutationResult = Variable | bool | None | Exception


class Image:
    """The variables as of `next` (every state entry below it applied)."""

    def __init__(self, start: int = 0, base_snapshot: int | None = None) -> None:
        self.variables: dict[str, tuple[int, bytes]] = {}
        self.counter = 0
        self.next = start
        self.initialized = False
        # Snapshots: the newest two complete ones (recovery's start, compaction's cut).
        self.snapshot = NO_SNAPSHOT
        self.previous_snapshot = NO_SNAPSHOT
        self.mutations_since_snapshot = 0
        self.bytes_since_snapshot = 0
        self.state_bytes = 0  # bytes of every variable's name and value
        # Chunk indices seen per snapshot that started at or after the point we read from.
        self._chunks_seen: dict[int, set[int]] = {}
        # Loading from a snapshot: its chunks, and the diffs after it held back until it is
        # complete.
        self._base = base_snapshot
        self._base_chunks: dict[int, SnapshotChunk] = {}
        self._held: list[tuple[int, Diff]] = []
        self.nonces_seen: dict[bytes, int] = {}  # nonce -> position, for watched nonces
        self.watched_nonces: set[bytes] = set()

    # ---- reading -----------------------------------------------------------------------

    def get(self, name: str) -> Variable:
        found = self.variables.get(name)
        if found is None:
            return Variable(name, b"", 0)
        return Variable(name, found[1], found[0])

    def names(self) -> list[str]:
        return sorted(self.variables)

    @property
    def loading(self) -> bool:
        """Still waiting for the chunks of the snapshot it loads from."""
        return self._base is not None

    # ---- applying the log --------------------------------------------------------------

    def apply(self, position: int, entry: Decoded, size: int) -> bool:
        """Apply the state entry found at `position` (skipped if already applied); returns
        whether it was new."""
        if position < self.next:
            return False
        self.next = position + 1
        if isinstance(entry, SnapshotChunk):
            self._apply_chunk(position, entry)
            return True
        if entry.nonce in self.watched_nonces:
            self.nonces_seen[entry.nonce] = position
        if self._base is not None:
            self._held.append((position, entry))
            return True
        self._apply_diff(entry, size)
        return True

    def _apply_diff(self, diff: Diff, size: int) -> None:
        self.initialized = True
        self.mutations_since_snapshot += len(diff.ops)
        self.bytes_since_snapshot += size
        for op in diff.ops:
            old = self.variables.pop(op.name, None)
            if old is not None:
                self.state_bytes -= len(op.name) + len(old[1])
            if op.kind == OpKind.SET:
                self.variables[op.name] = (op.version, op.value)
                self.state_bytes += len(op.name) + len(op.value)
                self.counter = max(self.counter, op.version)

    def _apply_chunk(self, position: int, chunk: SnapshotChunk) -> None:
        if chunk.as_of > position:
            raise CorruptEntry(
                f"state entry at position {position} is corrupted: a snapshot chunk "
                f"as of {chunk.as_of}, after its own position"
            )
        if self._base is not None and chunk.as_of == self._base:
            self._base_chunks[chunk.index] = chunk
            if len(self._base_chunks) == chunk.count:
                self._load_base(chunk.count)
            return
        seen = self._chunks_seen.setdefault(chunk.as_of, set())
        seen.add(chunk.index)
        if len(seen) == chunk.count:
            del self._chunks_seen[chunk.as_of]
            self._completed(chunk.as_of)

    def _completed(self, as_of: int) -> None:
        if as_of > self.snapshot:
            self.previous_snapshot = self.snapshot
            self.snapshot = as_of
            # Mutations since this snapshot: every diff at or after `as_of` counts, which
            # includes some already counted; a rough count is all compaction needs.
            self.mutations_since_snapshot = 0
            self.bytes_since_snapshot = 0

    def _load_base(self, count: int) -> None:
        chunks = [self._base_chunks[i] for i in range(count)]
        assert self._base is not None
        base = self._base
        self.variables = {
            name: (version, value) for chunk in chunks for name, version, value in chunk.variables
        }
        self.state_bytes = sum(len(name) + len(v[1]) for name, v in self.variables.items())
        self.counter = chunks[0].counter
        self.previous_snapshot = chunks[0].previous
        self.snapshot = base
        self.initialized = True
        self._base = None
        self._base_chunks = {}
        held, self._held = self._held, []
        self.mutations_since_snapshot = 0
        self.bytes_since_snapshot = 0
        for _, diff in held:
            self._apply_diff(diff, 0)

    def finish_loading(self) -> None:
        """The read from the base snapshot reached the end of the log."""
        if self._base is not None:
            raise StateError(
                f"the snapshot as of position {self._base} is incomplete in the log "
                f"({len(self._base_chunks)} chunks found): cannot recover the state from it"
            )

    # ---- deciding mutations ------------------------------------------------------------

    def decide(self, mutations: list[Mutation]) -> tuple[list[MutationResult], list[Op]]:
        """Each mutation's outcome against this image, in order (later ones see the earlier
        ones' effects), and the ops of the successful ones."""
        overlay: dict[str, tuple[int, bytes] | None] = {}
        counter = self.counter
        results: list[MutationResult] = []
        ops: list[Op] = []
        for m in mutations:
            current = overlay[m.name] if m.name in overlay else self.variables.get(m.name)
            current_version = 0 if current is None else current[0]
            if m.update is not None:
                before = Variable(m.name, b"" if current is None else current[1], current_version)
                try:
                    value = m.update(before)
                except Exception as error:  # the caller's function: its own outcome
                    results.append(error)
                    continue
                if value is None:
                    results.append(before)
                    continue
                counter += 1
                overlay[m.name] = (counter, bytes(value))
                ops.append(Op(OpKind.SET, m.name, counter, bytes(value)))
                results.append(Variable(m.name, bytes(value), counter))
                continue
            if m.kind == OpKind.SET:
                if current_version != m.version:
                    results.append(None)
                    continue
                counter += 1
                overlay[m.name] = (counter, m.value)
                ops.append(Op(OpKind.SET, m.name, counter, m.value))
                results.append(Variable(m.name, m.value, counter))
            else:
                if current is None or current_version != m.version:
                    results.append(False)
                    continue
                overlay[m.name] = None
                ops.append(Op(OpKind.EXPUNGE, m.name))
                results.append(True)
        return results, ops

    def snapshot_items(self) -> Iterator[tuple[str, int, bytes]]:
        for name in sorted(self.variables):
            version, value = self.variables[name]
            yield name, version, value
