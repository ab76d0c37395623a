"""Rebuild the admission state (rlog.protocol.admission) from a replica's learned entries.

A new leader needs the state as of its first position (index + 1) before it admits any
append: it scans its learned entries of the session window, [max(begin, index + 1 - window),
index], applying them in order; if none of them states the writer epoch (all NOPs), it looks
further back, chunk by chunk, for the last entry that does (there is one unless the log never
held anything but NOPs: the TRUNCATE entry that set the beginning states it too). The scan
yields to the event loop between chunks, so heartbeats keep flowing meanwhile.
"""

from __future__ import annotations

import asyncio
import time

from rlog.protocol.admission import AdmissionState, carries_epoch
from rlog.protocol.replica import ReplicaCore

SCAN_CHUNK = 4096  # positions per read (then the event loop runs)


class NotLearned(Exception):
    """The local replica has not learned every position up to the index."""


async def rebuild(core: ReplicaCore, index: int, window: int) -> tuple[AdmissionState, float]:
    """The admission state as of index + 1, and the seconds the scan took."""
    started = time.perf_counter()
    begin = core.begin
    first = max(begin, index + 1 - window)
    state = AdmissionState(window, first, begin=begin)
    stated_epoch = False
    position = first
    while position <= index:
        actions = core.learned_actions(position, index, SCAN_CHUNK)
        if not actions or actions[0].position != position:
            raise NotLearned(f"position {position} is not learned on this replica")
        for action in actions:
            stated_epoch = stated_epoch or carries_epoch(action)
            state.apply(action)
        position = actions[-1].position + 1
        await asyncio.sleep(0)
    state.next_position = index + 1
    if not stated_epoch:
        state.epoch = await _epoch_before(core, first)
    return state, time.perf_counter() - started


async def _epoch_before(core: ReplicaCore, below: int) -> int:
    """The epoch stated by the last entry below `below` that states one (0 if none)."""
    last = below - 1
    while last >= core.begin:
        first = max(core.begin, last + 1 - SCAN_CHUNK)
        actions = core.learned_actions(first, last, SCAN_CHUNK)
        if len(actions) != last - first + 1:
            raise NotLearned(f"positions {first}-{last} are not all learned on this replica")
        for action in reversed(actions):
            if carries_epoch(action):
                return int(action.epoch)
        last = first - 1
        await asyncio.sleep(0)
    return 0
