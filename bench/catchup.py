"""Catch-up speed of a wiped replica (`catchup_mb`): a 3-replica log holding `--megabytes` of
`--size`-byte entries; one follower loses its data dir and restarts; the time from its start
until it is VOTING again gives MB/s.

    .venv/bin/python bench/catchup.py [--megabytes 200] [--size 4096] [--dir DIR] [--lane 1]
                                      [--rejoin] [--profile OUT [--rate 200] [--native]]

With `--rejoin` the follower keeps its data instead: it is stopped (SIGTERM) before the log is
filled and restarted after, VOTING at once, and pulls what it missed from the leader
(docs/recovery.md, the end of "Catch-up"); the time is from its start until it has learned
the last position written (`catchup_mb_per_s` still, with `"rejoin": true`), and `fetches`
counts the pull's spans.

The replicas serve lanes at their port + `--lane` (1, as the operator and `make bench` run
them; 0: none), so the copy fetches on the peers' fetch lanes once open (docs/data-path.md,
"The fetch lane"); `fetches` in the result says how many spans went each way.

Besides the end-to-end figure (process start to VOTING: `catchup_mb_per_s`) it splits the
time with the replica's own log lines: `start_seconds` (process start until it listens:
interpreter, imports, storage open), `copy_seconds` (the recover round decided, "catching
up", until "caught up ... VOTING"), and `copy_mb_per_s` over the latter; and the catching-up
replica's minor page faults and peak RSS (`victim_peak_rss_mb`, VmHWM): its working set is
the spans in flight and the batches not yet written, each page of it faulted in once.
With `--profile OUT`, py-spy (raw stacks, --nonblocking) samples the catching-up replica and
both peers from the start to VOTING and `OUT/{victim,peer-N}.txt` + `top.md` are written
(bench/pyspy_top.py), with each process's CPU seconds from /proc.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from machine import cpu_seconds, minor_faults, peak_rss_mb

from rlog.client import Client
from rlog.proto import rlog_pb2 as pb
from rlog.storage import AUTO, ENGINE_CHOICES
from rlog.tools.dev import DevCluster

STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def logged_at(log_file: Path, after: float, needle: str) -> float | None:
    """Wall-clock time of the first line of the replica's log written at or after `after`
    that contains `needle` (log stamps are local time, millisecond resolution)."""
    for line in log_file.read_text(errors="replace").splitlines():
        match = STAMP.match(line)
        if match is None or needle not in line:
            continue
        stamp = datetime.datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if stamp >= after - 0.001:
            return stamp
    return None


def start_spies(
    out: Path, pids: dict[str, int], rate: int, native: bool
) -> list[subprocess.Popen[bytes]]:
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out.mkdir(parents=True, exist_ok=True)
    spies = []
    for role, pid in pids.items():
        cmd = [spy, "record", "--pid", str(pid), "--rate", str(rate)]
        cmd += ["--native"] if native else ["--nonblocking"]
        cmd += ["--format", "raw", "--output", str(out / f"{role}.txt")]
        spies.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    return spies


def spans_fetched(cluster: DevCluster, i: int, copy: str = "catchup") -> dict[str, float]:
    """Replica i's spans of a catch-up (or of pulls: `copy` "pull") by how they came
    (`rlog_catchup_fetches_total{via}`, `rlog_pull_fetches_total{via}`)."""
    url = f"http://{cluster.host_of(i)}:{cluster.metrics_ports[i]}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = re.findall(rf'^rlog_{copy}_fetches_total\{{via="(\w+)"\}} (\S+)$', text, re.M)
    return {via: float(n) for via, n in found}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=200)
    parser.add_argument("--size", type=int, default=4096)
    parser.add_argument("--per-call", type=int, default=256)
    parser.add_argument(
        "--engine",
        choices=ENGINE_CHOICES,
        default=AUTO,
        help="the replicas' storage engine (default auto: the default engine, on fresh dirs)",
    )
    parser.add_argument("--dir", default=str(Path.home() / ".cache/rlog-bench/catchup"))
    parser.add_argument(
        "--lane", type=int, default=1, help="the replicas' lane offset (0: no lanes)"
    )
    parser.add_argument(
        "--rejoin",
        action="store_true",
        help="the follower keeps its data: stopped before the fill, restarted after, it pulls",
    )
    parser.add_argument("--profile", help="write py-spy profiles of the catch-up here")
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument(
        "--native", action="store_true", help="py-spy --native (C frames; pauses the process)"
    )
    args = parser.parse_args()
    root = Path(args.dir)
    shutil.rmtree(root, ignore_errors=True)
    entries = int(args.megabytes * 1e6 // args.size)
    value = b"c" * args.size
    cpu: dict[str, float] = {}
    with DevCluster(
        3,
        root,
        election_timeout=1.0,
        storage_engine=args.engine,
        write_lane_offset=args.lane,
        metrics=True,
    ) as cluster:
        leader = cluster.wait_for_leader()
        victim = next(i for i in range(3) if i != leader)
        started = time.monotonic()
        with Client(cluster.endpoints[leader], append_timeout=120) as client:
            last = client.append([value])[-1]  # the victim holds something of the log
            if args.rejoin:
                cluster.stop_replica(victim)
            written = 0
            while written < entries:
                n = min(args.per_call, entries - written)
                last = client.append([value] * n)[-1]
                written += n
        fill_seconds = time.monotonic() - started
        if not args.rejoin:
            cluster.wipe(victim)
        peers = {f"peer-{i}": cluster.pid(i) for i in range(3) if i != victim}
        cpu = {role: -cpu_seconds(pid) for role, pid in peers.items() if pid is not None}
        wall_started = time.time()
        started = time.monotonic()
        cluster.start_replica(victim)
        victim_pid = cluster.pid(victim)
        assert victim_pid is not None
        spies = []
        if args.profile:
            time.sleep(0.05)  # py-spy needs the interpreter up
            pids = {"victim": victim_pid, **{r: p for r, p in peers.items() if p is not None}}
            spies = start_spies(Path(args.profile), pids, args.rate, args.native)
        seen_recovering = False
        while True:
            status = cluster.statuses(timeout=2)[victim]
            if status is not None:
                seen_recovering |= status.status == pb.RECOVERING
                if status.status == pb.VOTING and (not args.rejoin or status.learned >= last):
                    break
            time.sleep(0.02)
        seconds = time.monotonic() - started
        cpu["victim"] = cpu_seconds(victim_pid)
        # Pages the victim's kernel had to map in and zero (its start included): fresh buffer
        # pages cost a few µs each on the VMs this runs on (rlog/allocator.py).
        faults = minor_faults(victim_pid)
        peak_rss = peak_rss_mb(victim_pid)
        for role, pid in peers.items():
            if pid is not None:
                cpu[role] += cpu_seconds(pid)
        for spy in spies:
            spy.send_signal(signal.SIGINT)
        for spy in spies:
            spy.communicate(timeout=30)
        learned = cluster.status(victim).learned
        fetches = spans_fetched(cluster, victim, "pull" if args.rejoin else "catchup")
        log_file = cluster.log_file(victim)
        deadline = time.monotonic() + 5
        caught_up = None
        while caught_up is None and time.monotonic() < deadline:
            caught_up = logged_at(log_file, wall_started, "caught up to")
            time.sleep(0.05)
        listening = logged_at(log_file, wall_started, "listening on")
        copying = logged_at(log_file, wall_started, "catching up")
    megabytes = entries * args.size / 1e6
    result: dict[str, object] = {
        "entries": entries,
        "entry_bytes": args.size,
        "megabytes": round(megabytes, 1),
        "fill_seconds": round(fill_seconds, 2),
        "fill_mb_per_s": round(megabytes / fill_seconds, 1),
        "catchup_seconds": round(seconds, 2),
        "catchup_mb_per_s": round(megabytes / seconds, 1),
        "catchup_entries_per_s": round(entries / seconds),
        "victim_learned": learned,
        "lane": args.lane,
        "rejoin": args.rejoin,
        "fetches": fetches,
        "seen_recovering": seen_recovering,
        "cpu_seconds": {role: round(s, 2) for role, s in cpu.items()},
        "victim_minor_faults": faults,
        "victim_peak_rss_mb": round(peak_rss, 1),
        "load1": round(os.getloadavg()[0], 2),
    }
    if listening is not None:
        result["start_seconds"] = round(listening - wall_started, 3)
    if copying is not None and caught_up is not None:
        copy_seconds = max(caught_up - copying, 0.001)
        result["copy_seconds"] = round(copy_seconds, 3)
        result["copy_mb_per_s"] = round(megabytes / copy_seconds, 1)
    if args.profile:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from pyspy_top import report

        out = Path(args.profile)
        texts = [f"# catch-up profile: {json.dumps(result)}", ""]
        for path in sorted(out.glob("*.txt")):
            if path.stat().st_size:
                texts += ["```", report(path, 15, args.rate, entries), "```", ""]
        (out / "top.md").write_text("\n".join(texts))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
