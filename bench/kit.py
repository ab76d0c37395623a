"""The benchmark kit's driver (`make bench`, bench/run.sh): rlog next to etcd 3.4 in one run on
one machine, every figure with a target in bench/targets.json, one JSON-lines results file.

    python bench/kit.py [--quick] [--seconds S] [--writers 1,4,16,64] [--sizes 128,1024,4096,16384]
                        [--no-etcd] [--spark | --no-spark] [--out FILE] [--work DIR]

Steps (each measurement is a "point" record, see bench/kitlib.py):
0. the host: what a fresh memory page costs, and what three writers' synced 2 MiB writes reach
   on new file space (in one call, and in 1 MiB calls) and on rewritten file space
   (bench/disk_ceiling.py), a "machine" record: on this VM these move between runs and days,
   and the disk-bound figures with them;
1. the batched figures, each on a log of its own started for it (3 replicas at 1 KiB and at
   4 KiB, 5 replicas at 1 KiB: series "batched_fresh", on the client's append lane; 3
   replicas at 1 KiB with one gRPC call each: "batched_fresh_unary"), first, while the
   machine is quiet:
   later steps run after minutes of continuous disk and CPU load. The value-size sweep of
   step 3 runs on the log every earlier measurement wrote to, gigabytes long by then, and
   how long depends on how fast those went; on this VM the first write to a block of file
   space costs several times a rewrite (docs/performance.md, "What the host does to disk-bound
   figures"), so a
   figure measured there says as much about the steps before it as about the batched path.
   Its 1 KiB and 4 KiB points stay beside the fresh ones as figures without a target;
2. + 3. side by side: etcd 3.4 (bench/etcd_cluster.sh, 3 members, bench/etcd_put.py to the
   raft leader) and rlog with 3 replicas (`rlog dev` layout, default engine, data on the real disk,
   `rlog bench` to the leader) both up; each etcd measurement is followed at once by its rlog
   counterparts so that both see the same load: serial puts, then serial appends (on the
   client's append lane, then one gRPC call each: series "serial_unary"); at each
   writer count 1 KiB puts, then single-entry appends from the default client (one append
   each, on the append lane: series "unary") and on the stream client (one AppendStream); at
   each value size puts (largest writer count), then
   batched appends (8 writers x 64 entries per call, on the client's append lane);
3b. without the write lane: batched 1 KiB, serial and the stream client at the largest
   writer count on a fresh 3-replica log whose leader writes to its followers on the gRPC
   stream (series "*_grpc"), figures without targets beside the others, which run every
   rlog log with `--write-lane-offset 1` as the operator does (docs/data-path.md);
4. rlog, 5 replicas: serial, the stream client at the largest writer count;
5. catch-up of a wiped (EMPTY) follower of a log of --catchup-mb of 4 KiB entries
   (bench/catchup.py), then the same size missed by a follower that kept its data and pulls
   it (`bench/catchup.py --rejoin`); then the leader SIGKILLed under a serial writer, 20 times
   (quick: 5), each time from the kill to the first acknowledged append (bench/failover.py);
6. Spark (when pyspark is installed, not in --quick): the batch source into noop next to
   Spark's JVM-only baseline, and the sink (bench/spark_source.py).
Then the figures (ratio = rlog / baseline, targets from bench/targets.json) and a markdown
summary next to the results file. Latency quantiles ("cdf" records) of the serial and
largest-writer-count runs feed the CDF plots (bench/plots.py).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kitlib import figure, find_point, load_targets, quantiles, summary_markdown
from machine import page_fault_us

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


def note(text: str) -> None:
    load = os.getloadavg()[0]
    print(f"== {time.strftime('%H:%M:%S')} (load {load:.1f}) {text}", file=sys.stderr, flush=True)


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


class Run:
    """Collects the records of one run and appends each to the results file as it comes."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.records: list[dict[str, Any]] = []
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("")

    def add(self, record: dict[str, Any]) -> dict[str, Any]:
        self.records.append(record)
        with self.out.open("a") as f:
            f.write(json.dumps(record) + "\n")
        return record

    def points(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["kind"] == "point"]


def git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


# ---- etcd ------------------------------------------------------------------------------


