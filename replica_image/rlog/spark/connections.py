"""The clients of one process (the driver or a Python worker), opened lazily.

Readers, writers and partitions are pickled and shipped to the workers, so they hold
addresses, never connections: each process opens one `rlog.client.Client` per endpoint list
on first use and keeps it (Spark reuses its Python workers, so later tasks skip the connect).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from rlog.client import DEFAULT_TIMEOUT, Client

# The driver's status calls while planning: a replica that does not answer within this is
# planned around as unreachable rather than holding up the query.
PLANNING_TIMEOUT = 5.0

_lock = threading.Lock()
_clients: dict[tuple[tuple[str, ...], bool, float], Client] = {}


def client_of(
    endpoints: Sequence[str], *, stream: bool = False, timeout: float = DEFAULT_TIMEOUT
) -> Client:
    """This process's client of `endpoints`. `stream`: its appends travel in the order they
    are submitted on one AppendStream (several in flight); `timeout`: of its status calls."""
    key = (tuple(endpoints), stream, timeout)
    with _lock:
        found = _clients.get(key)
        if found is None:
            found = _clients[key] = Client(list(key[0]), stream=stream, timeout=timeout)
        return found


def known_endpoints() -> set[str]:
    """Every address this process's clients may contact (they connect on first use)."""
    with _lock:
        return {address for c in _clients.values() for address in c.endpoints}


def close_all() -> None:
    """Close every client of this process; later calls open new ones."""
    with _lock:
        clients = list(_clients.values())
        _clients.clear()
    for each in clients:
        each.close()
