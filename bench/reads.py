"""Read (and append) cost of a replica build, A/B: `bench/reads.py --root A --root B`.

Each pair starts a fresh 3-replica `DevCluster` (default engine, data on the real disk) running the
replica code of each `--root` (a checkout: its `replica_image` goes first on PYTHONPATH),
alternating which goes first, and runs `rlog bench` of THIS checkout against it (the same
client on both sides; only the replicas differ). Modes (`--modes`, comma-separated):

- read-serial: 1000 linearizable reads of 10 entries, one at a time, through the leader;
- read-serial-follower: the same through a follower (forwarded to the leader);
- read-16: 16 concurrent readers through the leader for --seconds;
- read-stale: 1000 stale reads of the leader, one at a time;
- append-serial: 1000 appends of 1 KiB, one at a time, to the leader;
- append-64: 64 concurrent writers, one unary append each, for --seconds.

One JSON object per line on stdout: {"pair", "root", "load", "mode", "result", "cpu_ms"}
(`cpu_ms`: CPU time the three replica processes used per operation, user + system, from
/proc: less sensitive to other load on the machine than the rate); a summary (the median of
each mode and root) goes to stderr. `--env K=V` sets a replica variable for
a root given as `ROOT::K=V` (e.g. the test-only RLOG_UNSAFE_NO_READ_INDEX=1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from machine import replica_cpu_seconds  # noqa: E402

from rlog.tools.dev import DevCluster  # noqa: E402

MODES: dict[str, tuple[str, list[str]]] = {
    # mode: (which endpoint, rlog bench arguments)
    "read-serial": ("leader", ["--read", "10", "--count", "1000", "--warmup", "20"]),
    "read-serial-follower": ("follower", ["--read", "10", "--count", "1000", "--warmup", "20"]),
    "read-16": ("leader", ["--read", "10", "--mode", "concurrent", "--concurrency", "16"]),
    "read-stale": ("leader", ["--read", "10", "--stale", "--count", "1000", "--warmup", "20"]),
    "append-serial": ("leader", ["--count", "1000", "--warmup", "20"]),
    "append-64": ("leader", ["--mode", "concurrent", "--concurrency", "64"]),
}


def run_root(root: str, modes: list[str], seconds: float, work: Path) -> dict[str, Any]:
    path, _, assignment = root.partition("::")
    env = dict(os.environ)
    env["PYTHONPATH"] = f"{Path(path).resolve() / 'replica_image'}"
    if assignment:
        key, _, value = assignment.partition("=")
        env[key] = value
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(dir=work) as tmp, DevCluster(3, tmp, env=env) as cluster:
        leader = cluster.wait_for_leader()
        follower = next(i for i in range(3) if i != leader)
        client_env = dict(os.environ, PYTHONPATH=str(HERE / "replica_image"))
        for mode in modes:
            target, args = MODES[mode]
            endpoint = cluster.endpoints[leader if target == "leader" else follower]
            if "concurrent" in args:
                args = [*args, "--duration", str(seconds)]
            command = [sys.executable, "-m", "rlog.tools.cli", "bench", "-e", endpoint]
            cpu_before = replica_cpu_seconds(cluster)
            out = subprocess.run(
                [*command, "--json", "--size", "1024", *args],
                env=client_env,
                capture_output=True,
                check=True,
            )
            result = json.loads(out.stdout)
            warmup = int(args[args.index("--warmup") + 1]) if "--warmup" in args else 0
            operations = result["appends"] + warmup + (1 if "--read" in args else 0)
            cpu = replica_cpu_seconds(cluster) - cpu_before
            results[mode] = (result, round(cpu * 1000 / max(1, operations), 3))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", action="append", required=True, help="checkout[::K=V]")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "rlog-bench"))
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        parser.error(f"unknown modes {unknown}; known: {', '.join(MODES)}")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    collected: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    for pair in range(args.pairs):
        order = args.root if pair % 2 == 0 else list(reversed(args.root))
        for root in order:
            load = os.getloadavg()[0]
            for mode, (result, cpu_ms) in run_root(root, modes, args.seconds, work).items():
                record = {"pair": pair, "root": root, "load": load, "mode": mode}
                print(json.dumps({**record, "result": result, "cpu_ms": cpu_ms}), flush=True)
                collected.setdefault((mode, root), []).append(result["appends_per_s"])
                cpu.setdefault((mode, root), []).append(cpu_ms)
    for mode in modes:
        line = [f"{mode:22}"]
        for root in args.root:
            values = collected.get((mode, root), [])
            per_op = cpu.get((mode, root), [])
            line.append(
                f"{root}: median {statistics.median(values):8.1f}/s "
                f"{statistics.median(per_op):6.3f} cpu-ms/op {values}"
            )
        print("  ".join(line), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
