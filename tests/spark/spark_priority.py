"""Spark's JVMs, and the Python workers they start, run at a higher CPU priority than the rest
of the suite where the user may grant it (root; elsewhere they run as they are).

Why: Spark gives the Python worker of a data source's planner (and of a streaming source)
a fixed 10 s to connect back to its JVM, not configurable (SPARK-45245). That start takes
0.7 s alone, but in `make test` the Spark tests run about ten times slower than alone,
beside the unit suite's other workers and the e2e suites on 2 cores, and a worker that
missed those 10 s failed a query (docs/testing.md). The priority only changes who waits
for the CPU: every test still checks everything it checked."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

# A nice value of -5 weighs about three times a default process in Linux's scheduler.
NICE = -5


def favour() -> None:
    """Raise the calling thread's priority (a fork inherits it): a `preexec_fn`."""
    try:
        os.setpriority(os.PRIO_PROCESS, 0, NICE)
    except PermissionError:
        pass  # not root: the default priority


@contextmanager
def favoured() -> Iterator[None]:
    """The calling thread at the higher priority, for a JVM started inside the block; back
    to its own after (raising a nice value needs no privilege)."""
    before = os.getpriority(os.PRIO_PROCESS, 0)
    favour()
    try:
        yield
    finally:
        os.setpriority(os.PRIO_PROCESS, 0, before)
