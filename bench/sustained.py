"""Batched appends held for a while, second by second: a fresh 3-replica log (write lanes on),
`rlog bench` with 8 writers x 64 values per call on the client's append lane for `--seconds`,
and for each second the entries acknowledged, the replicas' user and system CPU, the host's
idle share and the disk's write rate. A kit run is 8 seconds; this shows what changes within
and after them (docs/storage-engines.md, "The page cache behind the writes").

    .venv/bin/python bench/sustained.py [--size 4096] [--seconds 16]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rlog.tools.dev import DevCluster

TICK = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def host_cpu() -> tuple[int, int]:
    """(all, idle + iowait) jiffies of the host so far."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(values), values[3] + values[4]


def disk_written() -> int:
    """Bytes written to the whole disks so far (partitions left out)."""
    total = 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        parts = line.split()
        if parts[2].startswith(("vd", "sd", "nvme")) and not parts[2][-1].isdigit():
            total += int(parts[9]) * 512
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--seconds", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlog-sustained-") as tmp:
        work = Path(tmp)
        with DevCluster(3, work / "log", write_lane_offset=1) as cluster:
            leader = cluster.wait_for_leader()
            pids = [cluster.pid(i) for i in range(3)]
            assert all(pid is not None for pid in pids)
            trace = work / "trace.txt"
            command = [sys.executable, "-m", "rlog.tools.cli", "bench", "--json", "--lane"]
            command += ["--endpoint", cluster.endpoints[leader], "--mode", "concurrent"]
            command += ["--concurrency", "8", "--batch", "64", "--size", str(args.size)]
            command += ["--duration", str(args.seconds), "--warmup", "20"]
            command += ["--trace", str(trace)]
            bench = subprocess.Popen(command, stdout=subprocess.PIPE)
            seconds: list[dict[str, object]] = []
            before = ([process_cpu(p) for p in pids if p], host_cpu(), disk_written())
            began = time.monotonic()
            while bench.poll() is None:
                time.sleep(1)
                now = ([process_cpu(p) for p in pids if p], host_cpu(), disk_written())
                elapsed = time.monotonic() - began
                began += elapsed
                replicas = list(zip(now[0], before[0], strict=True))
                jiffies = now[1][0] - before[1][0]
                seconds.append(
                    {
                        "user": [round((n[0] - b[0]) / elapsed, 2) for n, b in replicas],
                        "system": [round((n[1] - b[1]) / elapsed, 2) for n, b in replicas],
                        "idle": round((now[1][1] - before[1][1]) / max(jiffies, 1), 2),
                        "disk_mb_per_s": round((now[2] - before[2]) / elapsed / 1e6),
                    }
                )
                before = now
            result = json.loads(bench.communicate()[0])
        stamps = [float(line.split()[0]) for line in trace.read_text().splitlines() if line]
        first = min(stamps)
        per_second = collections.Counter(int(t - first) for t in stamps)
    rates = [per_second[s] * 64 for s in range(max(per_second) + 1)]
    print("entries/s, second by second:", rates)
    for i, second in enumerate(seconds):
        print(f"  second {i}: {json.dumps(second)}")
    print(json.dumps({"size": args.size, "seconds": args.seconds, "result": result}))


if __name__ == "__main__":
    main()
