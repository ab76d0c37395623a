"""Spark on Kubernetes: examples/spark_k8s/ for real (`make e2e-spark-k8s`, not `make test`).

The example's ReplicatedLog (mutual TLS, a client identity spark-reader with the read role
that the operator issues into orders-spark-client, a NetworkPolicy admitting the Spark
pods), its RBAC and output volume; then
examples/spark_replay.py submitted with `spark-submit --master k8s://... --deploy-mode
cluster` (driver and 2 executors as pods of docker.io/rlog/rlog-spark:dev, reading the log
through its client Service):

- a batch job into Parquet, with one executor pod deleted while its tasks run;
- a stream (availableNow, checkpoint on the volume) in micro-batches, with an executor pod
  deleted between them; then a second run after more appends, which adds only those.

Every output is compared with the log read by `rlog read`: every entry, exactly once. The
Parquet files are read in a pod that mounts the volume (the stream's through the file sink's
metadata log, as Spark reads them: a killed task may leave files no batch committed).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from e2elib import Kubectl, wait_until
from oplib import Log, delete_logs, exists

pytestmark = [pytest.mark.spark_k8s, pytest.mark.timeout(2400)]

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(REPO, "examples", "spark_k8s")
IMAGE = os.environ.get("E2E_SPARK_IMAGE", "docker.io/rlog/rlog-spark:dev")
NAME = "orders"  # examples/spark_k8s/log.yaml
ENTRIES = 60_000
PARTITIONS = 12
CHECKER = "parquet-check"

# Prints "position<TAB>value" for every row of the Parquet output at argv[1]; with argv[2] ==
# "stream", only the files the file sink committed (its _spark_metadata log: the newest
# compaction, then the batches after it; "add" and "delete" actions). Runs in the checker pod.
DUMP = r"""
import json, os, sys, urllib.parse
import pyarrow.parquet as pq
path, mode = sys.argv[1], sys.argv[2]
if mode == "stream":
    meta = os.path.join(path, "_spark_metadata")
    names = set(os.listdir(meta))
    ids = sorted(int(n.split(".")[0]) for n in names if n.split(".")[0].isdigit())
    compacted = [i for i in ids if f"{i}.compact" in names]
    first = compacted[-1] if compacted else -1
    order = ([f"{first}.compact"] if compacted else []) + [
        str(i) for i in range(first + 1, ids[-1] + 1)]
    files = {}
    for name in order:
        lines = open(os.path.join(meta, name)).read().splitlines()
        assert lines[0] == "v1", (name, lines[0])
        for line in lines[1:]:
            status = json.loads(line)
            if status["action"] == "add":
                files[urllib.parse.urlparse(status["path"]).path] = 1
            else:
                files.pop(urllib.parse.urlparse(status["path"]).path, None)
    on_disk = {os.path.join(path, n) for n in os.listdir(path) if n.endswith(".parquet")}
    print(f"committed files {len(files)}, uncommitted files {len(on_disk - set(files))}",
          file=sys.stderr)
    paths = sorted(files)
else:
    paths = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".parquet"))
for p in paths:
    t = pq.read_table(p, columns=["position", "value"])
    for pos, value in zip(t.column("position").to_pylist(), t.column("value").to_pylist()):
        print(f"{pos}\t{value.decode()}")
"""


def _apply_example(k: Kubectl, name: str) -> None:
    with open(os.path.join(EXAMPLES, name)) as file:
        k("apply", "-f", "-", input=file.read())


@pytest.fixture(scope="module")
def log(operator: str, namespace: str):
    k = Kubectl(namespace)
    _apply_example(k, "log.yaml")
    _apply_example(k, "rbac.yaml")
    _apply_example(k, "output-pvc.yaml")
    log = Log(k, NAME)
    log.wait_ready("every replica VOTING after creation")
    log.wait_settled_leader()
    # log.yaml's spec.auth.clients: the operator issues the jobs' certificate
    wait_until(
        "the operator to write the Spark jobs' client Secret",
        lambda: exists(k, "secret", f"{NAME}-spark-client"),
        120,
        1,
    )
    k.apply(f"""
apiVersion: v1
kind: Pod
metadata:
  name: {CHECKER}
spec:
  containers:
    - name: check
      image: {IMAGE}
      imagePullPolicy: IfNotPresent
      command: ["sleep", "infinity"]
      volumeMounts: [{{name: out, mountPath: /out}}]
  volumes: [{{name: out, persistentVolumeClaim: {{claimName: rlog-spark-out}}}}]
""")
    k("wait", "--for=condition=Ready", f"pod/{CHECKER}", "--timeout=300s", timeout=320)
    try:
        yield log
    finally:
        delete_logs(k, NAME)


def _expected(log: Log, last: str) -> list[tuple[int, str]]:
    """The log's APPEND entries, as `rlog read` gives them, once `last` is readable."""
    return wait_until(
        "the appended entries to be readable",
        lambda: (e := log.entries(f"{NAME}-1", log.service, stale=False))[-1][1] == last and e,
        120,
    )


