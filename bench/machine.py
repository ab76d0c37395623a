"""What the benchmarks read off the machine around a measurement: the load average (to
report it beside every number on this shared VM) and the CPU time the replicas used (steadier
than rates when the load moves)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol


class Replicas(Protocol):
    """A running log's processes (rlog.tools.dev.DevCluster)."""

    replicas: int

    def pid(self, i: int) -> int | None: ...


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def replica_cpu_seconds(cluster: Replicas) -> float:
    """User + system CPU time of the replica processes so far (every thread), from /proc."""
    total = 0
    for i in range(cluster.replicas):
        pid = cluster.pid(i)
        if pid is not None:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14, 15)
    return total / os.sysconf("SC_CLK_TCK")
