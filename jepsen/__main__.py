"""`python -m jepsen`: seeded runs against real replicas, each judged, then totals.

Exit status 0 when every run's history is linearizable and every direct check passes, 1
when any run shows a violation, 2 on a usage error. With `--expect-violation`: 0 when some
run shows a violation (with `--unsafe-no-read-index`, the replicas serve reads the way they
did before the read index, and `partition-leader` must catch it; with `--unsafe-split-fill`,
they settle batches position by position in a fill, and `split-batch` must catch a torn
batch; with `--unsafe-no-dedupe`, leaders append a retried session append again, and the
leader faults must catch a value appended twice; with `--unsafe-no-sync`, the replicas skip
each batch's fdatasync, and `power-loss-all` must catch an acknowledged append lost; see
docs/jepsen.md).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from jepsen import disk, linearizability, network, powerfs
from jepsen.nemesis import GROUPS, KINDS, PARTITIONS, POWER, expand
from jepsen.run import MIXES, UNSAFE_SPLIT_FILL_ENV, RunConfig, RunResult, run_once
from rlog.config import UNSAFE_NO_DEDUPE_ENV, UNSAFE_NO_READ_INDEX_ENV

DEFAULT_NEMESIS = "mix"


def _span(text: str) -> tuple[float, float]:
    low, _, high = text.partition(":")
    try:
        span = (float(low), float(high or low))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not MIN:MAX (seconds)") from None
    if not 0 <= span[0] <= span[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= MIN <= MAX")
    return span


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m jepsen", description=__doc__)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20.0, help="load per run (default 20)")
    p.add_argument("--seed", type=int, default=1, help="run k uses seed SEED+k")
    p.add_argument(
        "--clients", type=int, default=3, help="appending clients; client i uses replica i mod N"
    )
    p.add_argument(
        "--readers", type=int, default=3, help="reading clients; reader i uses replica i mod N"
    )
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument(
        "--mix",
        choices=sorted(MIXES),
        default="all",
        help="the writers' operation kinds: all (default: plain, idempotent, if-next and "
        "epoch-fenced appends, linearizable and min_position reads), plain (plain appends, "
        "linearizable reads), idempotent (every append through a session)",
    )
    p.add_argument(
        "--nemesis",
        default=DEFAULT_NEMESIS,
        help=f"comma-separated kinds, 'mix' (every kind but split-batch, the power cuts and "
        f"the disk faults; the partitions only with root), 'disk' (every disk fault: "
        f"{', '.join(disk.DISK)}), or 'none' (kinds: {', '.join(KINDS)})",
    )
    p.add_argument(
        "--hold",
        type=_span,
        default=(3.0, 6.0),
        metavar="MIN:MAX",
        help="how long a fault lasts, seconds (default 3:6; an election takes ~2 s)",
    )
    p.add_argument(
        "--interval",
        type=_span,
        default=(1.0, 3.0),
        metavar="MIN:MAX",
        help="healthy time before each fault, seconds (default 1:3)",
    )
    p.add_argument(
        "--read-timeout",
        type=float,
        default=3.0,
        metavar="SECONDS",
        help="a read's deadline (default 3; longer than a pause lets reads queue at it)",
    )
    p.add_argument("--election-timeout", type=float, default=None, metavar="SECONDS")
    p.add_argument(
        "--write-lane-offset",
        type=int,
        default=0,
        metavar="N",
        help="the replicas' write lane at port + N (rlog replica --write-lane-offset; "
        "default 0: the leader's writes on the gRPC stream)",
    )
    p.add_argument(
        "--client-lane",
        action="store_true",
        help="clients append on the replicas' append lane (needs --write-lane-offset N; "
        "default: one gRPC call each)",
    )
    p.add_argument(
        "--catchup-rate",
        type=int,
        default=0,
        metavar="BYTES",
        help="cap the replicas' catch-ups and pulls at BYTES per second (rlog replica "
        "--catchup-rate; default 0: no cap), so that a wiped or lagging replica copies for "
        "seconds while other faults come",
    )
    p.add_argument(
        "--unsafe-no-read-index",
        action="store_true",
        help="TEST ONLY: replicas serve non-stale reads without confirming leadership and "
        "leaders never step down by check-quorum (the bug those fix), to show that the "
        "suite catches it",
    )
    p.add_argument(
        "--unsafe-split-fill",
        action="store_true",
        help="TEST ONLY: replicas settle a batch position by position in a fill (as before "
        "atomic batches; RLOG_UNSAFE_SPLIT_FILL=1), so split-batch can tear a batch",
    )
    p.add_argument(
        "--unsafe-no-dedupe",
        action="store_true",
        help="TEST ONLY: leaders append a retried session append again instead of answering "
        "it with its positions (RLOG_UNSAFE_NO_DEDUPE=1), so a retry can duplicate a value",
    )
    p.add_argument(
        "--unsafe-no-sync",
        action="store_true",
        help="TEST ONLY: replicas skip the fdatasync of each batch (RLOG_UNSAFE_NO_SYNC=1), "
        "so a power cut (power-loss-*) loses what they acknowledged",
    )
    p.add_argument(
        "--expect-violation",
        action="store_true",
        help="succeed iff some run shows a violation (with an --unsafe-* switch)",
    )
    p.add_argument("--out", type=Path, help="results dir (default ~/.cache/rlog-jepsen/runs/...)")
    p.add_argument("--inside", help=argparse.SUPPRESS)  # TAG:NET, set when re-executed
    args = p.parse_args(argv)
    if args.client_lane and not args.write_lane_offset:
        p.error("--client-lane needs --write-lane-offset N (the replicas' lane)")
    if args.catchup_rate < 0:
        p.error("--catchup-rate must be 0 (no cap) or positive")
    return args


def summarize(results: list[RunResult], wall: float) -> str:
    checks_s = [r.verdict.seconds for r in results if r.verdict is not None]
    violations = [r for r in results if r.violation]
    kinds: Counter[str] = Counter()
    for r in results:
        kinds.update(r.faults_by_kind)
    skipped = sum(r.skipped for r in results)
    exited = sum(r.exited for r in results)
    lines = [
        "",
        f"runs: {len(results)}   faults injected: {sum(r.faults for r in results)}   "
        f"operations: {sum(r.recorded for r in results)}   "
        f"operations checked: {sum(r.operations for r in results)}   "
        f"violations: {len(violations)}   run errors: {sum(1 for r in results if r.error)}",
        "faults by kind: "
        + (", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) or "none")
        + (
            f"   (skipped: {skipped} wipes or disk faults without a VOTING quorum of the others)"
            if skipped
            else ""
        )
        + (f"   (replicas that exited by themselves, restarted: {exited})" if exited else ""),
        f"checker: {sum(checks_s):.3f} s in all, longest {max(checks_s, default=0):.3f} s; "
        f"wall time {wall:.0f} s",
    ]
    for r in results:
        verdict = r.verdict.verdict if r.verdict else "not checked"
        failed = {k: len(v) for k, v in r.problems.items() if v}
        line = (
            f"  seed {r.seed}: {verdict} ({r.operations} ops, {r.faults} faults, "
            f"check {r.verdict.seconds if r.verdict else 0:.3f} s)"
        )
        if failed:
            line += f"; direct checks failed: {failed}"
        if r.first_stale_read_s is not None:
            after = r.first_stale_after_fault_s
            line += f"; first stale read at {r.first_stale_read_s:.1f} s" + (
                f" ({after:.1f} s into a fault)" if after is not None else ""
            )
        if r.error:
            line += f"; error: {r.error}"
        lines.append(line + f"  -> {r.out}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.unsafe_no_read_index:
        # Inherited by the replicas (DevCluster passes the environment on).
        os.environ[UNSAFE_NO_READ_INDEX_ENV] = "1"
    if args.unsafe_split_fill:
        os.environ[UNSAFE_SPLIT_FILL_ENV] = "1"
    if args.unsafe_no_dedupe:
        os.environ[UNSAFE_NO_DEDUPE_ENV] = "1"
    kinds = [] if args.nemesis in ("", "none") else args.nemesis.split(",")
    bad = set(kinds) - {*KINDS, "mix", *GROUPS}
    if bad:
        print(
            f"unknown nemesis {sorted(bad)}; choose from mix, {', '.join(GROUPS)}, "
            f"{', '.join(KINDS)}",
            file=sys.stderr,
        )
        return 2
    kinds = expand(kinds, partitions=args.inside is not None or network.available())
    if disk.DISK_FULL in kinds and os.geteuid() != 0:
        print("disk-full needs root (a small tmpfs under each data dir)", file=sys.stderr)
        return 2
    needs_netns = bool(PARTITIONS & set(kinds))
    if POWER & set(kinds):
        why = powerfs.unavailable()
        if why is not None:
            print(f"power cuts need powerfs (FUSE): {why}", file=sys.stderr)
            return 2
        powerfs.build()  # before entering a namespace (the module proxy is outside)
    out = args.out or Path.home() / ".cache" / "rlog-jepsen" / "runs" / time.strftime(
        "%Y%m%d-%H%M%S"
    )

    if needs_netns and args.inside is None:
        # Partitions: build the namespaces here, run the clients in theirs, always tear down.
        if not network.available():
            print("partitions need root and `ip netns`", file=sys.stderr)
            return 2
        linearizability.build()  # before entering the namespace (the module proxy is outside)
        net = network.Netns(args.replicas)
        try:
            net.create()
            argv_inner = [
                *(sys.argv[1:] if argv is None else argv),
                "--inside",
                f"{net.tag}:{net.net}",
            ]
            argv_inner += ["--out", str(out)] if args.out is None else []
            cmd = [
                "ip",
                "netns",
                "exec",
                net.client_ns,
                sys.executable,
                "-m",
                "jepsen",
                *argv_inner,
            ]
            return subprocess.run(cmd, env=os.environ.copy()).returncode
        finally:
            net.destroy()

    netns = None
    if args.inside is not None:
        tag, net_number = args.inside.split(":")
        netns = network.Netns(args.replicas, tag, int(net_number))
    linearizability.build()
    print(
        f"jepsen: {args.runs} run(s) of {args.seconds:g} s, {args.clients} clients + "
        f"{args.readers} readers, {args.replicas} replicas, nemesis {','.join(kinds) or 'none'}"
        f"{' (network namespaces)' if netns else ''}; results in {out}",
        flush=True,
    )
    started = time.monotonic()
    results = []
    for k in range(args.runs):
        seed = args.seed + k
        config = RunConfig(
            seed=seed,
            seconds=args.seconds,
            nemesis=kinds,
            out=out / f"seed-{seed}",
            clients=args.clients,
            readers=args.readers,
            replicas=args.replicas,
            network=netns,
            election_timeout=args.election_timeout,
            write_lane_offset=args.write_lane_offset,
            client_lane=args.client_lane,
            catchup_rate=args.catchup_rate,
            read_timeout=args.read_timeout,
            hold=args.hold,
            interval=args.interval,
            mix=MIXES[args.mix],
            unsafe_no_sync=args.unsafe_no_sync,
        )
        result = run_once(config)
        verdict = result.verdict.verdict if result.verdict else "not checked"
        print(f"  [seed {seed}] {verdict}", flush=True)
        results.append(result)
    summary = summarize(results, time.monotonic() - started)
    print(summary, flush=True)
    given = sys.argv[1:] if argv is None else argv
    shown = [a for k, a in enumerate(given) if "--inside" not in (a, given[k - 1] if k else "")]
    (out / "summary.txt").write_text(f"python -m jepsen {' '.join(shown)}\n{summary}\n")
    if args.expect_violation:
        found = any(r.violation for r in results)
        errors = any(r.error for r in results)
        print(
            "expected a violation: " + ("found" if found else "NONE FOUND (the suite missed it)"),
            flush=True,
        )
        return 0 if found and not errors else 1
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