def _submit(log: Log, app: str, *args: str) -> subprocess.Popen:
    env = {
        **os.environ,
        "NAMESPACE": str(log.k.namespace),
        "APP_NAME": app,
        "IMAGE": IMAGE,
        "EXECUTORS": "2",
        "SPARK_SUBMIT": os.path.join(os.path.dirname(sys.executable), "spark-submit"),
        # pip's spark-submit finds its Spark home with the `python3` on the PATH: this venv's
        # (the system's has no pyspark: spark-submit then exits 127, "/bin/spark-class")
        "PATH": os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    return subprocess.Popen(
        [os.path.join(EXAMPLES, "spark-submit.sh"), NAME, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _finish(log: Log, app: str, proc: subprocess.Popen, t0: float) -> str:
    """Wait for spark-submit; return what the driver printed (its pod's log)."""
    out, _ = proc.communicate(timeout=1500)
    driver = log.k.run("logs", f"{app}-driver", check=False).stdout
    assert proc.returncode == 0, out[-3000:] + driver[-3000:]
    print(f"{app}: {time.monotonic() - t0:.0f}s from spark-submit to the driver's end")
    return "\n".join(line for line in driver.splitlines() if " INFO " not in line)


def _executors(log: Log, app: str) -> list[str]:
    """The executor pods of `app` (spark-submit.sh names them <app>-exec-<id>)."""
    out = log.k("get", "pods", "-l", "spark-role=executor", "-o", "name")
    return sorted(p for p in out.split() if p.startswith(f"pod/{app}-exec-"))


def _sh(log: Log, script: str) -> str:
    """A shell test in the checker pod ("" when kubectl exec timed out: a loaded node)."""
    try:
        return log.k.run("exec", CHECKER, "--", "sh", "-c", script, check=False, timeout=60).stdout
    except subprocess.TimeoutExpired:
        return ""


def _delete_executor_mid_job(
    log: Log, app: str, proc: subprocess.Popen, ready: str, what: str
) -> tuple[str, set[str]]:
    """Delete one executor pod of `app` as soon as the shell test `ready` (run in the
    checker pod) holds while the job still runs; return that pod and every executor pod
    seen until the job ended."""
    deadline = time.monotonic() + 1200
    while True:
        if proc.poll() is not None:
            driver = log.k.run("logs", f"{app}-driver", check=False).stdout
            tail = "\n".join(line for line in driver.splitlines() if " INFO " not in line)
            pytest.fail(f"the job ended before {what} (exit {proc.returncode}): {tail[-3000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"{what} did not happen within 20 minutes")
        seen = _sh(log, ready).strip()
        if seen:
            break
        time.sleep(0.5)
    running = _executors(log, app)
    if not running:
        proc.kill()
        pytest.fail(f"no executor pod of {app} runs: {log.k('get', 'pods', '--show-labels')}")
    pod = running[0]
    log.k("delete", pod, "--wait=false")
    print(f"{app}: deleted {pod} mid-job ({what}: {seen})")
    executors = {pod}
    while proc.poll() is None:
        executors.update(_executors(log, app))
        time.sleep(2)
    return pod, executors


def _rows(log: Log, path: str, mode: str) -> list[tuple[int, str]]:
    p = log.k.run("exec", "-i", CHECKER, "--", "python3", "-", path, mode, input=DUMP, timeout=300)
    print(p.stderr.strip())
    rows = []
    for line in p.stdout.splitlines():
        pos, value = line.split("\t", 1)
        rows.append((int(pos), value))
    return sorted(rows)


def _check_exactly_once(got: list[tuple[int, str]], expected: list[tuple[int, str]]) -> None:
    positions = [p for p, _ in got]
    assert len(positions) == len(set(positions)), "an entry written twice"
    assert len(got) == len(expected), (len(got), len(expected))
    assert got == expected


def test_batch_job_on_kubernetes_with_an_executor_deleted_mid_job(log: Log) -> None:
    values = [f"spark-k8s-{i}" for i in range(ENTRIES)]
    log.append(values, timeout=300)
    expected = _expected(log, values[-1])

    app, out = "rlog-batch", "/out/batch"
    t0 = time.monotonic()
    proc = _submit(log, app, "--out", out, "--partitions", str(PARTITIONS))
    # some tasks committed their files, the job not: tasks are running on both executors
    ready = (
        f"[ ! -e {out}/_SUCCESS ] && ls -d {out}/_temporary/0/task_* 2>/dev/null"
        " | wc -l | grep -vx 0"
    )
    _, executors = _delete_executor_mid_job(log, app, proc, ready, "a task committed")
    driver = _finish(log, app, proc, t0)
    print(driver)
    print(f"{app}: executor pods {sorted(executors)}")
    assert f"wrote {len(expected)} entries to {out}" in driver, driver
    assert "Lost executor" in driver, driver  # the driver saw it go
    _check_exactly_once(_rows(log, out, "batch"), expected)


def test_stream_on_kubernetes_exactly_once_with_an_executor_deleted(log: Log) -> None:
    expected = _expected(log, f"spark-k8s-{ENTRIES - 1}")
    app, out = "rlog-stream-1", "/out/stream"
    t0 = time.monotonic()
    proc = _submit(log, app, "--out", out, "--stream", "--max-entries", "5000",
                   "--partitions", "4")  # fmt: skip
    # two micro-batches committed, more to come (the log holds 12 batches' worth)
    ready = f"ls {out}/_checkpoint/commits 2>/dev/null | grep -c '^[0-9]*$' | grep -vx '[01]'"
    _, executors = _delete_executor_mid_job(log, app, proc, ready, "two batches committed")
    driver = _finish(log, app, proc, t0)
    print(driver)
    print(f"{app}: executor pods {sorted(executors)}")
    assert "Lost executor" in driver, driver
    assert f"added {len(expected)} entries" in driver, driver
    _check_exactly_once(_rows(log, f"{out}/data", "stream"), expected)

    more = [f"spark-k8s-more-{i}" for i in range(500)]
    log.append(more, timeout=300)
    expected = _expected(log, more[-1])
    app = "rlog-stream-2"
    t0 = time.monotonic()
    driver = _finish(log, app, _submit(log, app, "--out", out, "--stream"), t0)
    print(driver)
    assert f"added {len(more)} entries; {out}/data holds {len(expected)} entries" in driver, driver
    _check_exactly_once(_rows(log, f"{out}/data", "stream"), expected)
