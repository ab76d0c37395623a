"""CPU per entry of each replica of a local 3-replica log, trees compared interleaved.

For each round and each tree (a repository root; rounds rotate the order), start `rlog dev`
with PYTHONPATH=<tree>/replica_image, run each workload once untimed (warm-up) and once
measured with `rlog bench` (the first tree's client for every tree, so only the replicas
differ), and read utime+stime of every replica process from /proc/PID/stat before and after
the measured run. Prints one JSON line per measurement and a median summary per tree:

    python bench/cpu_per_entry.py --rounds 3 /work/main /path/to/other/tree
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time

TICK = os.sysconf("SC_CLK_TCK")
WORKLOADS = {
    "batched 8 writers x 64 x 1 KiB": ["--concurrency", "8", "--batch", "64", "--count", "64000"],
    "64 writers x 1 x 1 KiB": ["--concurrency", "64", "--batch", "1", "--count", "12000"],
}


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


class Cluster:
    def __init__(self, tree: str, port: int, python: str) -> None:
        env = dict(os.environ, PYTHONPATH=f"{tree}/replica_image")
        self.dir = tempfile.mkdtemp(prefix="cpu-per-entry-")
        self.process = subprocess.Popen(
            [python, "-m", "rlog.tools.cli", "dev", "--base-port", str(port), "--dir", self.dir],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.leader = -1
        self.endpoint = ""
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if match := re.match(r"leader: replica (\d+)", line):
                self.leader = int(match.group(1))
            if match := re.search(r"--endpoint (\S+)", line):
                self.endpoint = match.group(1)
                break
        if not self.endpoint:
            raise RuntimeError(f"rlog dev from {tree} did not start")
        time.sleep(1)
        self.pids: dict[int, int] = {}
        pid = self.process.pid
        with open(f"/proc/{pid}/task/{pid}/children") as children:
            for child in children.read().split():
                with open(f"/proc/{child}/cmdline") as cmdline:
                    argv = cmdline.read().split("\0")
                self.pids[int(argv[argv.index("--id") + 1])] = int(child)

    def stop(self) -> None:
        os.killpg(self.process.pid, signal.SIGTERM)
        self.process.wait(60)
        subprocess.run(["rm", "-rf", self.dir], check=False)


def bench(python: str, client_tree: str, endpoint: str, args: list[str]) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=f"{client_tree}/replica_image")
    command = [python, "-m", "rlog.tools.cli", "bench", "--endpoint", endpoint, "--json"]
    command += ["--mode", "concurrent", "--size", "1024", *args]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    result: dict[str, float] = json.loads(out)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trees", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--base-port", type=int, default=27100)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    trees: list[str] = args.trees
    rows: list[dict[str, object]] = []
    for round_ in range(args.rounds):
        shift = round_ % len(trees)
        for tree in trees[shift:] + trees[:shift]:
            port = args.base_port + 10 * trees.index(tree)
            cluster = Cluster(tree, port, args.python)
            try:
                for name, workload in WORKLOADS.items():
                    entries = int(workload[workload.index("--count") + 1])
                    warm = list(workload)
                    warm[warm.index("--count") + 1] = str(entries // 8)
                    bench(args.python, trees[0], cluster.endpoint, warm)
                    before = {i: cpu_ticks(pid) for i, pid in cluster.pids.items()}
                    result = bench(args.python, trees[0], cluster.endpoint, workload)
                    after = {i: cpu_ticks(pid) for i, pid in cluster.pids.items()}
                    per = {i: (after[i] - before[i]) / TICK / entries * 1e6 for i in before}
                    followers = [v for i, v in per.items() if i != cluster.leader]
                    row = {
                        "tree": tree,
                        "round": round_,
                        "workload": name,
                        "leader_us": round(per[cluster.leader], 1),
                        "follower_us": round(statistics.mean(followers), 1),
                        "entries_per_s": result.get("entries_per_s"),
                        "load1": round(os.getloadavg()[0], 1),
                    }
                    print(json.dumps(row), flush=True)
                    rows.append(row)
            finally:
                cluster.stop()
    print("median over rounds (µs of CPU per entry):")
    for name in WORKLOADS:
        for tree in trees:
            mine = [r for r in rows if r["tree"] == tree and r["workload"] == name]
            leader = statistics.median(float(str(r["leader_us"])) for r in mine)
            follower = statistics.median(float(str(r["follower_us"])) for r in mine)
            print(f"  {name:32} {tree:40} leader {leader:7.1f}  follower {follower:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
