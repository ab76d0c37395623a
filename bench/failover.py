"""How long a writer waits when the leader dies: `python bench/failover.py [--kills 20]`.

A real 3-replica log (`rlog dev` processes with write lanes, as the operator deploys them,
data on the real disk) and one writer appending 1 KiB values one at a time through every
endpoint with the default client (the append lane, exactly-once sessions), as an
application does. Each round SIGKILLs the leader and times from the kill to the
acknowledgement of the writer's first append sent once the leader had died: the election,
the client finding the new leader and the append itself (an append the dead leader
answered on its way out is not a failover). The killed replica is then started again and
the next round waits until it is VOTING and a leader leads. At the end every acknowledged
value is read back (`missing` must be 0). Prints one JSON object: every round's seconds,
p50, p99 and the maximum.

The kit (bench/kit.py) runs it as the figure `failover_p99`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(HERE / "replica_image"))

from rlog.client import Client  # noqa: E402
from rlog.client.errors import RlogError  # noqa: E402
from rlog.proto import rlog_pb2 as pb  # noqa: E402
from rlog.tools.dev import DevCluster  # noqa: E402

SETTLE = 1.0  # seconds of appends before each kill, once every replica is VOTING


def quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(directory: Path, kills: int) -> dict[str, Any]:
    with DevCluster(3, directory, write_lane_offset=1) as cluster:
        cluster.wait_for_leader()
        # (sent, acknowledged: monotonic times), position, value
        acked: list[tuple[float, float, int, bytes]] = []
        failed = 0
        stop = threading.Event()

        def write() -> None:
            nonlocal failed
            value = os.urandom(1024)
            with Client(cluster.addresses, timeout=5.0) as client:
                n = 0
                while not stop.is_set():
                    data = n.to_bytes(8, "big") + value[8:]
                    n += 1
                    sent = time.monotonic()
                    try:
                        (position,) = client.append([data])
                    except RlogError:
                        failed += 1  # outcome unknown or no leader yet: the next one goes on
                        continue
                    acked.append((sent, time.monotonic(), position, data))

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        seconds: list[float] = []
        try:
            for _ in range(kills):
                cluster.wait_for(
                    lambda found: all(s is not None and s.status == pb.VOTING for s in found),
                    what="every replica VOTING",
                )
                time.sleep(SETTLE)
                leader = cluster.wait_for_leader()
                killed_at = time.monotonic()
                cluster.kill(leader, signal.SIGKILL)  # returns once the process is gone
                dead_at = time.monotonic()
                while not any(sent > dead_at for sent, _, _, _ in acked[-50:]):
                    if time.monotonic() > dead_at + 60:
                        raise RlogError("no append acknowledged within 60 s of the kill")
                    time.sleep(0.001)
                first = next(at for sent, at, _, _ in acked if sent > dead_at)
                seconds.append(first - killed_at)
                cluster.start_replica(leader)
        finally:
            stop.set()
            writer.join(timeout=30)
        with Client(cluster.addresses) as reader:
            stored = {e.position: e.value for e in reader.read(from_=acked[0][2])}
        missing = sum(1 for _, _, position, data in acked if stored.get(position) != data)
    return {
        "kills": kills,
        "seconds": [round(s, 3) for s in seconds],
        "p50_s": round(quantile(seconds, 0.5), 3),
        "p99_s": round(quantile(seconds, 0.99), 3),
        "max_s": round(max(seconds), 3),
        "acked": len(acked),
        "failed_tries": failed,
        "missing": missing,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--dir", type=Path, help="cluster dir (default: a new temporary dir)")
    args = parser.parse_args(argv)
    if args.kills < 1:
        parser.error("--kills must be at least 1")
    with tempfile.TemporaryDirectory(prefix="rlog-failover-", dir=args.dir) as tmp:
        result = run(Path(tmp), args.kills)
    print(json.dumps(result), flush=True)
    return 0 if result["missing"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
