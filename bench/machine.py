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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (every thread), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # fields 14, 15


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (pages the kernel mapped in without I/O: fresh
    heap or mmap pages it had to zero), from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return int(fields[7])  # field 10, minflt


def replica_minor_faults(cluster: Replicas) -> int:
    """Minor page faults of the replica processes so far."""
    pids = (cluster.pid(i) for i in range(cluster.replicas))
    return sum(minor_faults(pid) for pid in pids if pid is not None)


def replica_cpu_seconds(cluster: Replicas) -> float:
    """User + system CPU time of the replica processes so far (every thread), from /proc."""
    pids = (cluster.pid(i) for i in range(cluster.replicas))
    return sum(cpu_seconds(pid) for pid in pids if pid is not None)