def etcd_ports_taken() -> list[int]:
    """The ports of bench/etcd_cluster.sh something already listens on (e.g. an etcd
    started by hand for bench/ab.py --etcd): the kit's own would refuse to start, after the
    first figures were spent. The script knows its ports (`check`)."""
    found = subprocess.run(
        [str(BENCH / "etcd_cluster.sh"), "check"], capture_output=True, text=True, check=False
    )
    return [int(port) for port in found.stdout.split()] if found.returncode else []


@contextlib.contextmanager
def etcd_cluster(run: Run, args: argparse.Namespace) -> Iterator[None]:
    """A 3-member etcd 3.4 (bench/etcd_cluster.sh) for the duration of the block."""
    cluster = [str(BENCH / "etcd_cluster.sh")]
    data = str(Path(args.work) / "etcd")
    subprocess.run([*cluster, "stop", data], capture_output=True)
    note("etcd 3.4: 3 members")
    subprocess.run([*cluster, "start", data], check=True, stdout=subprocess.DEVNULL)
    try:
        version = subprocess.run(
            ["etcd", "--version"], capture_output=True, text=True
        ).stdout.splitlines()[0]
        run.add({"kind": "etcd", "version": version})
        yield
    finally:
        subprocess.run([*cluster, "stop", data], capture_output=True)


def etcd_put(run: Run, args: argparse.Namespace, serial: int, writers: int, size: int) -> None:
    cmd = [args.python, str(BENCH / "etcd_put.py"), "--serial", str(serial)]
    cmd += ["--concurrency", str(writers), "--duration", str(args.seconds)]
    cmd += ["--value-size", str(size), "--cdf"]
    note(f"  etcd_put serial={serial} writers={writers} size={size}")
    load = os.getloadavg()[0]
    lines = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()
    shown = shlex.join(["python", *cmd[1:]]).replace(str(ROOT) + "/", "")
    for line in lines:
        r = json.loads(line)
        series = "serial" if r["mode"] == "serial" else "put"
        point = run.add(
            {
                "kind": "point",
                "system": "etcd",
                "series": series,
                "replicas": r["members"],
                "writers": r.get("concurrency", 1),
                "batch": 1,
                "size": size,
                "seconds": r["seconds"],
                "entries_per_s": r["puts_per_s"],
                "mb_per_s": round(r["puts_per_s"] * size / 1e6, 3),
                "p50_ms": r["p50_ms"],
                "p99_ms": r["p99_ms"],
                "errors": r.get("errors", 0),
                "client_cpu_pct": r["client_cpu_pct"],
                "load1": round(load, 2),
                "command": shown,
            }
        )
        if size == 1024 and (series == "serial" or point["writers"] == max(args.writers)):
            run.add(cdf_record(point, r["cdf_ms"]))


def cdf_record(point: dict[str, Any], cdf: list[list[float]]) -> dict[str, Any]:
    keys = ("system", "series", "replicas", "writers", "batch", "size")
    return {"kind": "cdf", **{k: point[k] for k in keys}, "quantiles_ms": cdf}


# ---- rlog ------------------------------------------------------------------------------


# The replicas' write lane, as the operator deploys them (`--write-lane-offset 1`): every
# figure with a target is measured so; the gRPC-stream step measures them without it.
LANE = 1


@contextlib.contextmanager
def rlog_cluster(args: argparse.Namespace, replicas: int, lane: int = LANE) -> Iterator[str]:
    """An `rlog dev`-style log (default engine, data on the real disk; with `lane`, the replicas'
    write lane at that port offset, 0: the leader's writes on the gRPC stream); yields the
    leader's endpoint."""
    from rlog.tools.dev import DevCluster

    note(f"rlog: {replicas} replicas" + (f", write lane at port + {lane}" if lane else ""))
    root = Path(args.work) / f"rlog{replicas}"
    shutil.rmtree(root, ignore_errors=True)
    with DevCluster(replicas, root, write_lane_offset=lane) as cluster:
        yield cluster.endpoints[cluster.wait_for_leader()]
    shutil.rmtree(root, ignore_errors=True)


