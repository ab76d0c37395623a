"""Archive throughput and restore time (docs/backup.md), on real processes: a DevCluster
(3 replicas, default engine) filled with MB megabytes of values, a versitygw server started by
e2e/s3/s3.sh, then

1. `rlog archive run --once` (a fresh archive of the whole log): MB/s of values archived;
2. `rlog restore` of the whole archive into 3 fresh data dirs: seconds, and MB/s;
3. `rlog restore --verify-only` (download and check every segment, write nothing).

Each step is a separate `rlog` process timed from outside (wall clock), so the figures
include process start-up (about a second). Prints one JSON line per step.

    .venv/bin/python bench/archive_bench.py --mb 256 --value-size 4096
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from s3server import S3Server  # noqa: E402

from rlog.tools.dev import DevCluster  # noqa: E402

RLOG = [sys.executable, "-m", "rlog.tools.cli"]


def timed(env: dict[str, str], *args: str) -> tuple[float, str]:
    t = time.monotonic()
    done = subprocess.run([*RLOG, *args], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"rlog {' '.join(args[:2])} failed: {done.stderr}")
    return time.monotonic() - t, done.stdout


def fill(cluster: DevCluster, mb: int, value_size: int) -> int:
    value = os.urandom(value_size)
    per_call = max(1, (1 << 20) // value_size)  # 1 MiB per append call
    written = 0
    with cluster.client() as client:
        while written < mb << 20:
            client.append([value] * per_call)
            written += per_call * value_size
    return written


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--value-size", type=int, default=4096)
    parser.add_argument("--segment-bytes", type=int, default=8 << 20)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="rlog-archive-bench-"))
    s3 = S3Server.start(root / "s3")
    env = s3.env()
    bucket = s3.new_bucket()
    try:
        with DevCluster(3, root / "log", election_timeout=1.0) as cluster:
            t = time.monotonic()
            written = fill(cluster, args.mb, args.value_size)
            fill_s = time.monotonic() - t
            mb = written / 1e6
            print(json.dumps({"step": "fill", "mb": round(mb, 1), "seconds": round(fill_s, 1)}))
            seconds, out = timed(
                env, "archive", "run", "--once", "-e", cluster.endpoint, "--bucket", bucket,
                "--prefix", "bench", "--segment-bytes", str(args.segment_bytes), "--json",
            )  # fmt: skip
            summary = json.loads(out)
            print(json.dumps({"step": "archive", "mb": round(mb, 1), "seconds": round(seconds, 1),
                              "mb_per_s": round(mb / seconds, 1), "segments": summary["segments"],
                              "object_mb": round(summary["bytes"] / 1e6, 1)}))  # fmt: skip
        seconds, _ = timed(env, "restore", "--bucket", bucket, "--prefix", "bench",
                           "--verify-only", "--json")  # fmt: skip
        print(json.dumps({"step": "verify", "seconds": round(seconds, 1),
                          "mb_per_s": round(mb / seconds, 1)}))  # fmt: skip
        dirs = [root / "restored" / f"replica-{i}" / "data" for i in range(3)]
        for d in dirs:
            d.parent.mkdir(parents=True, exist_ok=True)
        dir_args = [a for d in dirs for a in ("--data-dir", str(d))]
        seconds, _ = timed(env, "restore", "--bucket", bucket, "--prefix", "bench", *dir_args)
        print(json.dumps({"step": "restore-3-dirs", "seconds": round(seconds, 1),
                          "mb_per_s": round(mb / seconds, 1),
                          "seconds_per_gb": round(seconds * 1000 / mb, 1)}))  # fmt: skip
    finally:
        s3.stop()


if __name__ == "__main__":
    main()
