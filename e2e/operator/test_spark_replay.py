"""examples/spark_replay.py against a ReplicatedLog on Kubernetes, through a
`kubectl port-forward` of the log's client Service (works on the local cluster and on kind).

Batch mode writes the whole log to Parquet; stream mode (availableNow, a checkpoint) adds
only what is new on each run. The Parquet output is compared with `rlog read`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pyarrow.parquet as pq
import pytest
from e2elib import wait_until
from oplib import Log, created_log, port_forward

NAME = "spark-log"
EXAMPLE = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "examples",
    "spark_replay.py",
)


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME, settle=True) as log:
        yield log


_PORT_FORWARDS: list[subprocess.Popen[str]] = []


@pytest.fixture(scope="module")
def forwarded(log: Log) -> Iterator[str]:
    """127.0.0.1:PORT forwarded to the client Service."""
    with port_forward(log.k, f"svc/{NAME}") as forward:
        _PORT_FORWARDS.append(forward.proc)
        yield forward.endpoint
        _PORT_FORWARDS.remove(forward.proc)


def _replay(endpoint: str, out: str, *extra: str, env: dict[str, str] | None = None) -> str:
    try:
        p = subprocess.run(
            [sys.executable, EXAMPLE, "--endpoints", endpoint, "--out", out, *extra],
            capture_output=True,
            text=True,
            # Inside the test's own 1,200 s, so that a replay that hangs shows what it said (a
            # kind run's second stream replay hung past 300 s once; nothing was left to read).
            # 360 s: in a cold `make test` (two e2e workers, the unit suite's JVMs beside, the
            # replicas' probes timing out) the first replay was still starting at 180 s.
            timeout=360,
            env={**os.environ, **(env or {})},  # the log's TLS credentials (RLOG_*), if any
        )
    except subprocess.TimeoutExpired as exc:
        said = [_text(exc.stdout)[-2000:], _text(exc.stderr)[-6000:]]
        forwards = [f"port-forward pid {f.pid} exit code {f.poll()}" for f in _PORT_FORWARDS]
        message = f"the replay did not end in 360 s ({forwards}):\n" + "\n".join(said)
        raise AssertionError(message) from None
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
    return p.stdout


def _text(output: str | bytes | None) -> str:
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def _parquet(path: str) -> list[tuple[int, str]]:
    table = pq.read_table(path, columns=["position", "value"])
    rows = zip(table.column("position").to_pylist(), table.column("value").to_pylist(), strict=True)
    return sorted((int(p), bytes(v).decode()) for p, v in rows)


@pytest.mark.timeout(1200)
def test_replay_batch_and_stream_through_a_port_forward(log: Log, forwarded: str, tmp_path) -> None:
    first = [f"spark-{i}" for i in range(3000)]
    log.append(first)
    expected = log.entries(f"{NAME}-1", log.service, stale=False)
    assert [v for _, v in expected][-len(first) :] == first
    env = log.client_env(str(tmp_path))  # a log is mutual TLS by default

    t0 = time.monotonic()
    print(_replay(forwarded, str(tmp_path / "batch"), "--partitions", "3", env=env).strip())
    print(f"batch replay took {time.monotonic() - t0:.1f}s")
    assert _parquet(str(tmp_path / "batch")) == expected

    stream = str(tmp_path / "stream")
    out = _replay(forwarded, stream, "--stream", "--max-entries", "1000", env=env)
    print(out.strip())
    assert _parquet(os.path.join(stream, "data")) == expected

    more = [f"spark-more-{i}" for i in range(500)]
    log.append(more)
    expected = wait_until(
        "the new entries to be readable",
        lambda: (e := log.entries(f"{NAME}-2", log.service, stale=False))[-1][1] == more[-1] and e,
        60,
    )
    out = _replay(forwarded, stream, "--stream", env=env)
    print(out.strip())
    assert f"added {len(more)} entries" in out, out
    got = _parquet(os.path.join(stream, "data"))
    assert len(got) == len({p for p, _ in got}), "an entry replayed twice"
    assert got == expected