def disk_ceiling(args: argparse.Namespace, *options: str | int) -> dict[str, Any]:
    """One bench/disk_ceiling.py run of 2 s on the kit's volume: its JSON summary."""
    command = [args.python, str(BENCH / "disk_ceiling.py"), "--seconds", "2", "--dir", args.work]
    command += [str(option) for option in options]
    out = subprocess.run(command, capture_output=True, text=True, check=True, timeout=300)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def host_probe(run: Run, args: argparse.Namespace) -> None:
    """Step 0: the "machine" record, with the ceilings the figures are stated against (about
    20 s): what one sync takes, what one and three writers make durable, how many group
    commits a bare file takes."""
    note("the host: page faults, synced writes on new and rewritten file space, ceilings")
    record: dict[str, Any] = {"kind": "machine", "page_fault_us": round(page_fault_us(), 2)}
    # "new_pieces": the same 2 MiB writes issued as 1 MiB calls, as the segment engine does
    # (a single large call is several times slower on this VM's kernel).
    for name, rewrite, piece in (
        ("new", 0, 0),
        ("new_pieces", 0, 1 << 20),
        ("rewritten", 256 << 20, 0),
    ):
        result = disk_ceiling(
            args, "--writers", 3, "--size", 2 << 20, "--rewrite", rewrite, "--piece", piece
        )
        record[f"synced_mb_per_s_{name}"] = result["per_writer_share_mb_per_s"]
    # The least a durable append can take: one 4 KiB append to a growing file and its
    # fdatasync, one at a time.
    sync = disk_ceiling(args, "--writers", 1, "--size", 4096)["each_sync_ms"][0]
    record |= {f"sync_ms_{q}": sync[q] for q in ("p50", "p90", "p99")}
    # What one writer makes durable (a catch-up's copy writes alone).
    one = disk_ceiling(args, "--writers", 1, "--size", 2 << 20, "--piece", 1 << 20)
    record["synced_mb_per_s_one"] = one["per_writer_share_mb_per_s"]
    # Three replicas' group commits of 64 x 1 KiB on one disk, as many as the disk takes.
    groups = disk_ceiling(args, "--writers", 3, "--size", 64 << 10)["each_syncs_per_s"]
    record["group_commits_per_s"] = round(sum(groups) / len(groups), 1)
    record["command"] = (
        "python bench/disk_ceiling.py --writers 3 --size 2097152 [--piece 1048576] [--rewrite N];"
        " --writers 1 --size 4096; --writers 1 --size 2097152 --piece 1048576;"
        " --writers 3 --size 65536"
    )
    run.add(record)


def side_by_side(run: Run, args: argparse.Namespace) -> None:
    """etcd and rlog (3 replicas) both up, each etcd measurement followed at once by its rlog
    counterparts, so both see the same load on a shared machine (the idle system's heartbeats
    cost little). Without etcd (--no-etcd) the same rlog runs."""
    with contextlib.ExitStack() as stack:
        etcd = not args.no_etcd
        if etcd:
            stack.enter_context(etcd_cluster(run, args))
        endpoint = stack.enter_context(rlog_cluster(args, 3))
        if etcd:
            etcd_put(run, args, serial=args.serial, writers=0, size=1024)
        rlog_bench(run, args, endpoint, 3, "serial", 1, 1, 1024)
        rlog_bench(run, args, endpoint, 3, "serial_unary", 1, 1, 1024)
        for writers in args.writers:
            if etcd:
                etcd_put(run, args, serial=0, writers=writers, size=1024)
            rlog_bench(run, args, endpoint, 3, "unary", writers, 1, 1024)
            rlog_bench(run, args, endpoint, 3, "stream", writers, 1, 1024)
        for size in args.sizes:
            if etcd and size != 1024:
                etcd_put(run, args, serial=0, writers=max(args.writers), size=size)
            rlog_bench(run, args, endpoint, 3, "batched", 8, 64, size)


def five_replicas(run: Run, args: argparse.Namespace) -> None:
    with rlog_cluster(args, 5) as endpoint:
        rlog_bench(run, args, endpoint, 5, "serial", 1, 1, 1024)
        rlog_bench(run, args, endpoint, 5, "stream", max(args.writers), 1, 1024)


