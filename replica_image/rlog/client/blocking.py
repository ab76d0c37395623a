"""`Client`: the blocking client, with the API of `AsyncClient`, which it runs on a private
event-loop thread.

    with Client("10.0.0.1:7000,10.0.0.2:7000,10.0.0.3:7000") as log:
        first, second = log.append([b"a", "b"])
        for entry in log.read(from_=first):
            print(entry.position, entry.value)
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import AsyncGenerator, Coroutine, Generator, Iterable, Iterator, Sequence
from typing import Any, TypeVar

from rlog import event_loop
from rlog.client.async_client import (
    DEFAULT_APPEND_TIMEOUT,
    DEFAULT_CONNECT_WAIT,
    DEFAULT_START_TIMEOUT,
    DEFAULT_TIMEOUT,
    AsyncClient,
)
from rlog.client.errors import RlogError
from rlog.client.security import Credentials
from rlog.client.sessions import SessionGrant
from rlog.client.values import Entry, Value
from rlog.proto import rlog_pb2 as pb

T = TypeVar("T")


async def _next(batches: AsyncGenerator[T, None]) -> T:
    return await batches.__anext__()


class Client:
    """A blocking client with the API of `AsyncClient`; it runs one on a private event-loop
    thread. Safe to share between threads."""

    def __init__(
        self,
        endpoints: str | Iterable[str],
        *,
        timeout: float | None = DEFAULT_TIMEOUT,
        append_timeout: float | None = DEFAULT_APPEND_TIMEOUT,
        read_timeout: float | None = None,
        channel_options: Iterable[tuple[str, Any]] = (),
        stream: bool = False,
        exactly_once: bool = True,
        credentials: Credentials | None = None,
        connect_wait: float = DEFAULT_CONNECT_WAIT,
        lane: bool | None = None,
        start_timeout: float | None = DEFAULT_START_TIMEOUT,
    ) -> None:
        self._async = AsyncClient(
            endpoints,
            timeout=timeout,
            append_timeout=append_timeout,
            read_timeout=read_timeout,
            channel_options=channel_options,
            stream=stream,
            exactly_once=exactly_once,
            credentials=credentials,
            connect_wait=connect_wait,
            lane=lane,
            start_timeout=start_timeout,
        )
        self._loop = event_loop.new_event_loop()  # uvloop if installed (rlog.event_loop)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rlog-client", daemon=True
        )
        self._thread.start()
        self._closed = False

    @property
    def endpoints(self) -> list[str]:
        return self._async.endpoints

    @property
    def current_endpoint(self) -> str:
        return self._async.current_endpoint

    @property
    def last_appended(self) -> int:
        """The highest position an append through this client was given (0: none yet):
        `read(stale=True, min_position=client.last_appended)` reads this client's writes."""
        return self._async.last_appended

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RlogError("the client is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _iterate(self, batches: AsyncGenerator[list[Entry], None]) -> Iterator[Entry]:
        with contextlib.closing(self._batches(batches)) as items:
            for batch in items:
                yield from batch

    def _batches(self, batches: AsyncGenerator[T, None]) -> Generator[T, None, None]:
        """The items of an async generator of the client's loop, one loop round trip each."""
        try:
            while True:
                try:
                    yield self._run(_next(batches))
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                self._run(batches.aclose())

    def append(
        self, values: Iterable[Value] | Value, *, if_next: int | None = None, epoch: int = 0
    ) -> list[int]:
        return self._run(self._async.append(values, if_next=if_next, epoch=epoch))

    def take_epoch(self) -> int:
        return self._run(self._async.take_epoch())

    def open_session(self) -> SessionGrant:
        return self._run(self._async.open_session())

    def submit_append(
        self, values: Iterable[Value] | Value
    ) -> concurrent.futures.Future[list[int]]:
        """Start an append and return at once: a future of `append`'s result (its positions,
        or its error). Appends submitted one after another are handed to the client in that
        order; with `stream=True` they travel in that order on one `AppendStream`, so several
        can be in flight at once (a leader assigns their positions in the order it receives
        them; a follower forwards each on its own, in no guaranteed order)."""
        if self._closed:
            raise RlogError("the client is closed")
        return asyncio.run_coroutine_threadsafe(self._async.append(values), self._loop)

    def append_packed(
        self, data: bytes, offsets: bytes, *, if_next: int | None = None, epoch: int = 0
    ) -> Sequence[int]:
        return self._run(self._async.append_packed(data, offsets, if_next=if_next, epoch=epoch))

    def submit_append_packed(
        self, data: bytes, offsets: bytes
    ) -> concurrent.futures.Future[Sequence[int]]:
        """`submit_append` for values already packed (see `AsyncClient.append_packed`)."""
        if self._closed:
            raise RlogError("the client is closed")
        return asyncio.run_coroutine_threadsafe(
            self._async.append_packed(data, offsets), self._loop
        )

    def append_one(self, value: Value) -> int:
        return self._run(self._async.append_one(value))

    def truncate(self, to: int) -> int:
        return self._run(self._async.truncate(to))

    def status(self, endpoint: str | None = None) -> pb.StatusResponse:
        return self._run(self._async.status(endpoint))

    def statuses(self) -> dict[str, pb.StatusResponse | RlogError]:
        return self._run(self._async.statuses())

    def read(
        self,
        from_: int | None = None,
        to: int | None = None,
        stale: bool = False,
        max_batch: int = 0,
        endpoint: str | None = None,
        *,
        min_position: int | None = None,
    ) -> Iterator[Entry]:
        return self._iterate(
            self._async.read_batches(
                from_, to, stale, max_batch, endpoint, min_position=min_position
            )
        )

    def read_batches(
        self,
        from_: int | None = None,
        to: int | None = None,
        stale: bool = False,
        max_batch: int = 0,
        endpoint: str | None = None,
        *,
        min_position: int | None = None,
    ) -> Iterator[list[Entry]]:
        return self._batches(
            self._async.read_batches(
                from_, to, stale, max_batch, endpoint, min_position=min_position
            )
        )

    def read_columns(
        self,
        from_: int | None = None,
        to: int | None = None,
        stale: bool = False,
        max_batch: int = 0,
        endpoint: str | None = None,
        *,
        min_position: int | None = None,
    ) -> Iterator[list[pb.Run]]:
        return self._batches(
            self._async.read_columns(
                from_, to, stale, max_batch, endpoint, min_position=min_position
            )
        )

    def tail(self, from_: int = 0, stale: bool = False) -> Iterator[Entry]:
        return self._iterate(self._async.tail_batches(from_, stale))

    def grant_permit(self, log_id: str = "", endpoint: str | None = None) -> pb.StatusResponse:
        return self._run(self._async.grant_permit(log_id, endpoint))

    def revoke_permit(self, log_id: str = "", endpoint: str | None = None) -> pb.StatusResponse:
        return self._run(self._async.revoke_permit(log_id, endpoint))

    def step_down(self, endpoint: str | None = None) -> pb.StatusResponse:
        return self._run(self._async.step_down(endpoint))

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._run(self._async.close())
        finally:
            self._closed = True
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            if not self._thread.is_alive():
                self._loop.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True) and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._loop.stop)


__all__ = ["Client"]
