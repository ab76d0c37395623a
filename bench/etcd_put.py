"""etcd v3 Put benchmark: the etcd baseline of the kit's figures (docs/performance.md).

Two modes, both against a running etcd cluster (see bench/etcd_cluster.sh):

* serial: N puts one after another from one client -> p50/p99/mean latency (ms).
* concurrent: C coroutines, each with exactly one put outstanding at a time (so C
  requests in flight), for a fixed duration -> acknowledged puts/s, plus the
  latency distribution under that load.

Every put is a fresh key with a VALUE_SIZE-byte value. A put is counted only when
etcd has answered it successfully, i.e. after it was committed by a raft majority
(fsynced to the WAL on a majority) and applied.

By default all requests go to the current raft leader (found with Maintenance.Status),
which is etcd's best case: a follower would forward each proposal to the leader.
--target spread sends round-robin to all endpoints instead.

The gRPC stubs are generated at run time from bench/etcdpb/etcd_min.proto, a
hand-written, wire-compatible subset of etcd's rpc.proto, into a temporary directory.

Output: one JSON line per mode on stdout, a human-readable summary on stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import math
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

import grpc
import grpc.aio

PROTO = Path(__file__).resolve().parent / "etcdpb" / "etcd_min.proto"
DEFAULT_ENDPOINTS = "127.0.0.1:23791,127.0.0.1:23792,127.0.0.1:23793"


def load_stubs() -> tuple[ModuleType, ModuleType]:
    """Compile etcd_min.proto into a temp dir and import the generated modules."""
    from grpc_tools import protoc

    out = tempfile.mkdtemp(prefix="etcdpb-")
    inc = str(Path(protoc.__file__).parent / "_proto")
    rc = protoc.main(
        [
            "protoc",
            f"-I{PROTO.parent}",
            f"-I{inc}",
            f"--python_out={out}",
            f"--grpc_python_out={out}",
            str(PROTO),
        ]
    )
    if rc != 0:
        raise SystemExit(f"protoc failed on {PROTO} (rc={rc})")
    sys.path.insert(0, out)
    try:
        pb2 = importlib.import_module("etcd_min_pb2")
        pb2_grpc = importlib.import_module("etcd_min_pb2_grpc")
    finally:
        sys.path.remove(out)
    return pb2, pb2_grpc


def pct(sorted_vals: list[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted list."""
    if not sorted_vals:
        return float("nan")
    k = max(0, math.ceil(q * len(sorted_vals)) - 1)
    return sorted_vals[k]


def lat_stats(lat_ns: list[int]) -> dict[str, float]:
    ms = sorted(x / 1e6 for x in lat_ns)
    return {
        "p50_ms": round(pct(ms, 0.50), 3),
        "p90_ms": round(pct(ms, 0.90), 3),
        "p99_ms": round(pct(ms, 0.99), 3),
        "max_ms": round(ms[-1], 3) if ms else float("nan"),
        "mean_ms": round(statistics.fmean(ms), 3) if ms else float("nan"),
    }


def with_cdf(result: dict, cdf: bool) -> dict:
    """The result without its raw latencies, with their quantiles if asked (bench/kitlib)."""
    lat_ns = result.pop("latencies_ns")
    if cdf:
        from kitlib import quantiles  # bench/ is on sys.path when this runs as a script

        result["cdf_ms"] = quantiles(x / 1e6 for x in lat_ns)
    return result


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def cluster_status(pb2: ModuleType, pb2_grpc: ModuleType, endpoints: list[str]) -> dict:
    """Ask every endpoint for its status; return leader endpoint, version, member ids."""
    members: dict[str, int] = {}
    leader_id = 0
    version = ""
    for ep in endpoints:
        with grpc.insecure_channel(ep) as ch:
            st = pb2_grpc.MaintenanceStub(ch).Status(pb2.StatusRequest(), timeout=5)
        members[ep] = st.header.member_id
        leader_id = leader_id or st.leader
        version = version or st.version
    leader_ep = next((ep for ep, mid in members.items() if mid == leader_id), None)
    if leader_ep is None:
        raise SystemExit(f"no leader among {endpoints} (leader id {leader_id:x})")
    return {"leader": leader_ep, "version": version, "members": members}


def run_serial(
    pb2: ModuleType, pb2_grpc: ModuleType, endpoint: str, n: int, value: bytes, warmup: int
) -> dict:
    with grpc.insecure_channel(endpoint) as ch:
        put = pb2_grpc.KVStub(ch).Put
        for i in range(warmup):
            put(pb2.PutRequest(key=b"bench/warm/%d" % i, value=value), timeout=10)
        lat: list[int] = []
        cpu0 = cpu_seconds()
        t0 = time.perf_counter_ns()
        for i in range(n):
            req = pb2.PutRequest(key=b"bench/serial/%d" % i, value=value)
            s = time.perf_counter_ns()
            put(req, timeout=10)
            lat.append(time.perf_counter_ns() - s)
        wall = (time.perf_counter_ns() - t0) / 1e9
        cpu = cpu_seconds() - cpu0
    return {
        "mode": "serial",
        "puts": n,
        "seconds": round(wall, 3),
        "puts_per_s": round(n / wall, 1),
        **lat_stats(lat),
        "client_cpu_pct": round(100 * cpu / wall, 1),
        "latencies_ns": lat,
    }


