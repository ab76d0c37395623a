"""A replica node: the pure core and coordinator wrapped with disk, network and timers.

- acceptor/learner: requests run through `ReplicaCore`, their batches through the `Journal`
  (group commit), and the reply leaves only after the batch is durable;
- coordinator: the node drives `Coordinator`, sending its messages to peers over gRPC (to
  itself directly), arming its timers and completing the callers' appends;
- election: the node ticks `Election` (when to stand, whom to follow, which rivals to
  refuse), runs the pre-vote's Status calls it asks for and stands when it says;
- followers pull learned entries they missed from the leader (`Fetch`), so every VOTING
  replica ends up holding every chosen entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from rlog.client.wire import FORWARDED, PEER_CHANNEL_OPTIONS, Reason
from rlog.config import ConfigError, ReplicaConfig
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.protocol.coordinator import (
    Coordinator,
    CoordinatorConfig,
    Demoted,
    Done,
    Elected,
    Failed,
    FailureKind,
    Leading,
    Send,
    SetTimer,
)
from rlog.protocol.election import Election, StandDown
from rlog.protocol.recover import Decision, Next, RecoverRound
from rlog.protocol.replica import ReplicaCore, tombstone
from rlog.runtime.catchup import CatchUp
from rlog.runtime.errors import RpcError
from rlog.runtime.journal import Journal
from rlog.runtime.metrics import ReplicaMetrics
from rlog.storage import Storage

log = logging.getLogger("rlog.node")

READ_CHUNK_POSITIONS = 1024
READ_CHUNK_BYTES = 4 * 1024 * 1024
LEARNED_LINGER = 0.005  # seconds a learned range waits for a write to ride on
ELECTION_TICK = 0.02  # seconds between looks at the election timer


def _piggybackable(message: object) -> bool:
    """Learned ranges of the leader's own batches (not heartbeats, not full actions)."""
    return (
        isinstance(message, pb.LearnedRequest)
        and not message.actions
        and not message.leader_address
        and len(message.ranges) > 0
    )


@dataclass
class Peer:
    id: int
    address: str
    replica: pbg.ReplicaStub
    log: pbg.LogStub