def grpc_stream_step(run: Run, args: argparse.Namespace) -> None:
    """The batched 1 KiB, serial and stream figures again on a fresh 3-replica log whose
    leader writes to its followers on the gRPC stream (no write lane, as before 28
    November 2026): figures without targets, beside the lane's (docs/data-path.md)."""
    with rlog_cluster(args, 3, lane=0) as endpoint:
        rlog_bench(run, args, endpoint, 3, "batched_grpc", 8, 64, 1024)
        rlog_bench(run, args, endpoint, 3, "serial_grpc", 1, 1, 1024)
        rlog_bench(run, args, endpoint, 3, "stream_grpc", max(args.writers), 1, 1024)


def batched_on_fresh_logs(run: Run, args: argparse.Namespace) -> None:
    """Step 1: each batched figure on a log started for it, so that it does not depend on
    what other steps wrote or on the load they leave (each log's data is removed after it)."""
    logs = [(3, 1024, "batched_fresh"), (3, 4096, "batched_fresh")]
    logs += [] if args.no_five else [(5, 1024, "batched_fresh")]
    # One gRPC call per append on a log of its own: a second run on the same log would
    # measure the first run's load as well as its own.
    logs.append((3, 1024, "batched_fresh_unary"))
    for replicas, size, series in logs:
        with rlog_cluster(args, replicas) as endpoint:
            rlog_bench(run, args, endpoint, replicas, series, 8, 64, size)


# The series whose appends go on the client's append lane, every client's default ("unary":
# the writer sweeps' single-entry writers, one append each, since December 2026 on the
# lane); the others ("*_unary", "*_grpc") keep one gRPC call each beside them (`rlog bench
# --no-lane`), and the stream's clients are on their stream.
CLIENT_LANE_SERIES = frozenset({"serial", "unary", "batched", "batched_fresh"})


def rlog_bench(
    run: Run,
    args: argparse.Namespace,
    endpoint: str,
    replicas: int,
    series: str,
    writers: int,
    batch: int,
    size: int,
) -> None:
    trace = Path(args.work) / "trace.txt"
    bench = ["bench", "--endpoint", endpoint, "--json", "--size", str(size)]
    if series.startswith("serial"):
        bench += ["--mode", "serial", "--count", str(args.serial), "--warmup", "20"]
    else:
        bench += ["--mode", "concurrent", "--concurrency", str(writers), "--batch", str(batch)]
        bench += ["--duration", str(args.seconds), "--warmup", "20"]
        if series.startswith("stream"):
            bench.append("--stream")
    if series not in CLIENT_LANE_SERIES and not series.startswith("stream"):
        bench.append("--no-lane")  # the lane is the default (docs/data-path.md)
    where = f"a {replicas}-replica rlog dev --write-lane-offset {LANE} log"
    if series.startswith("batched_fresh"):
        where = f"a fresh {replicas}-replica rlog dev --write-lane-offset {LANE} log"
    elif series.endswith("_grpc"):
        where = f"a fresh {replicas}-replica rlog dev log without the write lane"
    note(f"  rlog bench {series} writers={writers} batch={batch} size={size}")
    load = os.getloadavg()[0]
    cmd = [args.python, "-m", "rlog.tools.cli", *bench, "--trace", str(trace)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads(out)
    if r["lane"] != (series in CLIENT_LANE_SERIES):
        raise RuntimeError(f"rlog bench {series}: lane {r['lane']}, not as the series says")
    point = run.add(
        {
            "kind": "point",
            "system": "rlog",
            "series": series,
            "replicas": replicas,
            "writers": writers,
            "batch": batch,
            "size": size,
            "seconds": r["seconds"],
            "entries_per_s": r["entries_per_s"],
            "appends_per_s": r["appends_per_s"],
            "mb_per_s": r["mb_per_s"],
            "p50_ms": r["latency_ms"]["p50"],
            "p99_ms": r["latency_ms"]["p99"],
            "load1": round(load, 2),
            "command": shlex.join(["rlog", *bench]) + f"  # leader of {where}",
        }
    )
    keep_cdf = series == "serial" or (writers == max(args.writers) and batch == 1)
    if keep_cdf and size == 1024 and replicas == 3:
        ms = [float(line.split()[2]) for line in trace.read_text().splitlines() if line]
        run.add(cdf_record(point, quantiles(ms)))
    trace.unlink(missing_ok=True)


# ---- catch-up and Spark --------------------------------------------------------------------


def catchup_step(run: Run, args: argparse.Namespace) -> None:
    # A wiped follower's catch-up, then the same log size missed by a follower that kept its
    # data: its pull (no target).
    steps = [
        ("catchup", [], "catch-up of a wiped follower"),
        ("rejoin", ["--rejoin"], "a stopped follower's pull of what it missed"),
    ]
    for kind, flags, what in steps:
        note(f"{what} ({args.catchup_mb} MB of 4 KiB entries)")
        cmd = [args.python, str(BENCH / "catchup.py"), *flags, "--megabytes", str(args.catchup_mb)]
        cmd += ["--dir", str(Path(args.work) / "catchup")]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        r = json.loads(out.splitlines()[-1])
        shown = shlex.join(
            ["python", "bench/catchup.py", *flags, "--megabytes", str(args.catchup_mb)]
        )
        run.add({"kind": kind, **r, "command": shown, "load1": round(os.getloadavg()[0], 2)})


def failover_step(run: Run, args: argparse.Namespace) -> None:
    """The leader SIGKILLed under a serial writer, `kills` times (bench/failover.py): from
    the kill to the acknowledgement of the first append sent after it."""
    kills = 5 if args.quick else 20
    note(f"failover: the leader killed {kills} times under a serial writer")
    cmd = [args.python, str(BENCH / "failover.py"), "--kills", str(kills), "--dir", args.work]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=1800).stdout
    r = json.loads(out.splitlines()[-1])
    shown = shlex.join(["python", "bench/failover.py", "--kills", str(kills)])
    run.add({"kind": "failover", **r, "command": shown, "load1": round(os.getloadavg()[0], 2)})


