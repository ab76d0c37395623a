"""The nemesis: real faults on a seeded schedule, each healed before the next.

Kinds (`--nemesis` takes a comma-separated list; each fault picks one at random):

- `pause-leader`, `pause-random`: SIGSTOP the replica's process group, SIGCONT after the
  hold (peers see a hung replica that keeps its sockets);
- `kill-leader`, `kill-random`: SIGKILL, restarted (same data dir and address) after the
  hold;
- `partition-leader`: the leader cut off from every other replica; `partition-random`: a
  random minority cut off from the majority (needs network namespaces, see network.py).
  Clients still reach every replica.
"""

from __future__ import annotations

import json
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jepsen.history import History, now
from jepsen.network import Netns
from rlog.tools.dev import DevCluster

KINDS = (
    "pause-leader",
    "pause-random",
    "kill-leader",
    "kill-random",
    "partition-leader",
    "partition-random",
)
PARTITIONS = {k for k in KINDS if k.startswith("partition")}


@dataclass
class Fault:
    kind: str
    targets: list[int]
    start: int
    end: int = 0
    leader_known: bool = True

    def to_json(self, origin: int) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "targets": self.targets,
            "start_s": round((self.start - origin) / 1e9, 3),
            "end_s": round((self.end - origin) / 1e9, 3) if self.end else None,
            "leader_known": self.leader_known,
        }


@dataclass
class Nemesis:
    cluster: DevCluster
    kinds: list[str]
    rng: random.Random
    history: History
    network: Netns | None = None
    interval: tuple[float, float] = (1.0, 3.0)  # healthy time before a fault
    hold: tuple[float, float] = (3.0, 6.0)  # how long a fault lasts (elections take ~2 s)
    faults: list[Fault] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _paused: set[int] = field(default_factory=set)
    _killed: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown nemesis {sorted(unknown)}; choose from {', '.join(KINDS)}")
        if PARTITIONS & set(self.kinds) and self.network is None:
            raise ValueError("partitions need network namespaces (root and `ip netns`)")

    def _leader(self) -> int | None:
        return self.cluster.leader(timeout=1.0)

    def _target(self, kind: str) -> tuple[list[int], bool]:
        n = self.cluster.replicas
        if kind.endswith("leader"):
            leader = self._leader()
            if leader is not None:
                return [leader], True
            return [self.rng.randrange(n)], False
        if kind == "partition-random":
            return sorted(self.rng.sample(range(n), (n - 1) // 2)), True
        return [self.rng.randrange(n)], True

    def inject(self, kind: str) -> Fault:
        targets, leader_known = self._target(kind)
        fault = Fault(kind, targets, now(), leader_known=leader_known)
        if kind.startswith("pause"):
            for i in targets:
                self.cluster.pause(i)
                self._paused.add(i)
        elif kind.startswith("kill"):
            for i in targets:
                self.cluster.kill(i)
                self._killed.add(i)
        else:
            assert self.network is not None
            rest = [i for i in range(self.cluster.replicas) if i not in targets]
            self.network.partition([targets, rest])
        self.faults.append(fault)
        return fault

    def heal(self) -> None:
        """Undo every fault in force: resume, restart, remove every partition."""
        for i in sorted(self._paused):
            self.cluster.resume(i)
        self._paused.clear()
        for i in sorted(self._killed):
            self.cluster.start_replica(i)
        self._killed.clear()
        if self.network is not None:
            self.network.heal()
        for fault in self.faults:
            if not fault.end:
                fault.end = now()

    def run(self, until: float) -> None:
        """Inject and heal faults until the monotonic time `until` (seconds) or `stop()`.
        Run it in a thread that outlives the cluster: replicas it restarts are tied to it."""
        try:
            while not self._stop.wait(self.rng.uniform(*self.interval)):
                hold = self.rng.uniform(*self.hold)
                if time.monotonic() + hold > until:
                    break
                self.inject(self.rng.choice(self.kinds))
                self._stop.wait(hold)
                self.heal()
        finally:
            self.heal()

    def stop(self) -> None:
        self._stop.set()

    def write(self, path: Path) -> None:
        with open(path, "w") as out:
            for fault in self.faults:
                out.write(json.dumps(fault.to_json(self.history.start)) + "\n")
