"""The coordinator's driver (the rules: protocol/coordinator.py): it feeds the `Coordinator`
its inputs (the client's appends, truncations, epochs and sessions; the peers' answers and
failures; its timers) and carries out its outputs (`dispatch`, after every input): messages
go out through `Peers` (to this replica itself last, straight to its own handlers), timers
are armed, the callers' appends are answered, and a change of leadership is told to the
rest of the replica (`leading`, `demoted`). How a batch is committed: the rules in
protocol/coordinator.py, this driver, and the journal (runtime/journal.py) that makes each
replica's part of it durable. A follower passes the client's writes to the leader
(runtime/forwarding.py).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

from rlog.config import ReplicaConfig
from rlog.packed import PackedError, count_of, max_size, run_count
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import (
    NO_CONDITIONS,
    SESSION_SECRET_BYTES,
    Conditions,
    Refuse,
    session_check,
)
from rlog.protocol.coordinator import (
    Coordinator,
    Demoted,
    Done,
    Elected,
    Failed,
    FailureKind,
    Leading,
    Refused,
    Send,
    SetTimer,
)
from rlog.protocol.replica import ReplicaCore
from rlog.runtime.errors import RpcError
from rlog.runtime.forwarding import Forwarding
from rlog.runtime.metrics import ReplicaMetrics
from rlog.runtime.peers import Peers, Response
from rlog.wire import Reason

log = logging.getLogger("rlog.node")


class CoordinatorDriver:
    """The node's side of the coordinator. `answered`: a peer answered a round (check-quorum
    counts it); `leading(proposal, next_position)`: this replica leads from that position;
    `demoted(reason, retry_after)`: it does not any more; `changed`: after each dispatch (the
    metrics); `disk_full_error`: why an append is refused for want of space (None: it is
    not)."""

    def __init__(
        self,
        config: ReplicaConfig,
        core: ReplicaCore,
        coordinator: Coordinator,
        peers: Peers,
        forwarding: Forwarding,
        metrics: ReplicaMetrics,
        answered: Callable[[int], None],
        leading: Callable[[int, int], None],
        demoted: Callable[[str, float], None],
        changed: Callable[[], None],
        disk_full_error: Callable[[], RpcError | None],
    ) -> None:
        self.config = config
        self.core = core
        self.coordinator = coordinator
        self.peers = peers
        self.forwarding = forwarding
        self.metrics = metrics
        self.answered = answered
        self.leading = leading
        self.demoted = demoted
        self.changed = changed
        self.disk_full_error = disk_full_error
        self.stopped = False
        self._waiters: dict[object, asyncio.Future[list[int]]] = {}
        self._epochs: dict[object, int] = {}  # take_epoch's tokens -> the epoch taken
        self._pump_scheduled = False

    def stop(self) -> None:
        """The replica stops: every append still waiting fails."""
        self.stopped = True
        for future in self._waiters.values():
            if not future.done():
                future.set_exception(RpcError(Reason.STOPPING, "replica stopping"))

    def dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        # Messages to this replica itself are posted last: after the writes to the peers
        # (their answers are the longer way round of a serial append) and after the appends
        # that are done are answered (their callers first; the leader's own learning of a
        # chosen batch is no part of the answer).
        own: list[Send] = []
        for output in self.coordinator.take():
            if isinstance(output, Send):
                message = output.message
                if output.to == self.config.id:
                    if isinstance(message, pb.WriteRequest):
                        self.metrics.batch_entries.observe(
                            len(message.actions) + sum(run_count(r) for r in message.runs)
                        )
                    own.append(output)
                    continue
                self.peers.post(output)
            elif isinstance(output, SetTimer):
                loop.call_later(output.delay, self._on_timer, output.round)
            elif isinstance(output, Done):
                if output.token in self._epochs:
                    self._epochs[output.token] = output.epoch
                future = self._waiters.pop(output.token, None)
                if future is not None and not future.done():
                    future.set_result(output.positions)
            elif isinstance(output, Refused):
                future = self._waiters.pop(output.token, None)
                if future is not None and not future.done():
                    future.set_exception(_refusal_error(output.refusal))
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
                log.info(
                    "leading at proposal %d from position %d", output.proposal, output.next_position
                )
                self.leading(output.proposal, output.next_position)
            elif isinstance(output, Demoted):
                self.demoted(output.reason, output.retry_after)
                log.info("not leading: %s", output.reason)
        for send in own:
            self.peers.post(send)
        self.changed()

    def _on_timer(self, round_id: int) -> None:
        if self.stopped:
            return
        self.coordinator.on_timeout(round_id)
        self.dispatch()

    def on_reply(self, send: Send, response: Response) -> None:
        self.answered(send.to)
        self.coordinator.on_reply(send.round, send.to, response)
        self.dispatch()

    def on_send_failure(self, send: Send) -> None:
        self.coordinator.on_failure(send.round, send.to)
        self.dispatch()

    def _schedule_pump(self) -> None:
        if not self._pump_scheduled:
            self._pump_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump)

    def _pump(self) -> None:
        self._pump_scheduled = False
        self.coordinator.pump()
        self.dispatch()

    async def append(
        self,
        data: bytes,
        offsets: bytes,
        forwarded: bool,
        conditions: Conditions = NO_CONDITIONS,
    ) -> list[int]:
        """Append a batch of packed values (docs/data-path.md) as one request: all or none of
        it is chosen; its positions. Offsets that do not check out append nothing."""
        try:
            largest = max_size(data, offsets)
        except PackedError as exc:
            raise RpcError(Reason.INVALID_ARGUMENT, f"bad packed values: {exc}") from None
        if largest > self.config.max_entry_size:
            raise RpcError(
                Reason.ENTRY_TOO_LARGE,
                f"entry of {largest} bytes exceeds the maximum entry size of "
                f"{self.config.max_entry_size} bytes",
            )
        count = count_of(offsets)
        if not count:
            return []
        leader = await self.forwarding.await_leader(forwarded)
        if leader is not None:
            return await self.forwarding.append(leader, data, offsets, conditions)
        if (full := self.disk_full_error()) is not None:
            raise full  # this leader cannot store it: refuse before proposing anything
        started = time.perf_counter()
        token = object()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._waiters[token] = future
        self.coordinator.propose(token, pb.Run(data=data, offsets=offsets), conditions)
        self._schedule_pump()
        self.dispatch()
        positions = await future
        self.metrics.appends.inc(count)
        self.metrics.append_bytes.inc(len(data))
        self.metrics.append_latency.observe(time.perf_counter() - started)
        return positions

    async def take_epoch(self, forwarded: bool) -> pb.TakeEpochResponse:
        """Append an EPOCH entry (the log's epoch + 1, set by the coordinator)."""
        leader = await self.forwarding.await_leader(forwarded)
        if leader is not None:
            return await self.forwarding.take_epoch(leader)
        token = object()
        self._epochs[token] = 0
        try:
            (position,) = await self._propose_one(pb.Action(type=pb.EPOCH), token)
            return pb.TakeEpochResponse(epoch=self._epochs[token], position=position)
        finally:
            self._epochs.pop(token, None)

    async def open_session(self, forwarded: bool) -> pb.OpenSessionResponse:
        """Append a SESSION entry; the session id is its position. Its secret is chosen
        here and told only to the opener; the entry carries its check (protocol/admission.py),
        so every replica that learns it checks the session's appends."""
        leader = await self.forwarding.await_leader(forwarded)
        if leader is not None:
            return await self.forwarding.open_session(leader)
        secret = secrets.token_bytes(SESSION_SECRET_BYTES)
        (position,) = await self._propose_one(
            pb.Action(type=pb.SESSION, session_check=session_check(secret))
        )
        return pb.OpenSessionResponse(
            session=position, window=self.config.session_window, secret=secret
        )

    async def _propose_one(self, action: pb.Action, token: object | None = None) -> list[int]:
        token = token if token is not None else object()
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._waiters[token] = future
        self.coordinator.propose(token, [action])
        self._schedule_pump()
        self.dispatch()
        return await future

    async def truncate(self, to: int, forwarded: bool) -> int:
        leader = await self.forwarding.await_leader(forwarded)
        if leader is not None:
            return await self.forwarding.truncate(leader, to)
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
        self.dispatch()
        (position,) = await future
        return position


def _refusal_error(refusal: Refuse) -> RpcError:
    reason = Reason(refusal.reason.value)
    return RpcError(
        reason,
        refusal.message,
        begin=refusal.begin if reason == Reason.TRUNCATED else None,
        next_position=refusal.next_position if reason == Reason.CONDITION_FAILED else None,
        epoch=refusal.epoch if reason == Reason.CONDITION_FAILED else None,
    )


def _failure_error(failed: Failed) -> RpcError:
    if failed.kind == FailureKind.NOT_LEADER:
        return RpcError(Reason.NOT_LEADER, failed.reason)
    if failed.kind == FailureKind.TIMEOUT:
        return RpcError(Reason.TIMEOUT, failed.reason + " (outcome unknown)")
    return RpcError(Reason.OUTCOME_UNKNOWN, failed.reason + " (outcome unknown)")
