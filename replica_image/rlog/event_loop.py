"""The event loop rlog's processes run on: uvloop when it is installed, else asyncio's own.

A serial append crosses the event loops of the client, the leader and a follower several
times; each crossing is an epoll wake-up and a few callbacks, which uvloop (libuv, in C)
does in less CPU than asyncio's loop written in Python (docs/performance.md, "What each
change bought"). gRPC's asyncio stack runs on any asyncio loop.

`RLOG_EVENT_LOOP=asyncio` chooses asyncio's loop (to compare, or to rule the loop out);
`uvloop` (the default) falls back to asyncio's when uvloop cannot be imported.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

EVENT_LOOP_ENV = "RLOG_EVENT_LOOP"
EVENT_LOOPS = ("uvloop", "asyncio")

T = TypeVar("T")


def loop_name() -> str:
    """The loop asked for: `RLOG_EVENT_LOOP`, default uvloop (unknown values: asyncio)."""
    name = os.environ.get(EVENT_LOOP_ENV, "uvloop").strip().lower() or "uvloop"
    return name if name in EVENT_LOOPS else "asyncio"


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new event loop of the chosen kind."""
    if loop_name() == "uvloop":
        try:
            import uvloop
        except ImportError:
            return asyncio.new_event_loop
        return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_event_loop() -> asyncio.AbstractEventLoop:
    return loop_factory()()


def run(main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on the chosen event loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