SPARK_LINE = re.compile(r"^(?P<what>.+?)\s+(?P<rows>\d+) rows\s+(?P<s>[\d.]+) s\s+(?P<rate>[\d,]+)")


def parse_spark(text: str) -> dict[str, float]:
    """rows/s per measurement from bench/spark_source.py's output lines."""
    rates = {}
    for line in text.splitlines():
        m = SPARK_LINE.match(line)
        if m:
            rates[m["what"].strip()] = float(m["rate"].replace(",", ""))
    return rates


def spark_step(run: Run, args: argparse.Namespace) -> None:
    note(f"Spark source and sink ({args.spark_rows} rows of 100 B)")
    cmd = [args.python, str(BENCH / "spark_source.py"), "--entries", str(args.spark_rows)]
    # Each source query twice: its first run (the target figure, as a one-off query meets it)
    # and the best of both (figure spark_source_noop_warm: the JVM's JIT warmed up, which
    # helps Spark's JVM-only baseline more than the rlog source). The sink once, warm.
    cmd += ["--repeat", "2", "--sink-repeat", "1", "--partitions", "3"]
    cmd += ["--sink-rows", str(args.spark_sink_rows)]
    cmd += ["--dir", str(Path(args.work) / "spark")]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    shutil.rmtree(Path(args.work) / "spark", ignore_errors=True)
    shown = shlex.join(["python", "bench/spark_source.py", *cmd[2:-2]])
    run.add({"kind": "spark", "rates": parse_spark(out), "command": shown})


# ---- figures ---------------------------------------------------------------------------


