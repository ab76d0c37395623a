"""`make bench-profile`: py-spy flame graphs of the leader and of a follower of a 3-replica log
while `rlog bench` runs each mode, and the top functions as text (bench/pyspy_top.py).

    python bench/pyspy_profile.py [--seconds 10] [--rate 100] [--modes serial,concurrent,batched]
                            [--out bench/results/profile-<date>] [--lane]

Modes (1 KiB values unless said, to the leader): serial (one append at a time), concurrent
(64 writers, one unary call per append), stream (the same on the stream client), batched
(8 writers x 64 entries per call), batched4k (the same with 4 KiB values; not in the default
set). For each mode and role (leader, follower) it writes MODE-ROLE.svg (flame graph),
MODE-ROLE.txt (py-spy raw stacks) and MODE-ROLE-top.txt, and a top.md with all of them and
the acknowledged entries per second; the CPU per entry is samples / rate / entries. `--lane`
profiles the shape `make bench` measures: the replicas' write lane (`--write-lane-offset 1`)
and every append on the client's append lane (`rlog bench --lane`). Two
py-spy processes sample each replica (one per output format), with --nonblocking so the
replica is never paused; py-spy samples Python threads only (not gRPC's C threads).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from machine import cpu_seconds
from pyspy_top import report

BENCH = Path(__file__).resolve().parent
MODES = {
    "serial": ["--mode", "serial"],
    "concurrent": ["--mode", "concurrent", "--concurrency", "64"],
    "stream": ["--mode", "concurrent", "--concurrency", "64", "--stream"],
    "batched": ["--mode", "concurrent", "--concurrency", "8", "--batch", "64"],
    # the MB/s figure's shape (its --size comes after the default 1024, so it wins)
    "batched4k": ["--mode", "concurrent", "--concurrency", "8", "--batch", "64", "--size", "4096"],
}


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10, help="sampling time per mode")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--modes", default="serial,concurrent,stream,batched")
    parser.add_argument("--out", help="default bench/results/profile-<date>")
    parser.add_argument("--work", default=str(Path.home() / ".cache/rlog-bench/profile"))
    parser.add_argument(
        "--lane",
        action="store_true",
        help="the replicas' write lane and the client's append lane, as make bench runs them",
    )
    args = parser.parse_args()
    modes = args.modes.split(",")
    # rlog bench's, beside each mode's arguments (the lane is every client's default)
    client_lane = ["--lane"] if args.lane else ["--no-lane"]
    for mode in modes:
        if mode not in MODES:
            raise SystemExit(f"unknown mode {mode!r}: one of {', '.join(MODES)}")
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    out = Path(args.out) if args.out else BENCH / "results" / f"profile-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    spy = py_spy()

    from rlog.tools.dev import DevCluster

    shutil.rmtree(args.work, ignore_errors=True)
    summary = [f"# py-spy profiles, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]
    with DevCluster(3, args.work, write_lane_offset=1 if args.lane else 0) as cluster:
        leader = cluster.wait_for_leader()
        follower = next(i for i in range(3) if i != leader)
        roles = {"leader": cluster.pid(leader), "follower": cluster.pid(follower)}
        for mode in modes:
            load = os.getloadavg()[0]
            print(f"== {mode} (load {load:.1f})", file=sys.stderr, flush=True)
            bench = [sys.executable, "-m", "rlog.tools.cli", "bench", "--json", "--size", "1024"]
            bench += ["--endpoint", cluster.endpoints[leader], *MODES[mode], "--warmup", "20"]
            bench += ["--duration", str(args.seconds + 2)]
            bench += [] if "--stream" in MODES[mode] else client_lane
            running = subprocess.Popen(bench, stdout=subprocess.PIPE, text=True)
            time.sleep(1)  # past the warm-up, into the steady state
            spies = []
            cpu_before = {role: cpu_seconds(pid) for role, pid in roles.items()}
            sampled = time.monotonic()
            for role, pid in roles.items():
                for fmt, ext in (("flamegraph", "svg"), ("raw", "txt")):
                    cmd = [spy, "record", "--pid", str(pid), "--rate", str(args.rate)]
                    cmd += ["--duration", str(int(args.seconds)), "--nonblocking"]
                    cmd += ["--format", fmt, "--output", str(out / f"{mode}-{role}.{ext}")]
                    spies.append(
                        subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                    )
            for spy_process in spies:
                _, err = spy_process.communicate()
                if spy_process.returncode != 0:
                    raise SystemExit(f"py-spy failed: {err.decode(errors='replace')}")
            sampled = time.monotonic() - sampled
            cpu = {role: cpu_seconds(pid) - cpu_before[role] for role, pid in roles.items()}
            result = json.loads(running.communicate()[0])
            entries = int(result["entries_per_s"] * int(args.seconds))
            summary += [
                f"## {mode}: {' '.join([*MODES[mode], *client_lane])}",
                "",
                f"{result['entries_per_s']:,.0f} entries/s acknowledged, p50 "
                f"{result['latency_ms']['p50']} ms; ~{entries} entries while sampling; "
                f"load {load:.1f} at the start",
                "",
            ]
            summary.append(
                "replica CPU (user + system, /proc) while sampling: "
                + ", ".join(
                    f"{role} {cpu[role]:.2f} s = {cpu[role] / sampled:.0%} of a core = "
                    f"{cpu[role] / max(entries, 1) * 1e6:.0f} us/entry"
                    for role in roles
                )
            )
            summary += ["", "```"]
            for role in roles:
                text = report(out / f"{mode}-{role}.txt", 12, args.rate, entries)
                (out / f"{mode}-{role}-top.txt").write_text(text + "\n")
                summary += [f"[{role}] " + text, ""]
            summary += ["```", ""]
    (out / "top.md").write_text("\n".join(summary))
    print("\n".join(summary))
    print(f"flame graphs in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
