"""Where a batched run's CPU goes below Python: `perf record` of the leader and of a follower
of a fresh 3-replica log while `rlog bench` runs the kit's batched shape, then the leaf
functions (C, kernel) by share of samples and the callers of the copies (memcpy, and the
kernel's copies to and from user space).

    .venv/bin/python bench/perf_split.py [--size 4096] [--seconds 4] [--out DIR]

py-spy (`bench/pyspy_profile.py`) sees Python frames; this sees what they spend in C: a
copy made by protobuf, uvloop or the kernel shows with its caller chain (DWARF unwinding,
`--call-graph dwarf`). The shape is `make bench`'s: write lanes, every append on the
client's append lane, 8 writers x 64 values per call. Needs `perf` (Debian's linux-perf)
and root or perf_event_paranoid <= 1. Writes OUT/{leader,follower}.data and .txt (perf
script, tens of MB: kept out of the repository) and prints the summary (docs/performance.md,
"What each change bought": fewer copies, bookkeeping reads run heads).
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from rlog.tools.dev import DevCluster  # noqa: E402

COPIES = r"memmove|memcpy|_copy_to_iter|_copy_from_iter|copy_page_to_iter"


def stacks(path: Path) -> Iterator[list[str]]:
    """The call stacks of `perf script` output, leaf first, as function names."""
    stack: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            if stack:
                yield stack
            stack = []
        elif line[0] in " \t":
            parts = line.strip().split(None, 1)
            if len(parts) == 2:
                name = parts[1].rsplit(" (", 1)[0]
                stack.append(re.sub(r"\+0x[0-9a-f]+$", "", name))
    if stack:
        yield stack


def summary(path: Path, top: int = 12) -> list[str]:
    leaves: collections.Counter[str] = collections.Counter()
    copies: collections.Counter[str] = collections.Counter()
    total = 0
    for stack in stacks(path):
        total += 1
        leaves[stack[0]] += 1
        if re.search(COPIES, stack[0]):
            callers = [f for f in stack[1:] if "inlined" not in f][:4]
            copies[" < ".join(callers)] += 1
    lines = [f"{total} samples; leaf functions:"]
    lines += [f"  {n / total:6.1%}  {name[:100]}" for name, n in leaves.most_common(top)]
    lines.append("copies by caller (leaf: memcpy/memmove or the kernel's user copies):")
    lines += [f"  {n / total:6.1%}  {chain[:160]}" for chain, n in copies.most_common(top)]
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=4096, help="bytes per value")
    parser.add_argument("--seconds", type=float, default=4.0, help="recording time")
    parser.add_argument("--out", help="default ~/.cache/rlog-bench/perf-<date> (tens of MB)")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf is not installed (Debian: apt-get install linux-perf)")
    stamp = time.strftime("%Y%m%d-%H%M", time.gmtime())
    out = Path(args.out) if args.out else Path.home() / ".cache/rlog-bench" / f"perf-{stamp}"
    out.mkdir(parents=True, exist_ok=True)
    base = Path.home() / ".cache/rlog-bench"
    base.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="perf-split-", dir=base))
    bench = [sys.executable, "-m", "rlog.tools.cli", "bench", "--json", "--lane"]
    bench += ["--size", str(args.size), "--mode", "concurrent", "--concurrency", "8"]
    bench += ["--batch", "64", "--warmup", "20", "--duration", str(args.seconds + 4)]
    try:
        with DevCluster(3, root, write_lane_offset=1) as cluster:
            leader = cluster.wait_for_leader()
            follower = next(i for i in range(3) if i != leader)
            running = subprocess.Popen(
                [*bench, "--endpoint", cluster.endpoints[leader]], stdout=subprocess.PIPE
            )
            time.sleep(2)  # past the warm-up
            records = []
            for role, i in (("leader", leader), ("follower", follower)):
                cmd = ["perf", "record", "-q", "--call-graph", "dwarf,16384", "-F", "499"]
                cmd += ["-p", str(cluster.pid(i)), "-o", str(out / f"{role}.data")]
                cmd += ["--", "sleep", str(args.seconds)]
                records.append(subprocess.Popen(cmd, stderr=subprocess.DEVNULL))
            for record in records:
                record.wait()
            result = json.loads(running.communicate()[0])
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"{args.size} B values: {result['entries_per_s']:,.0f} entries/s while recording")
    for role in ("leader", "follower"):
        text = out / f"{role}.txt"
        with text.open("w") as script:
            subprocess.run(
                ["perf", "script", "-i", str(out / f"{role}.data")],
                stdout=script,
                stderr=subprocess.DEVNULL,
                check=True,
            )
        print(f"[{role}] " + "\n".join(summary(text)))
    print(f"perf data and scripts in {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
