"""The clients of one process (the driver or a Python worker), opened lazily.

Readers, writers and partitions are pickled and shipped to the workers, so they hold
addresses, never connections: each process opens one `rlog.client.Client` per endpoint list
on first use and keeps it (Spark reuses its Python workers, so later tasks skip the connect).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from rlog.client import DEFAULT_TIMEOUT, Client, Credentials

# The driver's status calls while planning: a replica that does not answer within this is
# planned around as unreachable rather than holding up the query.
PLANNING_TIMEOUT = 5.0

_lock = threading.Lock()
_clients: dict[tuple[tuple[str, ...], bool, float, Credentials | None], Client] = {}
# The credentials of this process's clients: set from a reader's or writer's options on the
# driver and again in each task (the options travel with the pickled reader or writer; the
# connections do not). None: the RLOG_* variables, else plaintext.
_credentials: list[Credentials | None] = [None]


def use_credentials(credentials: Credentials | None) -> None:
    """Connect with `credentials` from now on (None: the environment's, if any)."""
    with _lock:
        _credentials[0] = credentials


def client_of(
    endpoints: Sequence[str], *, stream: bool = False, timeout: float = DEFAULT_TIMEOUT
) -> Client:
    """This process's client of `endpoints`. `stream`: its appends travel in the order they
    are submitted on one AppendStream (several in flight); `timeout`: of its status calls."""
    with _lock:
        credentials = _credentials[0] or Credentials.from_env()
        key = (tuple(endpoints), stream, timeout, credentials)
        found = _clients.get(key)
        if found is None:
            found = _clients[key] = Client(
                list(key[0]), stream=stream, timeout=timeout, credentials=credentials
            )
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
