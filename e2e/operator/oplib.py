"""Helpers of the operator e2e suite: one ReplicatedLog seen through kubectl, and a writer
pod that appends without pause while sampling every replica's status.

Everything goes through kubectl (exec into replica pods for the rlog CLI), so the suite
runs unchanged on the local cluster and on kind.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from e2elib import Kubectl, wait_until

PORT = 7000
REPLICA_IMAGE = os.environ.get("E2E_REPLICA_IMAGE", "docker.io/rlog/rlog-replica:dev")


def manifest(name: str, replicas: int = 3, auto_initialize: bool = True, size: str = "64Mi") -> str:
    return f"""
apiVersion: rlog.io/v1alpha1
kind: ReplicatedLog
metadata:
  name: {name}
spec:
  replicas: {replicas}
  storage:
    size: {size}
  autoInitialize: {"true" if auto_initialize else "false"}
"""


@contextlib.contextmanager
def created_log(namespace: str, name: str, settle: bool = False) -> Iterator[Log]:
    """A 3-replica ReplicatedLog, Ready with every replica VOTING (and, with `settle`, one
    settled leader); deleted afterwards while the operator still serves its finalizer."""
    k = Kubectl(namespace)
    log = Log(k, name)
    k.apply(manifest(name))
    log.wait_ready("every replica VOTING after creation")
    if settle:
        log.wait_settled_leader()
    try:
        yield log
    finally:
        k.run("delete", "replicatedlogs", name, "--wait=true", check=False, timeout=180)


def pod_ready(pod: dict) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def exists(k: Kubectl, kind: str, name: str) -> bool:
    return k.run("get", kind, name, check=False).returncode == 0


@dataclass
class Log:
    """One ReplicatedLog of the test namespace."""

    k: Kubectl
    name: str
    replicas: int = 3

    @property
    def pods(self) -> list[str]:
        return [f"{self.name}-{i}" for i in range(self.replicas)]

    @property
    def peers(self) -> list[str]:
        ns = self.k.namespace
        return [f"{p}.{self.name}-headless.{ns}.svc:{PORT}" for p in self.pods]

    @property
    def service(self) -> str:
        return f"{self.name}:{PORT}"

    def body(self) -> dict:
        return self.k.json("get", "replicatedlog", self.name)

    def status(self) -> dict:
        return self.body().get("status") or {}

    def condition(self, type_: str) -> dict:
        return next((c for c in self.status().get("conditions") or [] if c["type"] == type_), {})

    def rlog(self, pod: str, *args: str, timeout: float = 60) -> str:
        return self.k("exec", pod, "-c", "replica", "--", "rlog", *args, timeout=timeout)

    def client_env(self, directory: str) -> dict[str, str]:
        """RLOG_CA/RLOG_CERT/RLOG_KEY for a client outside the cluster (through a
        port-forward: the replicas' certificate names 127.0.0.1): the operator's own
        certificate from its Secret, written under `directory`; {} for a plaintext log."""
        found = self.k.run("get", "secret", f"{self.name}-tls-operator", "-o", "json", check=False)
        if found.returncode != 0:
            return {}
        data = json.loads(found.stdout)["data"]
        env = {}
        for key, name in (("ca.crt", "RLOG_CA"), ("tls.crt", "RLOG_CERT"), ("tls.key", "RLOG_KEY")):
            path = os.path.join(directory, key)
            with open(path, "wb") as file:
                file.write(base64.b64decode(data[key]))
            env[name] = path
        return env

    def replica_status(self, pod: str) -> dict:
        out = self.rlog(pod, "status", "--endpoint", f"127.0.0.1:{PORT}", "--json")
        return json.loads(out)

    def entries(self, pod: str, endpoint: str = f"127.0.0.1:{PORT}", stale: bool = True):
        args = ["read", "--endpoint", endpoint, "--json"] + (["--stale"] if stale else [])
        out = self.rlog(pod, *args, timeout=120)
        return [
            (e["position"], base64.b64decode(e["value"]).decode())
            for e in (json.loads(line) for line in out.splitlines() if line.strip())
        ]

    def all_voting(self) -> bool:
        st = self.status()
        reps = st.get("replicas") or []
        return (
            st.get("phase") == "Ready"
            and len(reps) == self.replicas
            and all(r.get("status") == "VOTING" for r in reps)
        )

    def wait_ready(self, what: str, timeout: float = 300) -> None:
        wait_until(f"{self.name}: {what}", self.all_voting, timeout, 2)

    def wait_settled_leader(self, quiet: float = 5.0, timeout: float = 120) -> str:
        """Wait until every replica names one leader and no replica's promise moves for
        `quiet` seconds. Right after initialization a second election sometimes follows the
        first (replicas turn VOTING together), failing an append in flight with an unknown
        outcome; tests that need their first appends to succeed wait this out."""
        settled: dict[str, Any] = {}

        def observe() -> bool:
            statuses = [self.replica_status(p) for p in self.pods]
            leaders = {s.get("leader") for s in statuses}
            key = (tuple(s.get("promised") for s in statuses), tuple(leaders))
            if len(leaders) != 1 or None in leaders or "" in leaders:
                settled.clear()
                return False
            if settled.get("key") != key:
                settled.update(key=key, since=time.monotonic())
                return False
            return time.monotonic() - settled["since"] >= quiet

        wait_until(f"{self.name}: one settled leader", observe, timeout, 1)
        return str(settled["key"][1][0])

    def pod_uids(self) -> dict[str, str]:
        items = self.k.json("get", "pods", "-l", f"app.kubernetes.io/instance={self.name}")
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in items["items"]}

    def update_revision(self) -> str:
        sts = self.k.json("get", "statefulset", self.name)
        return str((sts.get("status") or {}).get("updateRevision") or "")

    def rolled_out(self, revision_before: str) -> bool:
        """Every pod Ready on the StatefulSet's new revision, the log Ready, queue empty."""
        revision = self.update_revision()
        if not revision or revision == revision_before:
            return False
        pods = self.k.json("get", "pods", "-l", f"app.kubernetes.io/instance={self.name}")
        on_new = [
            p
            for p in pods["items"]
            if p["metadata"]["labels"].get("controller-revision-hash") == revision
            and pod_ready(p)
            and not p["metadata"].get("deletionTimestamp")
        ]
        queue = (self.status().get("rollingUpdate") or {}).get("queue") or []
        return len(on_new) == self.replicas and not queue and self.all_voting()


WRITER_SCRIPT = r"""
import json, os, sys, threading, time
from rlog.client import Client, Credentials, status_name
# The operator's certificate, mounted from its Secret when the log is mutual TLS.
creds = Credentials.from_env() if os.path.exists(os.environ.get("RLOG_CA", "")) else None

peers = sys.argv[1].split(",")
service = sys.argv[2]
tag = sys.argv[3]
STOP = "/tmp/stop"

def emit(**kw):
    print(json.dumps(kw), flush=True)

def ask(probe, peer, states):
    try:
        states[peer.split(".")[0]] = status_name(probe.status(peer).status)
    except Exception as e:  # UNAVAILABLE (down), DEADLINE_EXCEEDED (slow), ...
        code = getattr(getattr(e, "code", None), "name", None) or type(e).__name__
        states[peer.split(".")[0]] = f"error:{code}"

def sample():
    probe = Client(peers, timeout=3.0, credentials=creds)
    while not os.path.exists(STOP):
        states = {}
        askers = [threading.Thread(target=ask, args=(probe, p, states)) for p in peers]
        for a in askers:
            a.start()
        for a in askers:
            a.join()
        emit(t=time.time(), sample=states)
        time.sleep(0.5)

threading.Thread(target=sample, daemon=True).start()
client = Client([service] + peers, append_timeout=5.0, credentials=creds)
i = 0
while not os.path.exists(STOP):
    value = f"{tag}-{i}"
    try:
        emit(t=time.time(), ack=client.append_one(value.encode()), v=value)
    except Exception as e:
        emit(t=time.time(), err=type(e).__name__, v=value, msg=str(e)[:160])
        time.sleep(0.2)
    i += 1
emit(t=time.time(), done=i)
time.sleep(3600)
"""


@dataclass
class WriterReport:
    acks: list[tuple[int, str]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    samples: list[tuple[float, dict[str, str]]] = field(default_factory=list)

    def voting_counts(self) -> list[int]:
        return [sum(1 for s in st.values() if s == "VOTING") for _, st in self.samples]


class Writer:
    """A pod (the replica image) appending unique values through the client Service with
    failover to the peers, and sampling every replica's status twice a second."""

    def __init__(self, log: Log, tag: str) -> None:
        self.log, self.tag = log, tag
        self.pod = f"writer-{tag}"

    def start(self) -> None:
        spec = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.pod},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 10001,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "writer",
                        "image": REPLICA_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": ["python3", "-u", "-c", WRITER_SCRIPT],
                        "args": [",".join(self.log.peers), self.log.service, self.tag],
                        "securityContext": {
                            "allowPrivilegeEscalation": False,
                            "capabilities": {"drop": ["ALL"]},
                        },
                        # a log is mutual TLS by default: write as the operator
                        "env": [
                            {"name": "RLOG_CA", "value": "/etc/rlog/tls/ca.crt"},
                            {"name": "RLOG_CERT", "value": "/etc/rlog/tls/tls.crt"},
                            {"name": "RLOG_KEY", "value": "/etc/rlog/tls/tls.key"},
                        ],
                        "volumeMounts": [{"name": "tls", "mountPath": "/etc/rlog/tls"}],
                    }
                ],
                "volumes": [
                    {
                        "name": "tls",
                        "secret": {
                            "secretName": f"{self.log.name}-tls-operator",
                            "optional": True,
                        },
                    }
                ],
            },
        }
        self.log.k.apply(json.dumps(spec))
        # writing and seeing every replica VOTING before anything is changed
        wait_until(
            f"{self.pod} to append and see every replica VOTING",
            lambda: self._started(),
            180,
            2,
        )

    def _started(self) -> bool:
        r = self.report()
        return bool(r.acks) and any(c == self.log.replicas for c in r.voting_counts())

    def report(self) -> WriterReport:
        out = self.log.k("logs", self.pod, timeout=60)
        report = WriterReport()
        for line in out.splitlines():
            try:
                item = json.loads(line)
            except ValueError:
                continue
            if "ack" in item:
                report.acks.append((int(item["ack"]), item["v"]))
            elif "err" in item:
                report.errors.append(item)
            elif "sample" in item:
                report.samples.append((float(item["t"]), item["sample"]))
        return report

    def stop(self) -> WriterReport:
        self.log.k(
            "exec", self.pod, "--", "python3", "-c", "open('/tmp/stop', 'w').close()", timeout=30
        )
        wait_until(f"{self.pod} to stop", lambda: '"done"' in self.log.k("logs", self.pod), 60)
        report = self.report()
        self.log.k("delete", "pod", self.pod, "--wait=false")
        return report