def figures(run: Run, args: argparse.Namespace) -> None:
    targets = load_targets(BENCH / "targets.json")
    points = run.points()
    big = max(args.writers)

    def rlog(**m: Any) -> dict[str, Any] | None:
        return find_point(points, system="rlog", **m)

    def etcd(**m: Any) -> dict[str, Any] | None:
        return find_point(points, system="etcd", **m)

    def value(p: dict[str, Any] | None, key: str) -> float | None:
        return None if p is None else p[key]

    def command(p: dict[str, Any] | None) -> str | None:
        return None if p is None else p["command"]

    # The host's ceilings (step 0), in the figures' units, and what each is.
    machine = next((r for r in run.records if r["kind"] == "machine"), {})
    ceilings: dict[str, tuple[float, str]] = {}
    if "sync_ms_p50" in machine:
        sync = (
            machine["sync_ms_p50"],
            "one 4 KiB append's fdatasync p50 on the same volume (the least a durable append "
            "can take)",
        )
        three = machine["synced_mb_per_s_new_pieces"]
        per_three = "each of three writers' synced 2 MiB writes in 1 MiB calls to new file space"
        ceilings |= {
            "serial_p50": sync,
            "serial_p50_unary": sync,
            "serial_p50_grpc": sync,
            "batched_1k": (
                three * 1e6 / 1024,
                f"{per_three} ({three:,.0f} MB/s), in 1 KiB entries",
            ),
            "batched_4k_mb": (three, per_three),
            "catchup_mb": (machine["synced_mb_per_s_one"], "one writer's synced 2 MiB writes"),
            "catchup_copy_mb": (machine["synced_mb_per_s_one"], "one writer's synced 2 MiB writes"),
        }

    def add(name: str, what: str, unit: str, ours: Any, theirs: Any, key: str, **kw: Any) -> None:
        base_name = kw.pop("baseline_name", "etcd 3.4" if theirs is not None else None)
        run.add(
            figure(
                name,
                what,
                unit,
                value(ours, key),
                value(theirs, key),
                base_name,
                kw.pop("better", "higher"),
                command(ours),
                command(theirs),
                targets,
                *ceilings.get(name, (None, None)),
            )
        )

    etcd_big = etcd(series="put", writers=big, size=1024)
    add(
        "unary_writers",
        f"{big} single-entry writers, the default client (one append each, on the lane)",
        "entries/s",
        rlog(series="unary", writers=big, size=1024, replicas=3),
        etcd_big,
        "entries_per_s",
    )
    add(
        "stream_writers",
        f"{big} single-entry writers, stream client",
        "entries/s",
        rlog(series="stream", writers=big, size=1024, replicas=3),
        etcd_big,
        "entries_per_s",
    )
    for key, label in (("p50_ms", "p50"), ("p99_ms", "p99")):
        add(
            f"serial_{label}",
            f"serial append {label} latency (the client's append lane)",
            "ms",
            rlog(series="serial", replicas=3),
            etcd(series="serial"),
            key,
            better="lower",
        )
    add(
        "serial_p50_unary",
        "serial append p50 latency, one gRPC call each (no client lane)",
        "ms",
        rlog(series="serial_unary", replicas=3),
        etcd(series="serial"),
        "p50_ms",
        better="lower",
    )
    add(
        "batched_1k",
        f"batched 64 x 1 KiB per call, 8 writers, the client's append lane, fresh log (etcd: "
        f"{big} single-put writers)",
        "entries/s",
        rlog(series="batched_fresh", size=1024, replicas=3),
        etcd_big,
        "entries_per_s",
    )
    add(
        "batched_1k_unary",
        "the same with one gRPC call per append (no client lane), on a fresh log of its own",
        "entries/s",
        rlog(series="batched_fresh_unary", size=1024, replicas=3),
        etcd_big,
        "entries_per_s",
    )
    add(
        "batched_4k_mb",
        f"batched 64 x 4 KiB per call, 8 writers, fresh log (etcd: {big} single-put writers "
        "of 4 KiB)",
        "MB/s",
        rlog(series="batched_fresh", size=4096, replicas=3),
        etcd(series="put", writers=big, size=4096),
        "mb_per_s",
    )
    add(
        "batched_1k_grown",
        "the same at 1 KiB on the log of the sweeps (gigabytes written before it)",
        "entries/s",
        rlog(series="batched", size=1024, replicas=3),
        etcd_big,
        "entries_per_s",
    )
    add(
        "batched_4k_mb_grown",
        "the same at 4 KiB on the log of the sweeps",
        "MB/s",
        rlog(series="batched", size=4096, replicas=3),
        etcd(series="put", writers=big, size=4096),
        "mb_per_s",
    )
    add(
        "serial_p50_grpc",
        "serial append p50 latency, no lanes: one gRPC call each, the leader's writes on the "
        "gRPC stream",
        "ms",
        rlog(series="serial_grpc", replicas=3),
        etcd(series="serial"),
        "p50_ms",
        better="lower",
    )
    add(
        "stream_writers_grpc",
        f"{big} single-entry writers, stream client, no write lane",
        "entries/s",
        rlog(series="stream_grpc", writers=big, replicas=3),
        etcd_big,
        "entries_per_s",
    )
    add(
        "batched_1k_grpc",
        "batched 64 x 1 KiB per call, 8 writers, fresh log, no write lane",
        "entries/s",
        rlog(series="batched_grpc", size=1024, replicas=3),
        etcd_big,
        "entries_per_s",
    )
    add(
        "replicas_5_vs_3_batched",
        "5 replicas vs 3, batched 64 x 1 KiB, 8 writers, fresh logs both",
        "entries/s",
        rlog(series="batched_fresh", size=1024, replicas=5),
        rlog(series="batched_fresh", size=1024, replicas=3),
        "entries_per_s",
        baseline_name="rlog, 3 replicas",
    )
    add(
        "replicas_5_vs_3_stream",
        f"5 replicas vs 3, {big} single-entry writers, stream client",
        "entries/s",
        rlog(series="stream", writers=big, replicas=5),
        rlog(series="stream", writers=big, replicas=3),
        "entries_per_s",
        baseline_name="rlog, 3 replicas",
    )
    catchup = next((r for r in run.records if r["kind"] == "catchup"), None)
    if catchup is not None:
        run.add(
            figure(
                "catchup_mb",
                f"EMPTY (wiped) follower catch-up, {catchup['megabytes']} MB of 4 KiB entries",
                "MB/s",
                catchup["catchup_mb_per_s"],
                None,
                None,
                "higher",
                catchup["command"],
                targets=targets,
                ceiling=ceilings.get("catchup_mb", (None,))[0],
                ceiling_name=ceilings.get("catchup_mb", (None, None))[1],
            )
        )
        if catchup.get("copy_mb_per_s"):
            # The copy alone (from the replica's "catching up" to its turn to VOTING), without
            # the process start that end to end includes: what the replica's copy path does.
            run.add(
                figure(
                    "catchup_copy_mb",
                    f"EMPTY follower catch-up, copy phase only, {catchup['megabytes']} MB",
                    "MB/s",
                    catchup["copy_mb_per_s"],
                    None,
                    None,
                    "higher",
                    catchup["command"],
                    targets=targets,
                    ceiling=ceilings.get("catchup_copy_mb", (None,))[0],
                    ceiling_name=ceilings.get("catchup_copy_mb", (None, None))[1],
                )
            )
    failover = next((r for r in run.records if r["kind"] == "failover"), None)
    if failover is not None:
        run.add(
            figure(
                "failover_p99",
                f"the leader SIGKILLed under a serial writer, {failover['kills']} times: kill to "
                "the first acknowledged append sent after it, p99",
                "s",
                failover["p99_s"],
                None,
                None,
                "lower",
                failover["command"],
                targets=targets,
            )
        )
    rejoin = next((r for r in run.records if r["kind"] == "rejoin"), None)
    if rejoin is not None:
        run.add(
            figure(
                "rejoin_mb",
                f"a follower stopped while {rejoin['megabytes']} MB were appended, restarted "
                "with its data: its pull until it has learned them",
                "MB/s",
                rejoin["catchup_mb_per_s"],
                None,
                None,
                "higher",
                rejoin["command"],
                targets=targets,
            )
        )
    spark = next((r for r in run.records if r["kind"] == "spark"), None)
    if spark is not None:
        rates = spark["rates"]
        run.add(
            figure(
                "spark_source_noop",
                f"Spark batch source, {args.spark_rows} x 100 B into noop",
                "rows/s",
                rates.get("rlog source, 3 partitions -> noop, first run"),
                rates.get("JVM spark.range + 100 B binary -> noop, first run"),
                "Spark JVM spark.range",
                "higher",
                spark["command"],
                spark["command"] + "  # same session",
                targets,
            )
        )
        run.add(
            figure(
                "spark_source_noop_warm",
                "the same, best of each query's two runs (the JIT warm; no target)",
                "rows/s",
                rates.get("rlog source, 3 partitions -> noop"),
                rates.get("JVM spark.range + 100 B binary -> noop"),
                "Spark JVM spark.range, best of 2",
                "higher",
                spark["command"],
                spark["command"] + "  # same session",
                targets,
            )
        )
        sink = next((v for k, v in rates.items() if k.startswith("sink:")), None)
        run.add(
            figure(
                "spark_sink",
                f"Spark sink, {args.spark_sink_rows} x 100 B (2 tasks)",
                "rows/s",
                sink,
                None,
                None,
                "higher",
                spark["command"],
                targets=targets,
            )
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs, no Spark")
    parser.add_argument("--seconds", type=float, help="each timed run (default 8, quick 3)")
    parser.add_argument("--serial", type=int, help="serial appends/puts (default 1000, quick 300)")
    parser.add_argument("--writers", type=csv_ints, default=[1, 4, 16, 64])
    parser.add_argument("--sizes", type=csv_ints, default=[128, 1024, 4096, 16384])
    parser.add_argument("--catchup-mb", type=float, help="catch-up log size (200, quick 20)")
    parser.add_argument("--no-etcd", action="store_true", help="rlog only")
    parser.add_argument("--no-five", action="store_true", help="skip the 5-replica runs")
    spark = parser.add_mutually_exclusive_group()
    spark.add_argument("--spark", action="store_true", help="run Spark even in --quick")
    spark.add_argument("--no-spark", action="store_true")
    parser.add_argument("--spark-rows", type=int, default=1_000_000)
    parser.add_argument("--spark-sink-rows", type=int, default=200_000)
    parser.add_argument("--out", help="results file (default bench/results/bench-<date>.jsonl)")
    parser.add_argument("--work", default=str(Path.home() / ".cache/rlog-bench/kit"))
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument(
        "--volume",
        default="the host's disk",
        help="what --work is on, for the summary (bench/slow_disk.sh: a slowed volume)",
    )
    args = parser.parse_args()
    args.seconds = args.seconds or (3.0 if args.quick else 8.0)
    args.serial = args.serial or (300 if args.quick else 1000)
    args.catchup_mb = args.catchup_mb or (20.0 if args.quick else 200.0)
    if 1024 not in args.sizes or 4096 not in args.sizes:
        parser.error("--sizes must include 1024 and 4096 (figures of the targets table)")
    if not args.no_etcd and (taken := etcd_ports_taken()):
        parser.error(
            f"ports {', '.join(map(str, taken))} (the baseline etcd's) are in use: stop what "
            "listens there first (an etcd of bench/etcd_cluster.sh: `bench/etcd_cluster.sh "
            "stop`), or run with --no-etcd"
        )
    with_spark = args.spark or (
        not args.no_spark and not args.quick and importlib.util.find_spec("pyspark") is not None
    )

    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    out = Path(args.out) if args.out else BENCH / "results" / f"bench-{stamp}.jsonl"
    Path(args.work).mkdir(parents=True, exist_ok=True)
    run = Run(out)
    started = time.monotonic()
    meta = {
        "kind": "meta",
        "run": out.stem,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_start": [round(x, 2) for x in os.getloadavg()],
        "commit": git_commit(),
        "mode": "quick" if args.quick else "full",
        "seconds": args.seconds,
        "serial": args.serial,
        "writers": args.writers,
        "sizes": args.sizes,
        "catchup_mb": args.catchup_mb,
        "spark": with_spark,
        "volume": args.volume,
        "command": shlex.join(["python", "bench/kit.py", *sys.argv[1:]]),
    }
    run.add(meta)
    note(f"results -> {out}")
    host_probe(run, args)
    batched_on_fresh_logs(run, args)
    side_by_side(run, args)
    grpc_stream_step(run, args)
    if not args.no_five:
        five_replicas(run, args)
    catchup_step(run, args)
    failover_step(run, args)
    if with_spark:
        spark_step(run, args)
    figures(run, args)
    run.add(
        {
            "kind": "end",
            "load_end": [round(x, 2) for x in os.getloadavg()],
            "wall_seconds": round(time.monotonic() - started, 1),
        }
    )
    end = run.records[-1]
    summary = summary_markdown([{**meta, **end, "kind": "meta"}, *run.records[1:]])
    out.with_suffix(".md").write_text(summary)
    print(summary)
    note(f"results in {out} and {out.with_suffix('.md')}; plots: python bench/plots.py {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
