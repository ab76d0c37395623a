"""`make bench-soak`: the RSS of each replica of a 3-replica log, sampled while the batched
benchmark (8 writers x 64 entries of 1 KiB per call, to the leader) runs for N minutes.

    python bench/soak.py [--minutes 10] [--interval 5] [--truncate-every 30] [--out FILE]

Prints start (before the load), peak and end RSS per replica, and writes a results file
(default bench/results/soak-<date>.jsonl: "rss" samples, the benchmark's result and a
"figure" with the largest end RSS) that `bench/plots.py RESULTS --soak FILE` draws.
Every --truncate-every seconds the log is truncated below the leader's learned position, as a
consumer that keeps up would do, so the disk use stays bounded (10 minutes at ~10k entries/s
would otherwise leave ~6 GB per replica); 0 keeps every entry.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kitlib import figure

BENCH = Path(__file__).resolve().parent


def memory_mb(pid: int) -> dict[str, float]:
    """Resident set size of a process from /proc (Linux): rss_mb in all, anon_mb of it the
    process's own memory (heap), file_mb the mapped file pages (an LMDB data file is mapped,
    so its pages that were touched count in RSS; the kernel can drop them)."""
    fields = {"VmRSS:": "rss_mb", "RssAnon:": "anon_mb", "RssFile:": "file_mb"}
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0] + ":"
        if key in fields:
            found[fields[key]] = round(int(line.split()[1]) / 1024, 1)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--interval", type=float, default=5, help="seconds between samples")
    parser.add_argument("--truncate-every", type=float, default=30, metavar="SECONDS")
    parser.add_argument("--out", help="default bench/results/soak-<date>.jsonl")
    parser.add_argument("--work", default=str(Path.home() / ".cache/rlog-bench/soak"))
    args = parser.parse_args()
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    out = Path(args.out) if args.out else BENCH / "results" / f"soak-{stamp}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []

    def add(record: dict[str, Any]) -> None:
        records.append(record)
        with out.open("a") as f:
            f.write(json.dumps(record) + "\n")

    import shutil

    from rlog.client import Client
    from rlog.tools.dev import DevCluster

    out.write_text("")
    shutil.rmtree(args.work, ignore_errors=True)
    seconds = args.minutes * 60
    bench = ["bench", "--json", "--size", "1024", "--mode", "concurrent", "--concurrency", "8"]
    bench += ["--batch", "64", "--duration", str(seconds)]
    add(
        {
            "kind": "meta",
            "run": out.stem,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "cpus": os.cpu_count(),
            "load_start": [round(x, 2) for x in os.getloadavg()],
            "minutes": args.minutes,
            "truncate_every": args.truncate_every,
            "command": shlex.join(["python", "bench/soak.py", *sys.argv[1:]]),
        }
    )
    with DevCluster(3, args.work) as cluster:
        leader = cluster.wait_for_leader()
        pids = {i: cluster.pid(i) for i in range(3)}
        roles = {i: "leader" if i == leader else "follower" for i in range(3)}
        start = {i: memory_mb(pid) for i, pid in pids.items() if pid is not None}
        running = subprocess.Popen(
            [sys.executable, "-m", "rlog.tools.cli", *bench, "--endpoint", cluster.endpoint],
            stdout=subprocess.PIPE,
            text=True,
        )
        began = time.monotonic()
        last_truncate = began
        with Client(cluster.endpoints[leader]) as client:
            while running.poll() is None:
                t = time.monotonic() - began
                for i, pid in pids.items():
                    if pid is not None:
                        add({"kind": "rss", "t": round(t, 1), "replica": i, "role": roles[i],
                             **memory_mb(pid)})  # fmt: skip
                if args.truncate_every and time.monotonic() - last_truncate >= args.truncate_every:
                    learned = cluster.status(leader).learned
                    client.truncate(learned)
                    last_truncate = time.monotonic()
                now = records[-len(pids) :]
                print(f"  {t:6.0f} s  load {os.getloadavg()[0]:.1f}  RSS/anon MB: " + "  ".join(
                    f"{roles[r['replica']]} {r['rss_mb']:.0f}/{r['anon_mb']:.0f}" for r in now
                ), file=sys.stderr, flush=True)  # fmt: skip
                time.sleep(args.interval)
        result = json.loads(running.communicate()[0])
    add({"kind": "bench", "result": result, "command": shlex.join(["rlog", *bench])})
    samples = [r for r in records if r["kind"] == "rss"]
    lines = [
        f"soak: {args.minutes:g} min of batched appends (8 writers x 64 x 1 KiB), "
        f"{result['entries_per_s']:,.0f} entries/s, load at the end {os.getloadavg()[0]:.1f}",
        "RSS in MB (anon = the process's own memory, file = mapped file pages, e.g. LMDB's)",
        "| replica | role | start RSS | peak RSS | end RSS | start anon | peak anon | end anon "
        "| end file |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    ends = []
    for i in pids:
        mine = [s for s in samples if s["replica"] == i]
        rss = [s["rss_mb"] for s in mine]
        anon = [s["anon_mb"] for s in mine]
        ends.append(anon[-1])
        lines.append(
            f"| {i} | {roles[i]} | {start[i]['rss_mb']:.0f} | {max(rss):.0f} | {rss[-1]:.0f} "
            f"| {start[i]['anon_mb']:.0f} | {max(anon):.0f} | {anon[-1]:.0f} "
            f"| {mine[-1]['file_mb']:.0f} |"
        )
    add(
        figure(
            "soak_rss",
            f"largest replica anonymous RSS after {args.minutes:g} min of batched appends",
            "MB",
            max(ends),
            None,
            None,
            "lower",
            records[0]["command"],
        )
    )
    add({"kind": "summary", "text": "\n".join(lines)})
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
