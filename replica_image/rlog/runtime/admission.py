"""The admission state (rlog.protocol.admission) of a replica's learned entries, kept current
as the replica learns, so that a new leader starts admitting appends at once.

`AdmissionTracker` is loaded once when the replica starts (`load`): it scans the learned
entries of the session window, [max(begin, learned + 1 - window), learned], in order, and
if none of them states the writer epoch (all NOPs) looks further back, chunk by chunk, for
the last entry that does (there is one unless the log never held anything but NOPs: the
TRUNCATE entry that set the beginning states it too). From then on it applies each learned
entry as the contiguous learned prefix advances (`catch_up`, a few microseconds an entry).
A leader takes a copy as of its first position (`snapshot`) after its fill: only the
positions it filled are left to apply. The scan yields to the event loop between chunks.
`AdmissionDriver` runs this for the node (`runtime/node.py`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from rlog.config import ReplicaConfig
from rlog.protocol.admission import AdmissionState, carries_epoch
from rlog.protocol.coordinator import Coordinator
from rlog.protocol.records import span
from rlog.protocol.replica import ReplicaCore
from rlog.storage.base import CorruptRecord, RunHead

log = logging.getLogger("rlog.node")

SCAN_CHUNK = 4096  # positions per read (then the event loop runs)


class NotLearned(Exception):
    """The local replica has not learned every position the state needs."""


class AdmissionTracker:
    def __init__(self, core: ReplicaCore, window: int) -> None:
        self.core = core
        self.window = window
        self.state: AdmissionState | None = None  # None until loaded
        self.load_seconds = 0.0

    async def load(self) -> None:
        self.state = None
        learned = self.core.learned_next - 1
        self.state, self.load_seconds = await rebuild(self.core, learned, self.window)
        self.catch_up()

    def catch_up(self, limit: int | None = None) -> int:
        """Apply the learned entries not applied yet (at most `limit`); how many remain."""
        state = self.state
        if state is None:
            return 0
        learned = self.core.learned_next - 1
        while state.next_position <= learned and (limit is None or limit > 0):
            chunk = SCAN_CHUNK if limit is None else min(SCAN_CHUNK, limit)
            records = self.core.learned_heads(state.next_position, learned, chunk)
            if not records:
                break
            first = span(records[0])[0]
            if first > state.next_position:
                state.skip_to(first, self.core.begin)
            for record in records:
                state.apply_record(record)
            if limit is not None:
                limit -= span(records[-1])[1] + 1 - first
        return max(0, learned + 1 - state.next_position)

    def snapshot(self, index: int) -> AdmissionState:
        """A copy of the state as of index + 1 (every position up to `index` learned)."""
        if self.state is None:
            raise NotLearned("the admission state is still loading")
        self.catch_up()
        if self.state.next_position != index + 1:
            raise NotLearned(
                f"learned up to {self.state.next_position - 1}, the leader needs {index}"
            )
        return self.state.clone()


async def rebuild(core: ReplicaCore, index: int, window: int) -> tuple[AdmissionState, float]:
    """The admission state as of index + 1 from the learned entries, and the seconds the
    scan took."""
    started = time.perf_counter()
    begin = core.begin
    first = max(begin, index + 1 - window)
    state = AdmissionState(window, first, begin=begin)
    stated_epoch = False
    position = first
    while position <= index:
        records = core.learned_heads(position, index, SCAN_CHUNK)
        if not records or span(records[0])[0] != position:
            raise NotLearned(f"position {position} is not learned on this replica")
        for record in records:
            stated_epoch = stated_epoch or carries_epoch(
                record.head if isinstance(record, RunHead) else record
            )
            state.apply_record(record)
        position = span(records[-1])[1] + 1
        await asyncio.sleep(0)
    state.next_position = max(state.next_position, index + 1)
    if not stated_epoch:
        state.epoch = await _epoch_before(core, first)
    return state, time.perf_counter() - started


async def _epoch_before(core: ReplicaCore, below: int) -> int:
    """The epoch stated by the last entry below `below` that states one (0 if none)."""
    last = below - 1
    while last >= core.begin:
        first = max(core.begin, last + 1 - SCAN_CHUNK)
        records = core.learned_heads(first, last, SCAN_CHUNK)
        if not records or span(records[0])[0] != first or span(records[-1])[1] != last:
            raise NotLearned(f"positions {first}-{last} are not all learned on this replica")
        for record in reversed(records):
            entry = record.head if isinstance(record, RunHead) else record
            if carries_epoch(entry):
                return int(entry.epoch)
        last = first - 1
        await asyncio.sleep(0)
    return 0


ADMISSION_STEP = 20_000  # learned entries applied to the admission state per loop turn


class AdmissionDriver:
    """The node's side of admission: loads the tracker at start, applies learned entries
    to it as they come (a bounded number per event-loop turn), and hands a new leader's
    coordinator its state once the fill is learned locally (the coordinator holds every
    append until then)."""

    def __init__(
        self,
        core: ReplicaCore,
        coordinator: Coordinator,
        config: ReplicaConfig,
        learned_changed: asyncio.Event,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
        dispatch: Callable[[], None],
        fault_seen: Callable[[CorruptRecord], None],
    ) -> None:
        self.core = core
        self.coordinator = coordinator
        self.config = config
        self.tracker = AdmissionTracker(core, config.session_window)
        self.learned_changed = learned_changed
        self.spawn = spawn
        self.dispatch = dispatch
        self.fault_seen = fault_seen  # Repair.storage_fault_seen (runtime/repair.py)
        self.stopped = False
        self._scheduled = False

    def start(self) -> None:
        self.spawn(self._load())

    async def _load(self) -> None:
        while True:
            try:
                await self.tracker.load()
                break
            except NotLearned as exc:  # e.g. a truncation during the scan
                log.info("admission state not loaded (%s); scanning again", exc)
                await asyncio.sleep(0.2)
            except CorruptRecord as exc:
                # Handed to the repair (docs/faults.md): the record is dropped and every
                # position from it on counts as not learned here, so the next scan stops
                # below it and `catch_up` applies the peers' copy once it is learned again.
                # Before, the task died with the error unseen: the record stayed, and the
                # replica never had an admission state to lead with.
                self.fault_seen(exc)
                log.info("admission state not loaded (%s); scanning again", exc)
                await asyncio.sleep(0)
        state = self.tracker.state
        log.info(
            "admission state loaded in %.3f s (%d sessions in the window)",
            self.tracker.load_seconds,
            len(state.sessions) if state else 0,
        )

    def on_learned(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_later(0.02, self._track)

    def _track(self) -> None:
        """Apply newly learned entries, a bounded number at a time; far behind (a replica
        that caught up a whole window at once), scan again."""
        self._scheduled = False
        if self.stopped:
            return
        try:
            remaining = self.tracker.catch_up(limit=ADMISSION_STEP)
        except CorruptRecord as exc:
            self.fault_seen(exc)  # learned again from the peers, then applied
            return
        if remaining > self.config.session_window:
            self.spawn(self._load())
        elif remaining:
            self.on_learned()

    def on_leading(self, proposal: int, index: int) -> None:
        self.spawn(self._prepare(proposal, index))

    def _still_leading(self, proposal: int) -> bool:
        return self.coordinator.leading and self.coordinator.proposal == proposal

    async def _prepare(self, proposal: int, index: int) -> None:
        """Hand the coordinator the state as of index + 1, once position `index` is learned
        here and the tracker is loaded."""
        deadline = time.monotonic() + self.config.append_timeout
        # `learned_next`, not `learned`: `learned` is 0 both when position 0 is learned and
        # when nothing is, so the first leader of a new log (index 0) took the state before
        # its fill of position 0 was learned here, found none and stepped down at once.
        while self.core.learned_next <= index or self.tracker.state is None:
            if not self._still_leading(proposal):
                return
            if self.tracker.state is not None and time.monotonic() > deadline:
                # (A state still loading at start-up is waited for: it is bounded by the
                # window scan, and every replica of a restarted log loads one.)
                self.coordinator.step_down(f"position {index} is not learned locally in time")
                self.dispatch()
                return
            self.learned_changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.learned_changed.wait(), 0.05)
        if not self._still_leading(proposal):
            return
        started = time.perf_counter()
        try:
            state = self.tracker.snapshot(index)
        except NotLearned as exc:
            self.coordinator.step_down(f"no admission state: {exc}")
            self.dispatch()
            return
        if self.coordinator.admission_ready(proposal, state):
            log.info(
                "admitting appends from position %d (epoch %d, %d sessions; %.3f s)",
                index + 1,
                state.epoch,
                len(state.sessions),
                time.perf_counter() - started,
            )
            self.dispatch()
