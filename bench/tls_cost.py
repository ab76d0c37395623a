"""The cost of mutual TLS and roles on appends, A/B: `bench/tls_cost.py [--pairs 3]`.

Each pair starts a fresh 3-replica `DevCluster` (default engine, data on the real disk) in plaintext
and one with `tls=True` (mutual TLS between the replicas and for the client, roles on),
alternating which goes first, and runs `rlog bench` against the leader of each:

- serial: 1000 appends of 1 KiB, one at a time (after 20 untimed): latency p50/p90/p99;
- batched: 8 concurrent writers, each appending 64 values of 1 KiB per call, for --seconds:
  entries per second.

Each run also records the replicas' CPU time per entry (user + system of the three
processes, from /proc), which a loaded machine disturbs less than latency and rates.

The client connects as the dev PKI's "admin" in the TLS runs. One JSON object per line on
stdout ({"pair", "tls", "load", "mode", "result"}); the medians per mode and side go to
stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from machine import load, replica_cpu_seconds  # noqa: E402

from rlog.tools.dev import DevCluster  # noqa: E402

SERIAL = ["--count", "1000", "--warmup", "20", "--size", "1024"]


def batched(seconds: float) -> list[str]:
    return [
        "--mode", "concurrent", "--concurrency", "8", "--batch", "64", "--size", "1024",
        "--duration", str(seconds),
    ]  # fmt: skip


def bench(cluster: DevCluster, endpoint: str, args: list[str], tls: bool) -> dict[str, Any]:
    command = [sys.executable, "-m", "rlog.tools.cli", "bench", "-e", endpoint, "--json", *args]
    if tls:
        pki = cluster.tls_dir
        command += ["--ca", str(pki / "ca.pem"), "--cert", str(pki / "admin.pem")]
        command += ["--key", str(pki / "admin-key.pem")]
    env = {**os.environ, "PYTHONPATH": str(HERE / "replica_image")}
    out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"rlog bench failed: {out.stderr.strip()}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def run_side(pair: int, tls: bool, seconds: float, base: Path) -> list[dict[str, Any]]:
    rows = []
    directory = base / f"pair{pair}-{'tls' if tls else 'plain'}"
    with DevCluster(3, directory, tls=tls) as cluster:
        leader = cluster.wait_for_leader()
        endpoint = cluster.endpoints[leader]
        for mode, args in (("serial", SERIAL), ("batched", batched(seconds))):
            row: dict[str, Any] = {"pair": pair, "tls": tls, "load": load(), "mode": mode}
            cpu = replica_cpu_seconds(cluster)
            row["result"] = result = bench(cluster, endpoint, args, tls)
            used = replica_cpu_seconds(cluster) - cpu
            row["replica_cpu_us_per_entry"] = round(used / max(result["entries"], 1) * 1e6, 1)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


MEASURES: list[tuple[str, str, Callable[[dict[str, Any]], float]]] = [
    ("serial", "ms p50", lambda r: r["result"]["latency_ms"]["p50"]),
    ("batched", "entries/s", lambda r: r["result"]["entries_per_s"]),
    ("serial", "replica CPU us/entry", lambda r: r["replica_cpu_us_per_entry"]),
    ("batched", "replica CPU us/entry", lambda r: r["replica_cpu_us_per_entry"]),
]


def summarize(rows: list[dict[str, Any]]) -> None:
    """The median of each measure per side, to stderr."""
    for mode, unit, measure in MEASURES:
        for tls in (False, True):
            values = [measure(r) for r in rows if r["mode"] == mode and r["tls"] == tls]
            side = "mutual TLS" if tls else "plaintext"
            print(
                f"{mode:8} {side:10} median {statistics.median(values):.1f} {unit} "
                f"(runs: {', '.join(f'{v:.1f}' for v in values)})",
                file=sys.stderr,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="of each batched run")
    parser.add_argument("--dir", help="cluster dirs (default: a new temporary dir)")
    parser.add_argument("--summarize", metavar="JSONL", help="only summarize an earlier run")
    args = parser.parse_args()
    if args.summarize:
        summarize([json.loads(line) for line in Path(args.summarize).read_text().splitlines()])
        return 0
    base = Path(args.dir or tempfile.mkdtemp(prefix="rlog-tls-bench-"))
    rows: list[dict[str, Any]] = []
    for pair in range(args.pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        for tls in order:
            rows += run_side(pair, tls, args.seconds, base)
    summarize(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