def check_acknowledged(log: Log, report: WriterReport) -> dict[str, list[tuple[int, str]]]:
    """Every acknowledged append is at its position on every replica; all replicas agree."""
    assert report.acks, "the writer got no acknowledgement at all"
    positions = [p for p, _ in report.acks]
    assert len(set(positions)) == len(positions), "two acknowledgements for one position"
    last = max(positions)

    def caught_up() -> dict[str, list[tuple[int, str]]] | None:
        held = {p: log.entries(p) for p in log.pods}
        if all(entries and entries[-1][0] >= last for entries in held.values()):
            return held
        return None

    held = wait_until("every replica to hold the last acknowledged position", caught_up, 120, 2)
    reference = dict(held[log.pods[0]])
    for pod, entries in held.items():
        at = dict(entries)
        assert len(at) == len(entries), f"{pod}: a position listed twice"
        missing = [(p, v) for p, v in report.acks if at.get(p) != v]
        assert not missing, f"{pod}: acknowledged appends lost or changed: {missing[:10]}"
        common = set(at) & set(reference)
        differ = [p for p in common if at[p] != reference[p]]
        assert not differ, f"{pod} and {log.pods[0]} disagree at {differ[:10]}"
    return held


def watch_pods(log: Log, until: Any, timeout: float) -> list[tuple[float, str, str]]:
    """Poll the log's pods until `until()`; return (time, pod, uid) for every UID first seen."""
    seen: dict[str, set[str]] = {}
    events: list[tuple[float, str, str]] = []
    deadline = time.monotonic() + timeout
    while True:
        for pod, uid in log.pod_uids().items():
            if uid not in seen.setdefault(pod, set()):
                seen[pod].add(uid)
                events.append((time.monotonic(), pod, uid))
        if until():
            return events
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s; pod incarnations seen: {events}")
        time.sleep(1)
