"""A/B of two builds or settings of rlog on appends, in interleaved pairs: `bench/ab.py`.

    bench/ab.py --pairs 5 --a RLOG_EVENT_LOOP=asyncio --b RLOG_EVENT_LOOP=uvloop
    bench/ab.py --pairs 5 --a-tree /path/to/main --b-tree . --modes serial,unary64

Each side is an environment (`--a NAME=VALUE`, repeatable), a source tree
(`--a-tree DIR`: its `replica_image` goes first on PYTHONPATH, for the replicas and the
bench client alike; default this tree), a storage engine (`--a-engine`, default auto:
the default engine, the data dirs being fresh; a tree from before `auto` needs the engine
named, e.g. `--a-engine lmdb`, as the dirs are initialized by this tree) and a write lane
(`--a-lane N`: `rlog replica --write-lane-offset N`; default 0, none); `--a-client-lane`
sends that side's appends on the client's append lane (`rlog bench --lane`, the side's
replicas need a lane), so that `--a-lane 1 --b-lane 1 --b-client-lane --modes batched`
compares one gRPC call per append with the lane, each on fresh logs.
`--tls` runs both sides with mutual TLS and roles (`DevCluster(tls=True)`, the client as
the dev PKI's "admin").
Per pair, each side starts a fresh 3-replica `DevCluster` (data on the real disk) and runs
`rlog bench` against the leader for each mode; the side that goes first alternates between
pairs, so both see the same load drift. Each run also records the replicas' CPU time per
entry (user + system of the three processes, from /proc), which a loaded machine disturbs
less than rates, and their minor page faults per entry (fresh pages the kernel had to map
in and zero).

Modes: serial (`--count` 1000 appends of 1 KiB one at a time after 20 untimed: p50/p99),
serial_stream (the same on the stream client: each append one message on an AppendStream),
serial_lane (the same on the client's append lane: a side needs `--x-lane N`),
unary64 (64 writers, one single-entry unary call each, `--seconds`: appends/s; unary64_lane
on the append lane), stream64 (the same on the stream client), batched (8 writers x 64
entries per call: entries/s; batched_lane on the append lane), batched4k (the same with 4 KiB
values).

`--etcd` also runs `bench/etcd_put.py` (serial puts, 64 single-put writers) between the
two sides of each pair, against an etcd started by `bench/etcd_cluster.sh start`.

One JSON object per line on stdout ({"pair", "side", "load", "mode", "result"}); per mode,
each pair's figures and the medians per side go to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from machine import load, replica_cpu_seconds, replica_minor_faults  # noqa: E402

from rlog.storage import AUTO, ENGINE_CHOICES  # noqa: E402
from rlog.tools.dev import DevCluster  # noqa: E402


def mode_args(mode: str, count: int, seconds: float) -> list[str]:
    """rlog bench's arguments for `mode`: one gRPC call per append (`--no-lane`, the lane
    being every client's default) unless the mode says `_lane` or `stream`."""
    if mode.endswith("_lane"):
        return [*_mode_args(mode.removesuffix("_lane"), count, seconds), "--lane"]
    if "stream" in mode:
        return _mode_args(mode, count, seconds)
    return [*_mode_args(mode, count, seconds), "--no-lane"]


def _mode_args(mode: str, count: int, seconds: float) -> list[str]:
    serial = ["--mode", "serial", "--count", str(count), "--warmup", "20", "--size", "1024"]
    if mode == "serial":
        return serial
    if mode == "serial_stream":
        return [*serial, "--stream"]
    concurrent = ["--mode", "concurrent", "--size", "1024", "--duration", str(seconds)]
    concurrent += ["--warmup", "20"]
    if mode == "unary64":
        return [*concurrent, "--concurrency", "64"]
    if mode == "stream64":
        return [*concurrent, "--concurrency", "64", "--stream"]
    if mode == "batched":
        return [*concurrent, "--concurrency", "8", "--batch", "64"]
    if mode == "batched4k":  # the MB/s figure's shape: 8 writers x 64 x 4 KiB
        return [*concurrent, "--concurrency", "8", "--batch", "64", "--size", "4096"]
    raise SystemExit(f"unknown mode {mode}")