class Node:
    def __init__(self, config: ReplicaConfig, storage: Storage) -> None:
        self.config = config
        self.storage = storage
        self.core = ReplicaCore(storage)
        self.metrics = ReplicaMetrics(config.id)
        self.journal = Journal(storage, self.core, self.metrics)
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
            ),
            log_id=config.log_id,
        )
        self.peers: dict[int, Peer] = {}
        self._channels: list[grpc.aio.Channel] = []
        # When to stand for election, whom this replica follows (the rules: election.py).
        self.election = Election(
            config.id,
            config.address,
            len(config.peers),
            config.election_timeout,
            self.core,
            self.coordinator,
            time.monotonic(),
            random.Random(),
        )
        self._prev_leader_learned = 0
        self._fetching = False
        self._waiters: dict[object, asyncio.Future[list[int]]] = {}
        self._pump_scheduled = False
        self._learned_changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[None]] = set()
        self._stopped = False
        self._held_learned: dict[int, pb.LearnedRequest] = {}
        self.permit = config.auto_initialize
        self.reason = ""
        self.catchup: tuple[int, int, int] = (0, 0, 0)  # begin, end, positions done
        self._check_identity()

    # ---- lifecycle ---------------------------------------------------------------------

    def _check_identity(self) -> None:
        """Refuse a data dir stamped for another log or another replica: a log deleted and
        recreated, or a volume attached to the wrong pod, must never reuse old data."""
        meta = self.core.meta
        if not meta.stamped:
            return
        if meta.log_id != self.config.log_id:
            raise ConfigError(
                f"data dir {self.config.data_dir} belongs to log {meta.log_id or '(no id)'!r}, "
                f"not {self.config.log_id or '(no id)'!r}: refusing to start on another log's data"
            )
        if meta.replica_id != self.config.id:
            raise ConfigError(
                f"data dir {self.config.data_dir} belongs to replica {meta.replica_id}, "
                f"not {self.config.id}: refusing to start on another replica's data"
            )

    def start(self) -> None:
        for peer_id, address in enumerate(self.config.peers):
            if peer_id == self.config.id:
                continue
            channel = grpc.aio.insecure_channel(address, options=PEER_CHANNEL_OPTIONS)
            self._channels.append(channel)
            self.peers[peer_id] = Peer(
                peer_id, address, pbg.ReplicaStub(channel), pbg.LogStub(channel)
            )
        self.journal.start()
        if not self.core.meta.stamped:
            self.journal.persist_nowait(self.core.stamp(self.config.log_id, self.config.id))
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._supervise(self._recovery_loop), name="recovery"))
        self._tasks.append(loop.create_task(self._supervise(self._election_loop), name="election"))
        self._tasks.append(
            loop.create_task(self._supervise(self._heartbeat_loop), name="heartbeat")
        )
        self._update_metrics()
        if self.core.status != pb.VOTING:
            self.reason = "running the recover protocol"

    async def stop(self) -> None:
        for task in [*self._tasks, *self._background]:
            task.cancel()
        self._stopped = True
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(RpcError(Reason.STOPPING, "replica stopping"))
        await self.journal.close()
        for channel in self._channels:
            await channel.close(grace=None)
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
            except Exception:
                log.exception("%s failed; restarting it in 1 s", loop_fn.__name__)
                self.reason = f"{loop_fn.__name__} failed (see the log); retrying"
                await asyncio.sleep(1.0)

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run a fire-and-forget task, keeping a reference so it is not collected."""
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    @property
    def is_leader(self) -> bool:
        return self.coordinator.leading

    # ---- acceptor / learner ------------------------------------------------------------

    async def handle_promise(self, request: pb.PromiseRequest) -> pb.PromiseResponse:
        if not request.positions and self.election.refuses(request.candidate, time.monotonic()):
            self.metrics.rejects.labels("promise").inc()
            return pb.PromiseResponse(
                verdict=pb.REJECT,
                proposal=self.core.promised,
                begin=self.core.begin,
                status=self.core.status,
            )
        reply = self.core.on_promise(request)
        assert isinstance(reply.response, pb.PromiseResponse)
        if reply.response.verdict == pb.ACCEPT:
            # Before the persist: our own candidacy must not start while another is under way.
            self.election.on_promise_accepted(time.monotonic(), request.candidate)
        if reply.persist is not None:
            await self.journal.persist(reply.persist)
        if reply.response.verdict == pb.REJECT:
            self.metrics.rejects.labels("promise").inc()
        self.coordinator.observe(request.proposal)
        self._update_metrics()
        return reply.response

    async def handle_write(self, request: pb.WriteRequest) -> pb.WriteResponse:
        if request.HasField("learned"):
            self.handle_learned(request.learned)
        reply = self.core.on_write(request)
        if reply.persist is not None:
            await self.journal.persist(reply.persist)
        assert isinstance(reply.response, pb.WriteResponse)
        if reply.response.verdict == pb.REJECT:
            self.metrics.rejects.labels("write").inc()
        return reply.response

    def handle_learned(self, request: pb.LearnedRequest) -> None:
        if request.leader_address and request.leader != self.config.id:
            self._on_heartbeat(request)
        batch = self.core.on_learned(request)
        if batch is not None:
            self.journal.persist_nowait(batch)
            self._learned_changed.set()
            self._update_metrics()

    def _on_heartbeat(self, request: pb.LearnedRequest) -> None:
        step_down = self.election.on_heartbeat(
            time.monotonic(), request.leader, request.leader_address, request.proposal
        )
        if step_down is not None:
            self.coordinator.step_down(step_down.reason)
            self._dispatch()
        self.coordinator.observe(request.proposal)
        target, self._prev_leader_learned = self._prev_leader_learned, request.leader_learned
        # Pull what the leader had learned a heartbeat ago and we still lack: what it learned
        # since may still be arriving in ordinary learned messages.
        if self.core.learned < target and not self._fetching:
            self._fetching = True
            self.spawn(self._pull_learned(request.leader, target))

    async def _pull_learned(self, leader: int, target: int) -> None:
        peer = self.peers.get(leader)
        try:
            if peer is not None:
                await self.copy_learned(peer, target, 4096)
        except grpc.aio.AioRpcError as exc:
            log.debug("pull of learned entries from %s failed: %s", leader, exc.code())
        finally:
            self._fetching = False

    async def copy_learned(
        self, peer: Peer, last: int, chunk_size: int, on_chunk: Callable[[], None] | None = None
    ) -> bool:
        """Copy the learned actions a peer holds from our first unlearned position up to
        `last` (safe: a learned action is chosen). A peer whose begin is past ours truncated
        that prefix: a tombstone below its begin skips it in one step. Returns whether
        anything was applied; gRPC errors propagate."""
        progressed = False
        stream = peer.replica.Fetch(
            pb.FetchRequest(
                **{"from": self.core.learned_next, "to": last, "max_actions": chunk_size}
            ),
            timeout=60,
        )
        async for chunk in stream:
            actions = list(chunk.actions)
            if chunk.begin > self.core.begin and chunk.begin > self.core.learned_next:
                actions.insert(0, tombstone(chunk.begin - 1))
            if actions:
                self.handle_learned(pb.LearnedRequest(actions=actions))
                progressed = True
            if on_chunk is not None:
                on_chunk()
        return progressed

    def fetch(self, request: pb.FetchRequest) -> Iterator[pb.FetchResponse]:
        """Learned actions from `from` to `to` held here, in chunks bounded in count and
        bytes, up to the first position this replica has not learned."""
        first = max(getattr(request, "from"), self.core.begin)
        last = min(request.to, self.core.end)
        limit = request.max_actions or 4096
        sent = 0
        while first <= last and sent < limit:
            actions = self.core.learned_actions(
                first, last, min(READ_CHUNK_POSITIONS, limit - sent), READ_CHUNK_BYTES
            )
            if not actions:
                break
            yield pb.FetchResponse(actions=actions, begin=self.core.begin)
            sent += len(actions)
            first = actions[-1].position + 1
        if sent == 0:
            yield pb.FetchResponse(begin=self.core.begin)

    # ---- recovery ----------------------------------------------------------------------

    async def _recovery_loop(self) -> None:
        """While not VOTING: recover rounds until one decides, then act on the decision."""
        while self.core.status != pb.VOTING:
            decision = await self._recover_round()
            if decision is None:
                await asyncio.sleep(random.uniform(0.5, 1.0))
                continue
            if decision.next == Next.STARTING:
                log.info("auto-initialization: EMPTY -> STARTING")
                await self.journal.persist(self.core.set_status(pb.STARTING))
            elif decision.next == Next.VOTING:
                log.info("auto-initialization: STARTING -> VOTING")
                await self.journal.persist(self.core.set_status(pb.VOTING))
            else:
                await self._catch_up(decision)
            self._update_metrics()
        self.reason = ""
        self.catchup = (0, 0, 0)
        self.last_heard = time.monotonic()  # a new voter first listens for a leader
        self.metrics.catchup_remaining.set(0)
        self._update_metrics()

    async def _recover_round(self) -> Decision | None:
        round_ = RecoverRound(
            len(self.config.peers), self.core.status, self.permit, self.config.log_id
        )
        decision = round_.add(self.config.id, self.recover_info())
        if decision is not None:
            return decision
        request = pb.RecoverRequest(log_id=self.config.log_id)

        async def ask(peer: Peer) -> tuple[int, pb.RecoverResponse | None]:
            try:
                return peer.id, await peer.replica.Recover(request, timeout=2.0)
            except grpc.aio.AioRpcError:
                return peer.id, None

        for next_reply in asyncio.as_completed([ask(p) for p in self.peers.values()]):
            replica, response = await next_reply
            if response is not None:
                decision = round_.add(replica, response)
                if decision is not None:
                    return decision
        self.reason = round_.reason()
        log.info("recover round undecided (%s): %s", pb.Status.Name(self.core.status), self.reason)
        return None

    async def _catch_up(self, decision: Decision) -> None:
        if self.core.status != pb.RECOVERING:
            await self.journal.persist(self.core.set_status(pb.RECOVERING))
        self.reason = f"catching up [{decision.begin}, {decision.end}]"
        self._update_metrics()
        await CatchUp(self, decision).run()
        await self.journal.persist(self.core.finish_recovery(decision.promised))
        log.info(
            "caught up to %d: RECOVERING -> VOTING (promised %d)", decision.end, self.core.promised
        )

    def recover_info(self) -> pb.RecoverResponse:
        response = pb.RecoverResponse(status=self.core.status, log_id=self.config.log_id)
        if self.core.status == pb.VOTING:
            response.begin = self.core.begin
            response.end = self.core.end
            response.promised = self.core.promised
        return response

    # ---- coordinator driving -----------------------------------------------------------

    def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        for output in self.coordinator.take():
            if isinstance(output, Send):
                message = output.message
                if output.to != self.config.id:
                    if _piggybackable(message):
                        self._hold_learned(output.to, message)  # type: ignore[arg-type]
                        continue
                    if isinstance(message, pb.WriteRequest):
                        output = Send(
                            output.to, self._attach_learned(output.to, message), output.round
                        )
                elif isinstance(message, pb.WriteRequest):
                    self.metrics.batch_entries.observe(len(message.actions))
                self.spawn(self._send(output))
            elif isinstance(output, SetTimer):
                loop.call_later(output.delay, self._on_timer, output.round)
            elif isinstance(output, Done):
                future = self._waiters.pop(output.token, None)
                if future is not None and not future.done():
                    future.set_result(output.positions)
            elif isinstance(output, Failed):
                self.metrics.append_failures.labels(output.kind.value).inc()
                future = self._waiters.pop(output.token, None)
                if future is not None and not future.done():
                    future.set_exception(_failure_error(output))
            elif isinstance(output, Elected):
                self.metrics.elections.labels("won").inc()
                log.info(
                    "elected with proposal %d, filling up to %d", output.proposal, output.index
                )
            elif isinstance(output, Leading):
                self.election.on_leading()
                self.reason = ""
                log.info(
                    "leading at proposal %d from position %d", output.proposal, output.next_position
                )
                self.spawn(self._send_heartbeats())
            elif isinstance(output, Demoted):
                if self.election.on_demoted(time.monotonic(), output.retry_after):
                    self.metrics.elections.labels("demoted").inc()
                else:
                    self.metrics.elections.labels("lost").inc()
                log.info("not leading: %s", output.reason)
        self._update_metrics()

    def _hold_learned(self, peer: int, message: pb.LearnedRequest) -> None:
        """Keep learned ranges for a peer until the next write to it (one RPC instead of
        two), or until `LEARNED_LINGER` passes with no write."""
        held = self._held_learned.get(peer)
        if held is not None and held.proposal != message.proposal:
            self._flush_learned(peer)
            held = None
        if held is None:
            held = pb.LearnedRequest(
                proposal=message.proposal, leader=message.leader, log_id=message.log_id
            )
            self._held_learned[peer] = held
            asyncio.get_running_loop().call_later(LEARNED_LINGER, self._flush_learned, peer)
        held.ranges.extend(message.ranges)

    def _attach_learned(self, peer: int, write: pb.WriteRequest) -> pb.WriteRequest:
        held = self._held_learned.pop(peer, None)
        if held is None or held.proposal != write.proposal:
            if held is not None:
                self.spawn(self._send(Send(peer, held)))
            return write
        copy = pb.WriteRequest()
        copy.CopyFrom(write)
        copy.learned.CopyFrom(held)
        return copy

    def _flush_learned(self, peer: int) -> None:
        held = self._held_learned.pop(peer, None)
        if held is not None and not self._stopped:
            self.spawn(self._send(Send(peer, held)))

    def _on_timer(self, round_id: int) -> None:
        if self._stopped:
            return
        self.coordinator.on_timeout(round_id)
        self._dispatch()

    async def send_one_way(self, peer: Peer, message: pb.LearnedRequest) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.TimeoutError):
            await peer.replica.Learned(message, timeout=max(1.0, self.config.election_timeout))

    async def _send(self, send: Send) -> None:
        message = send.message
        try:
            if send.to == self.config.id:
                response = await self._local(message)
            else:
                response = await self._remote(self.peers[send.to], message)
        except (TimeoutError, grpc.aio.AioRpcError, RpcError):
            if send.round:
                self.coordinator.on_failure(send.round, send.to)
                self._dispatch()
            return
        if send.round and response is not None:
            self.coordinator.on_reply(send.round, send.to, response)
            self._dispatch()

    async def _local(
        self, message: pb.PromiseRequest | pb.WriteRequest | pb.LearnedRequest
    ) -> pb.PromiseResponse | pb.WriteResponse | None:
        if isinstance(message, pb.PromiseRequest):
            return await self.handle_promise(message)
        if isinstance(message, pb.WriteRequest):
            return await self.handle_write(message)
        self.handle_learned(message)
        return None

    async def _remote(
        self, peer: Peer, message: pb.PromiseRequest | pb.WriteRequest | pb.LearnedRequest
    ) -> pb.PromiseResponse | pb.WriteResponse | None:
        if isinstance(message, pb.PromiseRequest):
            return await peer.replica.Promise(message, timeout=self.coordinator.config.fill_timeout)
        if isinstance(message, pb.WriteRequest):
            return await peer.replica.Write(message, timeout=self.config.append_timeout)
        await peer.replica.Learned(message, timeout=max(1.0, self.config.election_timeout))
        return None

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_scheduled = False
        self.coordinator.pump()
        self._dispatch()

    # ---- election and heartbeats -------------------------------------------------------

    async def _election_loop(self) -> None:
        """Tick the election state machine; run the pre-vote it asks for, stand if it says."""
        self.election.restart_timer()  # a (re)started loop first listens a full timeout
        while True:
            await asyncio.sleep(ELECTION_TICK)
            if self.election.tick(time.monotonic()) is None:
                continue
            outcome = self.election.on_pre_vote(time.monotonic(), await self._peer_statuses())
            if isinstance(outcome, StandDown):
                log.debug("not standing for election: %s", outcome.reason)
                continue
            log.debug("standing for election: %s", outcome.reason)
            self.metrics.elections.labels("started").inc()
            self.coordinator.elect()
            self._dispatch()

    async def _peer_statuses(self) -> list[pb.StatusResponse | None]:
        """The pre-vote's question: every peer's Status (None: no answer in time)."""

        async def status_of(peer: Peer) -> pb.StatusResponse | None:
            try:
                return await peer.log.Status(pb.StatusRequest(), timeout=0.5)
            except grpc.aio.AioRpcError:
                return None

        return list(await asyncio.gather(*(status_of(p) for p in self.peers.values())))

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.heartbeat_interval)
            if self.coordinator.leading:
                await self._send_heartbeats()

    async def _send_heartbeats(self) -> None:
        heartbeat = pb.LearnedRequest(
            proposal=self.coordinator.proposal,
            leader=self.config.id,
            leader_address=self.config.address,
            leader_learned=self.core.learned,
            log_id=self.config.log_id,
        )
        for peer in self.peers.values():
            self.spawn(self._send(Send(peer.id, heartbeat)))

    # ---- client API --------------------------------------------------------------------

    async def append(self, actions: list[pb.Action], forwarded: bool) -> list[int]:
        for action in actions:
            if len(action.value) > self.config.max_entry_size:
                raise RpcError(
                    Reason.ENTRY_TOO_LARGE,
                    f"entry of {len(action.value)} bytes exceeds the maximum entry size of "
                    f"{self.config.max_entry_size} bytes",
                )
        if not actions:
            return []
        leader = await self._await_leader(forwarded)
        if leader is not None:
            return await self._forward_append(leader, actions)
        started = time.perf_counter()
        token = object()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._waiters[token] = future
        self.coordinator.propose(token, actions)
        self._schedule_pump()
        self._dispatch()
        positions = await future
        self.metrics.appends.inc(len(actions))
        self.metrics.append_bytes.inc(sum(len(a.value) for a in actions))
        self.metrics.append_latency.observe(time.perf_counter() - started)
        return positions

    async def _await_leader(self, forwarded: bool) -> Peer | None:
        """None if this replica leads; else the leader's peer. Waits for an election."""
        deadline = time.monotonic() + 3 * self.config.election_timeout + 1
        while True:
            if self.coordinator.leading:
                return None
            if self.core.status != pb.VOTING and not forwarded and self.leader_id is None:
                raise RpcError(
                    Reason.NO_LEADER,
                    f"no leader: this replica is {pb.Status.Name(self.core.status)}"
                    + (f" ({self.reason})" if self.reason else ""),
                )
            if (
                not forwarded
                and self.leader_id is not None
                and self.leader_id != self.config.id
                and time.monotonic() - self.last_heard < 2 * self.config.election_timeout
            ):
                return self.peers[self.leader_id]
            if time.monotonic() > deadline:
                raise RpcError(
                    Reason.NOT_LEADER if forwarded else Reason.NO_LEADER,
                    "this replica is not the leader"
                    if forwarded
                    else "no leader elected: a quorum of VOTING replicas may be unreachable",
                )
            await asyncio.sleep(0.02)

    async def _forward_append(self, leader: Peer, actions: list[pb.Action]) -> list[int]:
        values = [a.value for a in actions]
        if any(a.type != pb.APPEND for a in actions):
            (truncate,) = actions
            response = await self._forwarded_call(
                leader.log.Truncate(
                    pb.TruncateRequest(to=truncate.truncate_to),
                    metadata=((FORWARDED, "1"),),
                    timeout=self.config.append_timeout + 5,
                )
            )
            return [response.position]
        result = await self._forwarded_call(
            leader.log.Append(
                pb.AppendRequest(values=values),
                metadata=((FORWARDED, "1"),),
                timeout=self.config.append_timeout + 5,
            )
        )
        return list(result.positions)

    @staticmethod
    async def _forwarded_call(call):  # type: ignore[no-untyped-def]
        try:
            return await call
        except grpc.aio.AioRpcError as exc:
            raise RpcError.from_leader(exc, mutating=True) from None

    async def truncate(self, to: int, forwarded: bool) -> int:
        leader = await self._await_leader(forwarded)
        if leader is not None:
            (position,) = await self._forward_append(
                leader, [pb.Action(type=pb.TRUNCATE, truncate_to=to)]
            )
            return position
        if to > self.coordinator.next_position:
            raise RpcError(
                Reason.PAST_END,
                f"cannot truncate to {to}: past the end of the log "
                f"(next position {self.coordinator.next_position})",
            )
        if to <= self.core.begin:
            raise RpcError(
                Reason.TRUNCATED,
                f"cannot truncate to {to}: the log already begins at {self.core.begin}",
                begin=self.core.begin,
            )
        token = object()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._waiters[token] = future
        self.coordinator.propose(token, [pb.Action(type=pb.TRUNCATE, truncate_to=to)])
        self._schedule_pump()
        self._dispatch()
        (position,) = await future
        return position

    async def read_range(
        self, first: int | None, last: int | None, stale: bool
    ) -> AsyncIterator[list[pb.Entry]]:
        """Validated learned APPEND entries in [first, last] held here, in chunks."""
        begin = self.core.begin
        first = begin if first is None else first
        learned_end = self.core.learned
        if last is not None and last > learned_end and not stale:
            learned_end = await self._await_learned(last)
        end = learned_end if last is None else last
        if first < begin:
            raise RpcError(
                Reason.TRUNCATED,
                f"position {first} is truncated: the log begins at {begin}",
                begin=begin,
            )
        if last is not None and last > learned_end:
            raise RpcError(
                Reason.PAST_END,
                f"position {last} is past the end of the log (end {learned_end})",
                end=learned_end,
            )
        if first > end:
            if last is not None:
                raise RpcError(Reason.INVALID_ARGUMENT, f"from {first} is after to {last}")
            if first > learned_end + 1:
                raise RpcError(
                    Reason.PAST_END,
                    f"position {first} is past the end of the log (end {learned_end})",
                    end=learned_end,
                )
            return
        position = first
        while position <= end:
            actions = self.core.learned_actions(
                position, end, READ_CHUNK_POSITIONS, READ_CHUNK_BYTES
            )
            if position < self.core.begin:
                raise RpcError(
                    Reason.TRUNCATED,
                    f"position {position} was truncated during the read "
                    f"(the log begins at {self.core.begin})",
                    begin=self.core.begin,
                )
            if not actions:
                raise RpcError(
                    Reason.NOT_LEARNED,
                    f"position {position} is not learned on this replica yet",
                )
            entries = [
                pb.Entry(position=a.position, value=a.value) for a in actions if a.type == pb.APPEND
            ]
            if entries:
                yield entries
            position = actions[-1].position + 1

    async def _await_learned(self, position: int) -> int:
        """Wait briefly for in-flight positions up to `position` to be learned."""
        deadline = time.monotonic() + 1.0
        while self.core.learned < position and time.monotonic() < deadline:
            if not self.coordinator.leading or position >= self.coordinator.next_position:
                break
            self._learned_changed.clear()
            try:
                await asyncio.wait_for(self._learned_changed.wait(), 0.05)
            except TimeoutError:
                pass
        return self.core.learned

    async def wait_learned_past(self, position: int) -> None:
        while self.core.learned < position:
            self._learned_changed.clear()
            try:
                await asyncio.wait_for(self._learned_changed.wait(), 0.5)
            except TimeoutError:
                pass

    def status(self) -> pb.StatusResponse:
        leading = self.coordinator.leading
        return pb.StatusResponse(
            id=self.config.id,
            status=self.core.status,
            role="leader" if leading else "follower",
            leader=self.live_leader,
            begin=self.core.begin,
            end=self.core.end,
            learned=self.core.learned,
            promised=self.core.promised,
            proposal=self.coordinator.proposal if leading else 0,
            log_id=self.config.log_id,
            replicas=len(self.config.peers),
            address=self.config.address,
            permit=self.permit,
            reason=self.reason,
            catchup_begin=self.catchup[0],
            catchup_end=self.catchup[1],
            catchup_done=self.catchup[2],
        )

    def set_permit(self, permit: bool) -> None:
        """Grant or revoke the initialization permit (the operator's admin call)."""
        if permit != self.permit:
            log.info("initialization permit %s", "granted" if permit else "revoked")
        self.permit = permit
        self._update_metrics()

    @property
    def live_leader(self) -> str:
        """The leader's address if this replica leads or heard it within an election
        timeout; empty otherwise (a stale leader must not look alive to a pre-vote)."""
        return self.election.live_leader(time.monotonic())

    @property
    def leader_id(self) -> int | None:
        """The leader this replica follows (itself while it leads), if any."""
        return self.election.leader_id

    @property
    def last_heard(self) -> float:
        """When the leader was last heard (the election timer's last reset)."""
        return self.election.last_heard

    @last_heard.setter
    def last_heard(self, now: float) -> None:
        # A replica that just turned VOTING first listens for the leader.
        self.election.listen(now)

    def step_down(self) -> None:
        if self.coordinator.leading:
            self.coordinator.step_down("asked to step down")
            self._dispatch()
            # Give another replica the chance: wait out a full election timeout first.
            self.election.stepped_down(time.monotonic())

    def _update_metrics(self) -> None:
        m = self.metrics
        m.set_status(self.core.status)
        m.leader.set(1 if self.coordinator.leading else 0)
        m.begin.set(self.core.begin)
        m.end.set(self.core.end)
        m.learned.set(self.core.learned)
        m.promised.set(self.core.promised)
        m.proposal.set(self.coordinator.proposal)
        m.permit.set(1 if self.permit else 0)


def _failure_error(failed: Failed) -> RpcError:
    if failed.kind == FailureKind.NOT_LEADER:
        return RpcError(Reason.NOT_LEADER, failed.reason)
    if failed.kind == FailureKind.TIMEOUT:
        return RpcError(Reason.TIMEOUT, failed.reason + " (outcome unknown)")
    return RpcError(Reason.OUTCOME_UNKNOWN, failed.reason + " (outcome unknown)")
