"""What the benchmarks read off the machine around a measurement: the load average (to
report it beside every number on this shared VM) and the CPU time the replicas used (steadier
than rates when the load moves)."""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path
from typing import Protocol


class Replicas(Protocol):
    """A running log's processes (rlog.tools.dev.DevCluster)."""

    replicas: int

    def pid(self, i: int) -> int | None: ...


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _stat_fields(pid: int) -> list[str]:
    """`/proc/<pid>/stat` after the command name (Linux): field N of proc(5) is [N - 3]."""
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process so far (every thread), from /proc (Linux)."""
    fields = _stat_fields(pid)
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick  # fields 14, 15


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (every thread), from /proc (Linux)."""
    return sum(cpu_split(pid))


def minor_faults(pid: int) -> int:
    """Minor page faults of a process so far (pages the kernel mapped in without I/O: fresh
    heap or mmap pages it had to zero), from /proc (Linux)."""
    return int(_stat_fields(pid)[7])  # field 10, minflt


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident set so far (VmHWM), in MB, from /proc (Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise ValueError(f"no VmHWM for process {pid}")


def replica_minor_faults(cluster: Replicas) -> int:
    """Minor page faults of the replica processes so far."""
    pids = (cluster.pid(i) for i in range(cluster.replicas))
    return sum(minor_faults(pid) for pid in pids if pid is not None)


def replica_cpu_seconds(cluster: Replicas) -> float:
    """User + system CPU time of the replica processes so far (every thread), from /proc."""
    pids = (cluster.pid(i) for i in range(cluster.replicas))
    return sum(cpu_seconds(pid) for pid in pids if pid is not None)


def page_fault_us(mebibytes: int = 256) -> float:
    """What a fresh anonymous page costs to fault in here, in µs per 4 KiB page (the best of
    three rounds of touching `mebibytes` of new memory). On this project's build VM it is
    about 3.5 µs, ten times a bare machine's: fresh pages are a real cost of any copy."""
    size = mebibytes << 20
    best = float("inf")
    for _ in range(3):
        with mmap.mmap(-1, size) as fresh:
            began = time.perf_counter()
            for offset in range(0, size, 4096):
                fresh[offset] = 1
            best = min(best, time.perf_counter() - began)
    return best / (size // 4096) * 1e6
