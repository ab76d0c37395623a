"""Pulls: a VOTING replica copies the learned positions it missed from a peer that has them
(`learned_copy.pull`; a learned action is chosen, so copying one is always safe), one pull
at a time, in the background. When:

- a follower: on a leader's heartbeat, what the leader had learned a heartbeat earlier and
  this replica still lacks (it missed learned messages: a restart, a partition, a full
  disk);
- a leader: what it acknowledged a heartbeat ago and has not learned (its own write of a
  chosen batch failed);
- a replica back from a stop, at once: what its peers learned beyond it.

A replica that is not VOTING learns by recovery's catch-up instead (runtime/catchup.py).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from rlog.config import ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import Coordinator
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.journal import Journal
from rlog.runtime.learned_copy import pull
from rlog.runtime.peers import Peers

log = logging.getLogger("rlog.node")

Statuses = Callable[[], Awaitable[list[pb.StatusResponse | None]]]


class Pulls:
    """When this replica pulls. `statuses`: every peer's Status (None: no answer)."""

    def __init__(
        self,
        config: ReplicaConfig,
        core: ReplicaCore,
        coordinator: Coordinator,
        journal: Journal,
        peers: Peers,
        statuses: Statuses,
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        self.config = config
        self.core = core
        self.coordinator = coordinator
        self.journal = journal
        self.peers = peers
        self.statuses = statuses
        self.spawn = spawn
        self._prev_leader_learned = 0
        self._pulling = False  # a pull of learned positions under way (one at a time)
        self._prev_acknowledged_end = 0

    def on_heartbeat(self, request: pb.LearnedRequest) -> None:
        """A leader's heartbeat: pull what it had learned a heartbeat ago, if this replica
        still lacks it."""
        if not request.leader_learned:
            return  # a read round's heartbeat: too frequent to time pulls by
        target, self._prev_leader_learned = self._prev_leader_learned, request.leader_learned
        # Pull what the leader had learned a heartbeat ago and we still lack: what it learned
        # since may still be arriving in ordinary learned messages.
        # A replica that is not VOTING learns by recovery's catch-up, which copies the same
        # records: a pull as well would fetch them twice.
        voting = self.core.status == pb.VOTING
        if voting and self.core.learned < target and not self._pulling:
            self._pull([request.leader], target)

    def missed_own_writes(self) -> None:
        """A leader learns a chosen batch from its own record of it; if its own write of
        that batch failed (a full disk) while the followers' succeeded, no learned message
        will ever bring the value, and its learned prefix (so its consistent reads) would stop
        there for good. So, as a follower pulls from the leader: pull what was acknowledged a
        heartbeat ago (what is newer may still be on its way to the storage) and is still not
        learned here from the followers, once the disk takes writes again."""
        target = self._prev_acknowledged_end
        self._prev_acknowledged_end = self.coordinator.acknowledged_end
        if self.journal.full is not None or self._pulling or self.core.learned >= target:
            return
        log.info(
            "learned only up to %d of the %d acknowledged: pulling the rest from the followers",
            self.core.learned,
            target,
        )
        self._pull(list(self.peers.keys()), target)

    async def after_restart(self) -> None:
        """A VOTING replica back from a stop (a restarted pod, a rebooted node) asks its
        peers how far they learned and pulls what it lacks at once. Its own channels are
        new; the leader's heartbeats, by which a follower otherwise finds it is behind, come
        only once the leader's channel to it is back from its reconnect back-off (up to a
        second), and the pull they start waits for a second one."""
        statuses = await self.statuses()
        ahead = {
            status.id: status.learned
            for status in statuses
            if status is not None and status.learned > self.core.learned
        }
        if not ahead or self.core.status != pb.VOTING or self._pulling:
            return
        if self.journal.full is not None:
            return  # nowhere to store it: the heartbeats' pulls come back to it
        target = max(ahead.values())
        log.info(
            "back with learned up to %d, peers up to %d: pulling the rest from replicas %s",
            self.core.learned,
            target,
            sorted(ahead),
        )
        self._pull(sorted(ahead), target)

    def _pull(self, sources: list[int], target: int) -> None:
        """Copy the learned positions up to `target` this replica lacks from `sources` in
        the background (`learned_copy.pull`), one pull at a time."""
        self._pulling = True

        async def pulling() -> None:
            try:
                await pull(
                    self.core,
                    self.peers,
                    sources,
                    target,
                    self.journal.durable,
                    self.config.catchup_rate,
                )
            finally:
                self._pulling = False

        self.spawn(pulling())