async def run_concurrent(
    pb2: ModuleType,
    pb2_grpc: ModuleType,
    targets: list[str],
    concurrency: int,
    duration: float,
    value: bytes,
    warmup_s: float,
) -> dict:
    channels = [grpc.aio.insecure_channel(ep) for ep in targets]
    try:
        stubs = [pb2_grpc.KVStub(ch) for ch in channels]
        for ch in channels:
            await ch.channel_ready()
        lat: list[int] = []
        errors = 0
        acked = 0
        measuring = False
        stop = False

        async def writer(w: int) -> None:
            nonlocal errors, acked
            put = stubs[w % len(stubs)].Put
            seq = 0
            while not stop:
                req = pb2.PutRequest(key=b"bench/c/%d/%d" % (w, seq), value=value)
                seq += 1
                s = time.perf_counter_ns()
                try:
                    await put(req, timeout=10)
                except grpc.aio.AioRpcError:
                    errors += measuring
                    continue
                if measuring:
                    lat.append(time.perf_counter_ns() - s)
                    acked += 1

        tasks = [asyncio.create_task(writer(w)) for w in range(concurrency)]
        await asyncio.sleep(warmup_s)
        measuring = True
        cpu0 = cpu_seconds()
        t0 = time.perf_counter_ns()
        await asyncio.sleep(duration)
        measuring = False
        wall = (time.perf_counter_ns() - t0) / 1e9
        cpu = cpu_seconds() - cpu0
        stop = True
        await asyncio.gather(*tasks)
    finally:
        for ch in channels:
            await ch.close()
    return {
        "mode": "concurrent",
        "concurrency": concurrency,
        "puts": acked,
        "errors": errors,
        "seconds": round(wall, 3),
        "puts_per_s": round(acked / wall, 1),
        **lat_stats(lat),
        "client_cpu_pct": round(100 * cpu / wall, 1),
        "latencies_ns": lat,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--endpoints", default=DEFAULT_ENDPOINTS, help="comma-separated host:port")
    ap.add_argument("--serial", type=int, default=1000, metavar="N", help="serial puts (0: skip)")
    ap.add_argument("--concurrency", type=int, default=64, help="outstanding puts (0: skip)")
    ap.add_argument("--duration", type=float, default=10.0, help="concurrent phase seconds")
    ap.add_argument("--value-size", type=int, default=1024, help="value bytes per put")
    ap.add_argument(
        "--target",
        choices=["leader", "spread"],
        default="leader",
        help="send every put to the raft leader (default) or round-robin to all endpoints",
    )
    ap.add_argument("--warmup", type=float, default=1.0, help="seconds/10 serial puts of warmup")
    ap.add_argument(
        "--cdf", action="store_true", help="add latency quantiles (cdf_ms) for the CDF plots"
    )
    args = ap.parse_args()

    endpoints = [e.strip() for e in args.endpoints.split(",") if e.strip()]
    pb2, pb2_grpc = load_stubs()
    st = cluster_status(pb2, pb2_grpc, endpoints)
    value = os.urandom(args.value_size)
    common = {
        "bench": "etcd_put",
        "etcd_version": st["version"],
        "members": len(endpoints),
        "value_size": args.value_size,
        "target": args.target,
        "endpoints": [st["leader"]] if args.target == "leader" else endpoints,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    results = []
    if args.serial > 0:
        r = run_serial(
            pb2, pb2_grpc, st["leader"] if args.target == "leader" else endpoints[0],
            args.serial, value, warmup=int(args.warmup * 10) + 1,
        )  # fmt: skip
        results.append({**common, **with_cdf(r, args.cdf)})
        print(json.dumps(results[-1]), flush=True)
    if args.concurrency > 0:
        targets = [st["leader"]] if args.target == "leader" else endpoints
        r = asyncio.run(
            run_concurrent(
                pb2, pb2_grpc, targets, args.concurrency, args.duration, value, args.warmup
            )
        )
        results.append({**common, **with_cdf(r, args.cdf)})
        print(json.dumps(results[-1]), flush=True)

    print(
        f"\netcd {st['version']}, {len(endpoints)} members, leader {st['leader']}, "
        f"value {args.value_size} B, target={args.target}",
        file=sys.stderr,
    )
    for r in results:
        if r["mode"] == "serial":
            head = f"serial     {r['puts']:>7} puts"
        else:
            head = f"concurrent {r['concurrency']:>3} in flight, {r['seconds']:.1f} s"
        print(
            f"  {head}: {r['puts_per_s']:>8.1f} puts/s  p50 {r['p50_ms']:.2f} ms  "
            f"p99 {r['p99_ms']:.2f} ms  mean {r['mean_ms']:.2f} ms  "
            f"(client CPU {r['client_cpu_pct']:.0f}%)",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
