"""The client's sessions (`Session`, `OpenSession`) and its exactly-once appends in them
(`ExactlyOnce`).

Appends are exactly-once by default: the client opens a session (one SESSION entry in the
log, lazily, on its first append) and sends each append with (session, sequence number); an
append whose outcome is unknown (a lost connection, a leadership change, a replica stopping)
is sent again with the same pair until the append deadline, and the log answers a retry of
an append it already holds with the original positions. An append whose session expired
before its retry got through raises `SessionExpired` (its outcome stays unknown); the
client opens a new session for later appends. What follows a failed try is the pure rule
`retry.next_turn`; `ExactlyOnce.append` only does the I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import NamedTuple, Protocol

from rlog.client.errors import OutcomeUnknown, RlogError
from rlog.client.packing import Payload
from rlog.client.retry import Next, Tries, TryFailed, next_turn
from rlog.proto import rlog_pb2 as pb


class SessionGrant(NamedTuple):
    """A session the log opened: its id, its window (in positions) and its secret, which
    every append in it must carry (`AppendRequest.session_secret`, docs/security.md,
    "Sessions"). Empty from a replica that predates session secrets."""

    session: int
    window: int
    secret: bytes


class SessionOpener(Protocol):
    async def open_session(self) -> SessionGrant:
        """Open a new session in the log."""
        ...


# One try of an append (values, its request fields, the seconds it has): its positions.
SendOnce = Callable[[Payload, pb.AppendRequest, float | None], Awaitable[Sequence[int]]]


class OpenSession:
    """One session of a client: its id, next sequence, and the sequences in flight."""

    def __init__(self, session_id: int, window: int, secret: bytes = b"") -> None:
        self.id = session_id
        self.window = window
        self.secret = secret
        self.next_sequence = 1
        self.pending: set[int] = set()
        self.highest_position = session_id

    def take_sequence(self) -> int:
        sequence = self.next_sequence
        self.next_sequence += 1
        self.pending.add(sequence)
        return sequence

    def acked_below(self) -> int:
        """Every sequence below this one has its answer (the log may forget them)."""
        return min(self.pending, default=self.next_sequence)

    def answered(self, positions: Sequence[int]) -> None:
        if positions:
            self.highest_position = max(self.highest_position, positions[-1])

    @property
    def aging(self) -> bool:
        """Half the window is used: new appends go to a fresh session, so that retries
        rarely outlive theirs."""
        return self.highest_position - self.id > self.window // 2


class Session:
    """The client's current session, opened lazily and renewed when it ages or expires."""

    def __init__(self) -> None:
        self._current: OpenSession | None = None
        self._lock: asyncio.Lock | None = None
        self._renewing = 0  # callers in `_take`, waiting for the lock or holding it

    @property
    def is_open(self) -> bool:
        return self._current is not None

    async def current(
        self, opener: SessionOpener, deadline: float | None, renew: bool = True
    ) -> OpenSession:
        """The session to use (`renew=False`: an aging one too).

        Callers get it in the order they ask, which is the order their requests are sent
        in (a caller sends, without waiting again, as soon as it has its session): while
        anyone is in `renew`, a caller queues behind them even if the session is usable
        now. Taking it at once then let an append formed after a renewal overtake those
        still waking from the lock, and a stream client's appends, sent in order, landed
        out of order (a Spark sink test saw a task's chunks reordered)."""
        session = self._current
        usable = session is not None and (not session.aging or not renew)
        if session is not None and usable and not self._renewing:
            return session
        return await self._take(opener, session, deadline, replace=not usable)

    async def renew(
        self, opener: SessionOpener, old: OpenSession | None, deadline: float | None
    ) -> OpenSession:
        """A session other than `old` (expired, unknown or aging), opened unless another
        caller opened one meanwhile."""
        return await self._take(opener, old, deadline, replace=True)

    async def _take(
        self,
        opener: SessionOpener,
        old: OpenSession | None,
        deadline: float | None,
        replace: bool,
    ) -> OpenSession:
        """In turn behind every caller before (the lock is fair): the session `old` if it is
        still current and need not be replaced, else a new one."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        self._renewing += 1
        try:
            async with self._lock:
                if self._current is not old and self._current is not None:
                    return self._current  # another append renewed it meanwhile
                if not replace and old is not None:
                    return old
                return await self._open(opener, deadline)
        finally:
            self._renewing -= 1

    async def _open(self, opener: SessionOpener, deadline: float | None) -> OpenSession:
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            attempt += 1
            try:
                grant = await opener.open_session()
                break
            except OutcomeUnknown:
                # A SESSION entry nobody uses is harmless: open another.
                if deadline is not None and loop.time() >= deadline:
                    raise
                await asyncio.sleep(min(0.05 * attempt, 0.5))
        self._current = OpenSession(*grant)
        return self._current


class ExactlyOnce:
    """The client's exactly-once appends: its session, and each append re-sent in it while
    its outcome is unknown. `on_unknown_outcome` counts each try whose outcome was unknown
    (the client's `retried_appends`)."""

    def __init__(
        self, opener: SessionOpener, send: SendOnce, on_unknown_outcome: Callable[[], None]
    ) -> None:
        self.session = Session()
        self._opener = opener
        self._send = send
        self._on_unknown_outcome = on_unknown_outcome

    async def append(
        self,
        values: Payload,
        fields: pb.AppendRequest,
        deadline: float | None,
        renew: bool = True,
    ) -> Sequence[int]:
        """Append in the client's session; re-send (same session and sequence) while the
        outcome is unknown or no leader answers, until `deadline` (event-loop time)."""
        loop = asyncio.get_running_loop()
        session = await self.session.current(self._opener, deadline, renew)
        sequence = session.take_sequence()
        tries = Tries()
        try:
            while True:
                fields.session = session.id
                fields.session_secret = session.secret
                fields.sequence = sequence
                fields.acked_below = session.acked_below()
                budget = None if deadline is None else max(deadline - loop.time(), 0.001)
                try:
                    positions = await self._send(values, fields, budget)
                except RlogError as error:
                    passed = deadline is not None and loop.time() >= deadline
                    turn = next_turn(TryFailed(error, tries, passed, budget))
                    tries = turn.tries
                    if turn.unknown_outcome:
                        self._on_unknown_outcome()
                    if turn.next is Next.GIVE_UP:
                        if turn.error is None or turn.error is error:
                            raise
                        raise turn.error from None
                    if turn.next is Next.RENEW:
                        session.pending.discard(sequence)
                        session = await self.session.renew(self._opener, session, deadline)
                        sequence = session.take_sequence()
                    else:
                        await asyncio.sleep(turn.delay)
                    continue
                session.answered(positions)
                return positions
        finally:
            session.pending.discard(sequence)


__all__ = ["ExactlyOnce", "OpenSession", "SendOnce", "Session", "SessionGrant", "SessionOpener"]
