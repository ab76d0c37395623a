"""A replica node: the pure core and coordinator wrapped with disk, network and timers.

The node decides nothing: it builds the drivers, hands each the small callbacks it needs of
the others, starts and supervises their loops and stops them, and answers Status. Each rule
has its driver, in the runtime file of the same name (the rules: rlog/protocol/):

- `replica`: the acceptor/learner; requests run through `ReplicaCore`, their batches
  through the `Journal` (group commit), and the reply leaves only after the batch is durable;
- `coordinator`: the coordinator's driver feeds `Coordinator` the client's writes and the
  peers' answers and drains its outputs: its messages go out through `Peers` (to itself
  directly), its timers are armed and the callers' appends completed;
- `admission`: the admission state of the learned entries, handed to a new leader;
- `election`: ticks `Election` (when to stand, whom to follow, which rivals to refuse), runs
  the pre-vote's Status calls it asks for and stands when it says, sends the leader's
  heartbeats; check-quorum: a leader that has not heard from a quorum within two election
  timeouts steps down;
- `read_index`: a linearizable read waits until a heartbeat round sent after it arrived is
  answered by a quorum that still follows this leader;
- `reads`: the client's reads and tails; a follower passes consistent reads, appends and
  truncations to the leader (`forwarding`);
- `pulls`: a VOTING replica copies the learned entries it missed from a peer that has them
  (`Fetch`, see `peers`), so every VOTING replica ends up holding every chosen entry;
- `recover`, `catchup`: a replica that is not VOTING recovers first;
- `repair`: a corrupt record is dropped and recovered, a full disk refuses appends.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
from collections.abc import Callable, Coroutine
from typing import Any

from rlog.config import (
    UNSAFE_NO_DEDUPE_ENV,
    UNSAFE_NO_READ_INDEX_ENV,
    UNSAFE_SPLIT_FILL_ENV,
    ReplicaConfig,
    unsafe_no_dedupe,
    unsafe_split_fill,
)
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.coordinator import (
    Coordinator,
    CoordinatorConfig,
)
from rlog.protocol.election import Election
from rlog.runtime.admission import AdmissionDriver
from rlog.runtime.appends import ReplicaAppender
from rlog.runtime.budgets import metered_budget
from rlog.runtime.catchup import NO_CATCHUP, CatchupProgress
from rlog.runtime.coordinator import CoordinatorDriver
from rlog.runtime.election import ElectionClock, ElectionDriver
from rlog.runtime.errors import RpcError
from rlog.runtime.forwarding import Forwarding, KnownLeader
from rlog.runtime.health import Health
from rlog.runtime.journal import Journal
from rlog.runtime.leader_links import LeaderLinks
from rlog.runtime.learned_watch import LearnedWatch
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.peers import (
    Peers,
)
from rlog.runtime.plaintext import admin_callers
from rlog.runtime.pulls import Pulls
from rlog.runtime.read_index import ReadIndexDriver
from rlog.runtime.reads import Reads
from rlog.runtime.recover import Report, recover
from rlog.runtime.repair import REFUSING, Repair, SetAside, StorageFaults, open_core
from rlog.runtime.replica import ReplicaDriver
from rlog.runtime.tls import ReloadingCertificates
from rlog.storage import Storage
from rlog.storage.base import CorruptRecord

log = logging.getLogger("rlog.node")

CERTIFICATE_CHECK_INTERVAL = 5.0  # seconds between looks at the certificate files


class Node:
    """One replica: its drivers wired together (see the module's docstring), its loops
    started and supervised (`start`, `stop`)."""

    def __init__(
        self,
        config: ReplicaConfig,
        storage: Storage,
        lost: SetAside | None = None,
        refusal: str = "",
    ) -> None:
        """`lost`: the storage was found lost and set aside, `storage` is a fresh one;
        `refusal`: why the data dir is refused (`storage` is then an empty memory store and
        the replica only answers Status: runtime/repair.py)."""
        self.config = config
        self.storage = storage
        self.metrics = ReplicaMetrics(config.id)
        self.health = Health()  # what the probes see (runtime/health.py)
        if config.storage_engine != "memory":
            self.metrics.watch_disk(config.data_dir)
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._recovery_task: asyncio.Task[None] | None = None
        self._stopped = False
        self.permit = config.auto_initialize
        self.reason = ""  # why the replica is not VOTING, or what it is repairing (Status)
        self.catchup = NO_CATCHUP  # how far recovery's catch-up is (Status)
        # TLS: the replica's certificates (None: plaintext), watched for rotation.
        self.certificates: ReloadingCertificates | None = None
        self._learned_changed = asyncio.Event()  # set as the replica learns
        # Reads with a min_position wait here for the learned end to reach it.
        self.learned_watch = LearnedWatch()
        unsafe_no_read_index = os.environ.get(UNSAFE_NO_READ_INDEX_ENV) == "1"
        _warn_test_only(unsafe_no_read_index)

        # Storage faults: a corrupt record is dropped and recovered, a full disk refuses
        # appends (repair.py, docs/faults.md).
        self.faults = StorageFaults(self.metrics)
        self.core = open_core(storage, self.faults, lost)
        if refusal:
            self.faults.refuse(refusal)
            self.permit = False
        self.journal = Journal(storage, self.core, self.metrics)
        self.repair = Repair(
            self.core, self.journal, config, self.faults, self._restart_recovery, self.spawn
        )
        self.journal.on_corrupt = self.repair.repair_batch
        self.journal.on_full_changed = self.repair.on_disk_full_changed
        self.journal.on_failing_changed = self.repair.on_disk_failing_changed
        self.metrics.disk_full.set_function(lambda: 1.0 if self.repair.disk_low() else 0.0)
        self.metrics.watch_storage_condition(self.repair.condition)
        self.coordinator = Coordinator(
            config.id,
            len(config.peers),
            self.core,
            CoordinatorConfig(
                election_timeout=config.election_timeout,
                fill_timeout=max(2.0, config.election_timeout * 2),
                append_timeout=config.append_timeout,
                retry_backoff=config.retry_backoff,
                max_batch_entries=config.max_batch_entries,
                max_batch_bytes=config.max_batch_bytes,
                max_inflight_batches=config.max_inflight_batches,
                split_fill=unsafe_split_fill(),
                no_dedupe=unsafe_no_dedupe(),
            ),
            log_id=config.log_id,
        )
        # When to stand for election, whom this replica follows (the rules: election.py).
        # The acceptor consults it on promises, the election's driver runs it.
        clock = ElectionClock()
        election = Election(
            config.id,
            config.address,
            len(config.peers),
            config.election_timeout,
            self.core,
            self.coordinator,
            clock.now(),
            random.Random(),
        )
        # The acceptor/learner: the peers' calls, and this replica's own messages to itself.
        self.replica = ReplicaDriver(
            config,
            self.core,
            self.journal,
            self.metrics,
            self.coordinator,
            election,
            clock.now,
            self._on_heartbeat,
            self._learned,
            self._update_metrics,
            self.repair.storage_fault_seen,
        )
        self.peers = Peers(
            config,
            self.core,
            self.replica.local,
            self.spawn,
            # The coordinator's driver, built below (it sends through the peers), takes
            # their answers.
            lambda send, response: self.coordinator_driver.on_reply(send, response),
            lambda send: self.coordinator_driver.on_send_failure(send),
            promise_timeout=self.coordinator.config.fill_timeout,
            metrics=self.metrics,
        )
        self.forwarding = Forwarding(config, self.core, self.peers, self._known_leader)
        # The coordinator's inputs and outputs: the client's writes, the peers' answers.
        self.coordinator_driver = CoordinatorDriver(
            config,
            self.core,
            self.coordinator,
            self.peers,
            self.forwarding,
            self.metrics,
            lambda peer: self.election.on_peer_answered(peer),  # built below
            self._on_leading,
            self._on_demoted,
            self._update_metrics,
            self.repair.disk_full_error,
        )
        self.election = ElectionDriver(
            config,
            self.core,
            self.coordinator,
            election,
            clock,
            self.peers,
            self.metrics,
            self.coordinator_driver.dispatch,
            self.spawn,
            check_quorum=not unsafe_no_read_index,
        )
        # The leaders' write connections to this replica: the last one closing is a sign
        # for the election that the leader is gone.
        self.leader_links = LeaderLinks(self.election.leader_gone)
        # Linearizable reads wait for a heartbeat round answered by a quorum (read_index.py).
        self.read_index = ReadIndexDriver(
            config,
            self.core,
            self.coordinator,
            self.peers,
            self.metrics,
            self.election.heartbeat,
            self.election.last_answers,
            self._learned_changed,
            self.spawn,
            confirm=not unsafe_no_read_index,
        )
        # The client's reads and tails (reads.py).
        self.reads = Reads(
            config,
            self.core,
            self.coordinator,
            self.forwarding,
            self.metrics,
            self.read_index.wait,
            self.learned_watch,
            self._learned_changed,
        )
        # A VOTING replica's pulls of the learned positions it missed (pulls.py).
        self.pulls = Pulls(
            config,
            self.core,
            self.coordinator,
            self.journal,
            self.peers,
            self.election.peer_statuses,
            self.spawn,
        )
        # The admission state of the learned entries, handed to the coordinator as it leads.
        self.admission = AdmissionDriver(
            self.core,
            self.coordinator,
            config,
            self._learned_changed,
            self.spawn,
            self.coordinator_driver.dispatch,
            self.repair.storage_fault_seen,
        )
        # What the AppendStream and the append lane ask of the replica (runtime/appends.py).
        self.appender = ReplicaAppender(
            self.coordinator_driver.append, self.repair.storage_fault_seen
        )
        # The bytes of clients' appends this replica holds at once (runtime/budgets.py).
        self.budget = metered_budget(
            config.id, config.max_inflight_bytes, config.max_stream_inflight_bytes, self.metrics
        )

    # ---- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        self.peers.connect()
        self.journal.start()
        if self.faults.condition == REFUSING:
            # Status only: no recovery, no election, nothing written (runtime/repair.py).
            self.reason = self.faults.fault
            self._update_metrics()
            return
        if not self.core.meta.stamped:
            self.journal.persist_nowait(self.core.stamp(self.config.log_id, self.config.id))
        loop = asyncio.get_running_loop()
        self._recovery_task = loop.create_task(
            self._supervise(self._recovery_loop), name="recovery"
        )
        self._tasks.append(self._recovery_task)
        self._tasks.append(
            loop.create_task(self._supervise(self.election.election_loop), name="election")
        )
        self._tasks.append(
            loop.create_task(self._supervise(self._heartbeat_loop), name="heartbeat")
        )
        if self.certificates is not None:
            self._tasks.append(
                loop.create_task(self._supervise(self._certificate_watch), name="certificates")
            )
        self._update_metrics()
        self.admission.start()
        if self.core.status != pb.VOTING:
            self.reason = "running the recover protocol"
        elif self.peers:
            self.spawn(self.pulls.after_restart())

    async def stop(self) -> None:
        for task in [*self._tasks, *self._background]:
            task.cancel()
        self._stopped = True
        self.admission.stopped = True
        self.election.stopped = True
        self.read_index.stopped = True
        self.peers.stop()
        self.coordinator_driver.stop()
        await self.journal.close()
        await self.peers.close()
        self.storage.close()

    async def _supervise(self, loop_fn: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Run a background loop; if it fails, log why and start it again: a replica whose
        recovery or election loop died silently would stay stuck for ever."""
        while True:
            try:
                await loop_fn()
                return
            except asyncio.CancelledError:
                raise
            except CorruptRecord as exc:
                self.repair.storage_fault_seen(exc)
                await asyncio.sleep(0.1)
            except Exception:
                if self.repair.disk_failing():  # said once, by repair; tried again after
                    await self.repair.disk_working()
                    continue
                log.exception("%s failed; restarting it in 1 s", loop_fn.__name__)
                self.reason = f"{loop_fn.__name__} failed (see the log); retrying"
                await asyncio.sleep(1.0)

    async def _certificate_watch(self) -> None:
        """Present a rotated certificate to the peers too: the server takes new files at
        the next handshake by itself, the peer channels are reopened here."""
        certificates = self.certificates
        assert certificates is not None
        seen = certificates.stamp
        while True:
            await asyncio.sleep(CERTIFICATE_CHECK_INTERVAL)
            certificates.refresh()
            if certificates.stamp != seen:
                seen = certificates.stamp
                log.info("certificate rotated: reconnecting to the peers with it")
                await self.peers.reconnect(grace=self.config.append_timeout)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a fire-and-forget task, keeping a reference so it is not collected."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(self._corrupt_record_seen)

    def _corrupt_record_seen(self, task: asyncio.Task[None]) -> None:
        """A background task (a pull, a send to a peer, a heartbeat...) that read a corrupt
        record hands it to the repair (docs/faults.md) instead of dying with it unseen."""
        if task.cancelled():
            return
        exc = task.exception()
        if isinstance(exc, CorruptRecord):
            self.repair.storage_fault_seen(exc)
        elif exc is not None:
            log.error("background task %s failed", task.get_name(), exc_info=exc)

    # ---- acceptor / learner ------------------------------------------------------------

    def _learned(self) -> None:
        """The replica learned a batch: wake whoever waits for it."""
        self._learned_changed.set()
        self.admission.on_learned()
        self._update_metrics()

    def _on_heartbeat(self, request: pb.LearnedRequest) -> None:
        """A leader's heartbeat: the election follows it, the pulls time themselves by it."""
        self.election.on_heartbeat(request)
        self.pulls.on_heartbeat(request)

    # ---- recovery ----------------------------------------------------------------------

    async def _recovery_loop(self) -> None:
        """While not VOTING: recover (`recover.recover`); then listen for a leader. A failing
        disk is waited for first (runtime/repair.py)."""
        await self.repair.disk_working()
        await recover(
            self.core,
            self.journal,
            self.peers,
            self.config,
            lambda: self.permit,
            Report(
                self._not_voting_because,
                self._catchup_progress,
                self._recovery_changed,
                self.faults.recover_undecided,
            ),
        )
        self.reason = ""
        self.catchup = NO_CATCHUP
        self.election.listen()  # a new voter first listens for a leader
        self.metrics.catchup_remaining.set(0)
        self._update_metrics()

    def _restart_recovery(self) -> None:
        """Stop leading and voting; run recovery again (it ends once the replica is VOTING)."""
        if self._stopped:
            return
        if self.coordinator.leading:
            self.coordinator.step_down(f"storage fault: {self.faults.fault}")
            self.coordinator_driver.dispatch()
        self.reason = f"repairing: {self.faults.fault}"
        self._update_metrics()
        if self._recovery_task is None or self._recovery_task.done():
            self._recovery_task = asyncio.get_running_loop().create_task(
                self._supervise(self._recovery_loop), name="recovery"
            )
            self._tasks.append(self._recovery_task)

    def _recovery_changed(self) -> None:
        self.faults.recover_decided()
        self._update_metrics()

    def _not_voting_because(self, reason: str) -> None:
        self.reason = reason

    def _catchup_progress(self, progress: CatchupProgress) -> None:
        self.catchup = progress
        self.metrics.catchup_remaining.set(progress.remaining)

    # ---- leadership --------------------------------------------------------------------

    def _on_leading(self, proposal: int, next_position: int) -> None:
        self.election.on_leading()
        self.reason = ""
        self.spawn(self.election.send_heartbeats())
        self.admission.on_leading(proposal, next_position - 1)

    def _on_demoted(self, reason: str, retry_after: float) -> None:
        self.read_index.fail_reads(f"not leading any more: {reason}")
        self.election.on_demoted(retry_after)

    # ---- heartbeats and pulls ----------------------------------------------------------

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)
            if self.coordinator.leading:
                await self.election.send_heartbeats()
                self.pulls.missed_own_writes()

    # ---- status ------------------------------------------------------------------------

    async def confirmed_status(self, time_limit: float) -> pb.StatusResponse:
        """The status, where a leader first confirms (read index, at most `time_limit` s)
        that a quorum still follows it: `role` "leader" only if it did; if it could not in time,
        "follower" with no `leader` and a `reason` saying so (the status contract knows two
        roles); never an error for want of a quorum."""
        if not self.coordinator.leading:
            return self.status()
        try:
            await self.read_index.confirm_leadership(time_limit)
        except RpcError:
            return self.status(confirmed=False)
        return self.status(confirmed=True)

    def status(self, confirmed: bool | None = None) -> pb.StatusResponse:
        """This replica's status. `confirmed`: whether a leader confirmed its leadership
        after the request arrived (None: not asked; `role` is then what it believes)."""
        leading = self.coordinator.leading
        role = "leader" if leading else "follower"
        leader = self.election.live_leader
        unconfirmed = leading and confirmed is False
        low = self.repair.disk_low()
        if unconfirmed:
            role, leader = "follower", ""
        return pb.StatusResponse(
            id=self.config.id,
            status=self.core.status,
            role=role,
            leader=leader,
            leader_confirmed=leading and confirmed is True,
            begin=self.core.begin,
            end=self.core.end,
            learned=self.core.learned,
            promised=self.core.promised,
            proposal=self.coordinator.proposal if leading else 0,
            log_id=self.config.log_id,
            replicas=len(self.config.peers),
            address=self.config.address,
            permit=self.permit,
            reason=(
                self.reason
                or "leads, but could not confirm within the call that a quorum still follows it"
                if unconfirmed
                else self.reason
            ),
            transport=self.config.transport,
            authorization="roles" if self.config.auth_config is not None else "off",
            admin=admin_callers(self.config),
            insecure=self.config.insecure,
            peer_trust=self.config.peer_trust,
            lane_offset=self.config.write_lane_offset,
            catchup_begin=self.catchup.begin,
            catchup_end=self.catchup.end,
            catchup_done=self.catchup.done,
            storage_fault=self.faults.fault or (f"disk full: {low}" if low else ""),
            corrupt_records=self.faults.corrupt_records,
            disk_full=bool(low),
            storage_condition=self.repair.condition(),
        )

    def _known_leader(self) -> KnownLeader:
        return KnownLeader(
            self.coordinator.leading,
            self.election.leader_id,
            self.election.since_heard(),
            self.reason,
        )

    def set_permit(self, permit: bool) -> None:
        """Grant or revoke the initialization permit (the operator's admin call)."""
        if permit != self.permit:
            log.info("initialization permit %s", "granted" if permit else "revoked")
        self.permit = permit
        self._update_metrics()

    def _update_metrics(self) -> None:
        self.learned_watch.advance(self.core.learned)
        m = self.metrics
        m.set_status(self.core.status)
        m.leader.set(1 if self.coordinator.leading else 0)
        m.begin.set(self.core.begin)
        m.end.set(self.core.end)
        m.learned.set(self.core.learned)
        m.promised.set(self.core.promised)
        m.proposal.set(self.coordinator.proposal)
        m.permit.set(1 if self.permit else 0)
        self.health.update(self.core.status)


def _warn_test_only(unsafe_no_read_index: bool) -> None:
    """Say loudly which test-only switches weaken this replica (rlog.config)."""
    if unsafe_no_read_index:
        log.warning(
            "%s=1: no read index nor check-quorum, reads are NOT linearizable (test only)",
            UNSAFE_NO_READ_INDEX_ENV,
        )
    if unsafe_split_fill():
        log.warning(
            "%s=1: fills settle positions one by one, an append's entries may be chosen "
            "in part (test only)",
            UNSAFE_SPLIT_FILL_ENV,
        )
    if unsafe_no_dedupe():
        log.warning(
            "%s=1: retried session appends are appended again, NOT exactly once (test only)",
            UNSAFE_NO_DEDUPE_ENV,
        )
