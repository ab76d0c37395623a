#!/usr/bin/env python3
"""What one raw stale Read stream costs the replica that serves it: loads N entries of 100 B
into a real 3-replica log (`rlog replica` processes, default engine; append calls of 16384
values, so stored as runs of 16384), then reads them all from a follower `--rounds` times
(the client's `read_columns`, no Spark) and prints the entries/s and the follower's CPU time
per entry (from /proc). `--profile FILE` records py-spy raw stacks of the follower meanwhile
(`bench/pyspy_top.py FILE --rate 200 --entries N*rounds` summarizes them).

    PYTHONPATH=replica_image .venv/bin/python bench/read_serving.py --entries 300000 \
        [--rounds 4] [--profile read.txt]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=300_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--profile", default=None, help="py-spy raw output file")
    args = parser.parse_args()

    from rlog.client import Client
    from rlog.packed import run_count
    from rlog.spark import observe, wait_learned
    from rlog.tools.dev import DevCluster

    work = Path(tempfile.mkdtemp(prefix="rlog-read-serving-"))
    try:
        with DevCluster(3, work / "log", election_timeout=3.0) as log:
            log.wait_for_leader()
            value = bytes(range(100))
            last = 0
            with Client(log.endpoint) as client:
                for start in range(0, args.entries, 16384):
                    last = client.append([value] * min(16384, args.entries - start))[-1]
            wait_learned(log.endpoints, last)
            view = observe(log.endpoints)
            follower = next(e for e, _ in view.replicas if e != view.leader)
            pid = log.pid(log.endpoints.index(follower))
            assert pid is not None
            spy = None
            if args.profile:
                py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
                cmd = [py_spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw"]
                cmd += ["--nonblocking", "-o", args.profile]
                spy = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                time.sleep(1)
            with Client(follower) as reader:
                for _ in range(args.rounds):
                    load = os.getloadavg()[0]
                    cpu = cpu_seconds(pid)
                    t = time.perf_counter()
                    columns = reader.read_columns(view.begin, view.learned, True)
                    got = sum(run_count(run) for runs in columns for run in runs)
                    seconds = time.perf_counter() - t
                    used = cpu_seconds(pid) - cpu
                    print(
                        f"read {got} entries in {seconds:.2f} s = {got / seconds:,.0f}/s; "
                        f"serving replica CPU {used:.2f} s = {used / got * 1e6:.2f} us/entry "
                        f"(load {load:.1f})",
                        flush=True,
                    )
            if spy is not None:
                spy.send_signal(signal.SIGINT)
                spy.wait()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