def side_env(settings: list[str], tree: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree / "replica_image"), *filter(None, [env.get("PYTHONPATH")])]
    )
    for item in settings:
        name, _, value = item.partition("=")
        env[name] = value
    return env


def run_side(
    pair: int,
    side: str,
    env: dict[str, str],
    engine: str,
    lane: int,
    client_lane: bool,
    modes: list[str],
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    rows = []
    directory = Path(args.dir) / f"pair{pair}-{side}"
    with DevCluster(
        3, directory, env=env, storage_engine=engine, write_lane_offset=lane, tls=args.tls
    ) as cluster:
        endpoint = cluster.endpoints[cluster.wait_for_leader()]
        for mode in modes:
            command = [sys.executable, "-m", "rlog.tools.cli", "bench", "-e", endpoint, "--json"]
            command += mode_args(mode, args.count, args.seconds)
            if client_lane and "--no-lane" in command:
                command[command.index("--no-lane")] = "--lane"
            if args.tls:
                pki = cluster.tls_dir
                command += ["--ca", str(pki / "ca.pem"), "--cert", str(pki / "admin.pem")]
                command += ["--key", str(pki / "admin-key.pem")]
            row: dict[str, Any] = {"pair": pair, "side": side, "load": load(), "mode": mode}
            cpu = replica_cpu_seconds(cluster)
            faults = replica_minor_faults(cluster)
            out = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
            if out.returncode != 0:
                raise SystemExit(f"rlog bench failed: {out.stderr.strip()}")
            row["result"] = result = json.loads(out.stdout)
            used = replica_cpu_seconds(cluster) - cpu
            row["replica_cpu_us_per_entry"] = round(used / max(result["entries"], 1) * 1e6, 1)
            faulted = replica_minor_faults(cluster) - faults
            row["replica_minflt_per_entry"] = round(faulted / max(result["entries"], 1), 2)
            print(json.dumps(row), flush=True)
            rows.append(row)
    shutil.rmtree(directory, ignore_errors=True)  # a log's data: gigabytes over a run
    return rows


def run_etcd(pair: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    """etcd 3.4 (`bench/etcd_cluster.sh start` first): serial puts and 64 single-put
    writers, rows of side "etcd" in the modes serial and unary64."""
    command = [sys.executable, str(HERE / "bench" / "etcd_put.py"), "--serial", str(args.count)]
    command += ["--concurrency", "64", "--duration", str(args.seconds)]
    load_at = load()
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    rows = []
    for line in out.stdout.splitlines():
        r = json.loads(line)
        mode = "serial" if r["mode"] == "serial" else "unary64"
        result = {
            "latency_ms": {"p50": r["p50_ms"], "p99": r["p99_ms"]},
            "entries_per_s": r["puts_per_s"],
        }
        row = {"pair": pair, "side": "etcd", "load": load_at, "mode": mode, "result": result}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def figure(row: dict[str, Any]) -> str:
    result = row["result"]
    cpu = row.get("replica_cpu_us_per_entry")
    cpu_text = f", replicas {cpu:.0f} µs CPU/entry" if cpu is not None else ""
    faults = row.get("replica_minflt_per_entry")
    cpu_text += f", {faults:.1f} minor faults/entry" if faults is not None else ""
    if row["mode"].startswith("serial"):
        lat = result["latency_ms"]
        return f"p50 {lat['p50']:.2f} p99 {lat['p99']:.2f} ms{cpu_text}"
    return f"{result['entries_per_s']:.0f}/s{cpu_text}"


def value(row: dict[str, Any]) -> float:
    result = row["result"]
    if row["mode"].startswith("serial"):
        return float(result["latency_ms"]["p50"])
    return float(result["entries_per_s"])


def summarize(rows: list[dict[str, Any]]) -> None:
    for mode in dict.fromkeys(r["mode"] for r in rows):
        print(f"{mode}:", file=sys.stderr)
        pairs = sorted({r["pair"] for r in rows if r["mode"] == mode})
        for pair in pairs:
            cells = []
            for side in ("A", "B", "etcd"):
                row = next(
                    (r for r in rows if (r["mode"], r["pair"], r["side"]) == (mode, pair, side)),
                    None,
                )
                if row is not None:
                    cells.append(f"{side}: {figure(row)} (load {row['load'].split()[0]})")
            print(f"  pair {pair}: " + "; ".join(cells), file=sys.stderr)
        for side in ("A", "B", "etcd"):
            values = [value(r) for r in rows if r["mode"] == mode and r["side"] == side]
            if values:
                unit = "ms p50" if mode.startswith("serial") else "entries/s"
                print(
                    f"  {side} median {statistics.median(values):.2f} {unit}",
                    file=sys.stderr,
                )
        for side in ("A", "B"):
            cpu = [
                r["replica_cpu_us_per_entry"]
                for r in rows
                if r["mode"] == mode and r["side"] == side and "replica_cpu_us_per_entry" in r
            ]
            if cpu:
                print(
                    f"  {side} median replica CPU {statistics.median(cpu):.0f} µs/entry",
                    file=sys.stderr,
                )
        if mode.startswith("serial"):
            for side in ("A", "B", "etcd"):
                p99 = [
                    r["result"]["latency_ms"]["p99"]
                    for r in rows
                    if r["mode"] == mode and r["side"] == side
                ]
                if p99:
                    print(f"  {side} median p99 {statistics.median(p99):.2f} ms", file=sys.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--a", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--b", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument(
        "--a-engine", choices=ENGINE_CHOICES, default=AUTO, help="the replicas' storage engine"
    )
    parser.add_argument("--b-engine", choices=ENGINE_CHOICES, default=AUTO)
    parser.add_argument("--a-lane", type=int, default=0, help="the replicas' write lane offset")
    parser.add_argument("--b-lane", type=int, default=0)
    parser.add_argument(
        "--a-client-lane", action="store_true", help="the bench client appends on the lane"
    )
    parser.add_argument("--b-client-lane", action="store_true")
    parser.add_argument("--tls", action="store_true", help="mutual TLS and roles, both sides")
    parser.add_argument("--a-tree", type=Path, default=HERE)
    parser.add_argument("--b-tree", type=Path, default=HERE)
    parser.add_argument("--modes", default="serial", help="comma-separated (default serial)")
    parser.add_argument("--count", type=int, default=1000, help="serial appends per run")
    parser.add_argument("--seconds", type=float, default=5.0, help="of each concurrent run")
    parser.add_argument("--dir", help="cluster dirs (default: a new temporary dir)")
    parser.add_argument(
        "--etcd",
        action="store_true",
        help="also etcd between the sides of each pair (bench/etcd_cluster.sh start first)",
    )
    parser.add_argument("--summarize", metavar="JSONL", help="only summarize an earlier run")
    args = parser.parse_args()
    if args.summarize:
        summarize([json.loads(line) for line in Path(args.summarize).read_text().splitlines()])
        return 0
    args.dir = args.dir or tempfile.mkdtemp(prefix="rlog-ab-", dir=Path.home() / ".cache")
    modes = args.modes.split(",")
    sides = {
        "A": side_env(args.a, args.a_tree.resolve()),
        "B": side_env(args.b, args.b_tree.resolve()),
    }
    engines = {"A": args.a_engine, "B": args.b_engine}
    lanes = {"A": args.a_lane, "B": args.b_lane}
    client_lanes = {"A": args.a_client_lane, "B": args.b_client_lane}
    for side, wanted in client_lanes.items():
        if wanted and not lanes[side]:
            parser.error(f"--{side.lower()}-client-lane needs --{side.lower()}-lane N")
    rows: list[dict[str, Any]] = []
    for pair in range(args.pairs):
        order = ("A", "B") if pair % 2 == 0 else ("B", "A")
        for side in order:
            rows += run_side(
                pair,
                side,
                sides[side],
                engines[side],
                lanes[side],
                client_lanes[side],
                modes,
                args,
            )
            if args.etcd and side == order[0]:  # between the two sides
                rows += run_etcd(pair, args)
    summarize(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
