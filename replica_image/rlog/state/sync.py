"""`State`: the blocking API of `AsyncState`, run on a private event-loop thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from rlog import event_loop
from rlog.client import AsyncClient, Credentials
from rlog.client.errors import RlogError
from rlog.state.image import Update, Variable
from rlog.state.store import AsyncState

T = TypeVar("T")


class State:
    """Named, versioned variables in a log (see `AsyncState`). `endpoints`: "H:P,H:P,...";
    the keyword arguments are `AsyncState`'s and `AsyncClient`'s (`timeout`,
    `append_timeout`). Recovers the state on construction. Safe to share between threads:
    concurrent stores from several threads are batched together."""

    def __init__(
        self,
        endpoints: str,
        *,
        timeout: float | None = 30.0,
        append_timeout: float | None = 60.0,
        credentials: Credentials | None = None,
        **options: Any,
    ) -> None:
        self._loop = event_loop.new_event_loop()  # uvloop if installed (rlog.event_loop)
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="rlog-state", daemon=True
        )
        self._thread.start()
        self._closed = False

        async def make() -> AsyncState:
            client = AsyncClient(
                endpoints,
                timeout=timeout,
                append_timeout=append_timeout,
                credentials=credentials,
            )
            state = AsyncState(client, **options)
            state._own_client = True
            return state

        self._async = self._run(make())
        try:
            self._run(self._async.recover())
        except BaseException:
            self.close()
            raise

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise RlogError("the state is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @property
    def asynchronous(self) -> AsyncState:
        return self._async

    @property
    def initialized(self) -> bool:
        return self._async.initialized

    def fetch(self, name: str) -> Variable:
        return self._run(self._async.fetch(name))

    def store(self, variable: Variable) -> Variable | None:
        return self._run(self._async.store(variable))

    def update(self, name: str, function: Update) -> Variable:
        return self._run(self._async.update(name, function))

    def expunge(self, variable: Variable) -> bool:
        return self._run(self._async.expunge(variable))

    def names(self) -> list[str]:
        return self._run(self._async.names())

    def variables(self) -> dict[str, Variable]:
        return self._run(self._async.variables())

    def compact(self) -> int:
        return self._run(self._async.compact())

    def watch(self, name: str) -> Iterator[Variable]:
        """The variable now, then each new version (blocks between versions)."""
        updates = self._async.watch(name)
        try:
            while True:
                try:
                    yield self._run(updates.__anext__())
                except StopAsyncIteration:
                    return
        finally:
            if not self._closed:
                with contextlib.suppress(RlogError):
                    self._run(updates.aclose())

    def close(self) -> None:
        if self._closed:
            return
        with contextlib.suppress(Exception):
            self._run(self._async.close())
        self._closed = True
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        self._loop.close()

    def __enter__(self) -> State:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
