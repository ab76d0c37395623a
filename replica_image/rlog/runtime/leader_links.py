"""The write connections a leader holds open to this replica, counted per leader: its gRPC
WriteStream and its write lane, each counted from its first write until it closes. When the
last one of the leader this replica follows closes, the election hears that the leader is
gone (`Election.leader_gone`, protocol/election.py): a killed leader's kernel closes its
sockets at once, so the followers need not wait out an election timeout of silence.

A sign, not a verdict: the election still needs a heartbeat-free wait longer than the
heartbeat interval, and a pre-vote in which the other followers saw the leader go too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable


class LeaderLinks:
    """`opened(leader)` when a connection carries its first write from `leader`,
    `closed(leader)` when it ends; `gone(leader)` is called when a leader's count returns
    to zero."""

    def __init__(self, gone: Callable[[int], None]) -> None:
        self._gone = gone
        self._open: Counter[int] = Counter()

    def opened(self, leader: int) -> None:
        self._open[leader] += 1

    def closed(self, leader: int) -> None:
        self._open[leader] -= 1
        if self._open[leader] <= 0:
            del self._open[leader]
            self._gone(leader)

    def open(self, leader: int) -> int:
        """How many of `leader`'s write connections are open now."""
        return self._open[leader]

    def link(self) -> Link:
        """A new connection's link: counted once its first write names the leader."""
        return Link(self)


class Link:
    """One write connection: counted for its leader from its first write until `close`."""

    def __init__(self, links: LeaderLinks) -> None:
        self._links = links
        self.leader: int | None = None

    def saw(self, leader: int) -> None:
        if self.leader is None:
            self.leader = leader
            self._links.opened(leader)

    def close(self) -> None:
        if self.leader is not None:
            self._links.closed(self.leader)
            self.leader = None
