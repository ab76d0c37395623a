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
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from e2elib import Kubectl, wait_until

PORT = 7000
REPLICA_IMAGE = os.environ.get("E2E_REPLICA_IMAGE", "docker.io/rlog/rlog-replica:dev")


def plugin(namespace: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`kubectl rlog ...` as kubectl runs it (`kubectl-rlog` on the PATH), else the same
    module with this Python."""
    if shutil.which("kubectl-rlog"):
        cmd = ["kubectl", "rlog", "-n", namespace, *args]
    else:
        cmd = [sys.executable, "-m", "rlog_operator.plugin", "-n", namespace, *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if check:
        assert out.returncode == 0, out.stderr
    return out


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
        delete_logs(k, name)


DELETE_WAIT = 150  # seconds a ReplicatedLog's deletion may take (its finalizer, owned objects)


def delete_logs(k: Kubectl, *names: str) -> None:
    """Delete these ReplicatedLogs (none named: every one in the namespace) and wait until
    they are gone. A deletion that does not finish is a failure of its own, raised with what
    explains it printed first: the logs' objects (finalizers, deletionTimestamp, status),
    the namespace's Events and the operator pods' logs. (Seen twice without evidence: a
    teardown's `kubectl delete --wait` that never returned.)"""
    which = list(names) or ["--all"]
    done = k.run(
        "delete",
        "replicatedlogs",
        *which,
        "--wait=true",
        f"--timeout={DELETE_WAIT}s",
        check=False,
        timeout=DELETE_WAIT + 30,
    )
    if done.returncode == 0:
        return
    print(f"=== deleting replicatedlogs {' '.join(which)}: {done.stderr.strip()}")
    for title, args in (
        ("the logs", ["get", "replicatedlogs", "-o", "yaml"]),
        ("events", ["get", "events", "--sort-by=.lastTimestamp"]),
    ):
        got = k.run(*args, check=False, timeout=60)
        print(f"=== {title}\n{got.stdout}{got.stderr}")
    pods = k.run(
        "get", "pods", "-A", "-l", OPERATOR_LABEL, "-o", "wide",
        check=False, timeout=60, namespaced=False,
    )  # fmt: skip
    print(f"=== operator pods\n{pods.stdout}{pods.stderr}")
    for row in pods.stdout.splitlines()[1:]:  # after the header: NAMESPACE NAME ...
        namespace, pod = row.split()[:2]
        args = ["-n", namespace, "logs", pod, "--tail=300"]
        logs = k.run(*args, check=False, timeout=60, namespaced=False)
        print(f"=== operator pod {namespace}/{pod}\n{logs.stdout}{logs.stderr}")
    raise AssertionError(
        f"deleting replicatedlogs {' '.join(which)} did not finish in {DELETE_WAIT} s "
        "(what the cluster and the operator said is printed above)"
    )


OPERATOR_LABEL = "app.kubernetes.io/name=rlog-operator"


def pod_ready(pod: dict) -> bool:
    conds = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def exists(k: Kubectl, kind: str, name: str) -> bool:
    return k.run("get", kind, name, check=False).returncode == 0


def secret_data(k: Kubectl, name: str) -> dict[str, bytes]:
    """The data of the Secret `name`, decoded."""
    data = k.json("get", "secret", name)["data"]
    return {key: base64.b64decode(value) for key, value in data.items()}


def client_files(k: Kubectl, secret: str, directory: str) -> dict[str, str]:
    """RLOG_CA/RLOG_CERT/RLOG_KEY of a client: the ca.crt, tls.crt and tls.key of the
    Secret `secret`, written under `directory` (as <secret>-<key>)."""
    data = secret_data(k, secret)
    env = {}
    for key, var in (("ca.crt", "RLOG_CA"), ("tls.crt", "RLOG_CERT"), ("tls.key", "RLOG_KEY")):
        path = os.path.join(directory, f"{secret}-{key}")
        with open(path, "wb") as file:
            file.write(data[key])
        env[var] = path
    return env


@dataclass(frozen=True)
class Forward:
    """A running `kubectl port-forward`: its process, and the local port."""

    proc: subprocess.Popen[str]
    port: int

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"


@contextlib.contextmanager
def port_forward(k: Kubectl, target: str) -> Iterator[Forward]:
    """A local port forwarded to `target` (pod/NAME or svc/NAME) port PORT; ended on exit."""
    cmd = ["kubectl", "-n", str(k.namespace), "port-forward", target, f":{PORT}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.search(r"127\.0\.0\.1:(\d+)", line)
    if not match:
        proc.kill()  # first, so that reading the rest of what it said ends
        raise AssertionError(f"kubectl port-forward said: {line}{proc.stdout.read()}")
    try:
        yield Forward(proc, int(match.group(1)))
    finally:
        proc.terminate()
        proc.wait(10)


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

    def append(self, values: list[str], timeout: float = 120) -> None:
        """Append `values` (one per line) with the CLI in the first replica's pod, through
        the client Service."""
        self.k(
            "exec", "-i", self.pods[0], "-c", "replica", "--",
            "rlog", "append", "--endpoint", self.service, "--stdin",
            input="\n".join(values) + "\n", timeout=timeout,
        )  # fmt: skip

    def client_env(self, directory: str) -> dict[str, str]:
        """RLOG_CA/RLOG_CERT/RLOG_KEY for a client outside the cluster (through a
        port-forward: the replicas' certificate names 127.0.0.1): the operator's own
        certificate from its Secret, written under `directory`; {} for a plaintext log."""
        secret = f"{self.name}-tls-operator"
        return client_files(self.k, secret, directory) if exists(self.k, "secret", secret) else {}

    def replica_status(self, pod: str) -> dict:
        out = self.rlog(pod, "status", "--endpoint", f"127.0.0.1:{PORT}", "--json")
        return json.loads(out)

    def entries(self, pod: str, endpoint: str = f"127.0.0.1:{PORT}", stale: bool = True):
        """(position, value) of every entry; a value that is not UTF-8 (a benchmark's
        random bytes) as backslash escapes, so that replicas' lists still compare."""
        args = ["read", "--endpoint", endpoint, "--json"] + (["--stale"] if stale else [])
        out = self.rlog(pod, *args, timeout=120)
        return [
            (e["position"], base64.b64decode(e["value"]).decode(errors="backslashreplace"))
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


def client_pod(
    log: Log,
    name: str,
    command: list[str],
    args: list[str],
    *,
    service_account: str | None = None,
    mounts: Sequence[dict[str, Any]] = (),
    volumes: Sequence[dict[str, Any]] = (),
    node: str | None = None,
) -> dict[str, Any]:
    """A pod of the replica image (rlog installed) that runs `command` once as a client of
    `log`: restricted security context, and, a log being mutual TLS by default, the
    operator's client identity from its Secret at /etc/rlog/tls, named by RLOG_CA,
    RLOG_CERT and RLOG_KEY (which rlog's client tools read). `node`: run it there (the node
    tests keep their writer on the side of a fault that holds a quorum)."""
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [
            {
                "name": "client",
                "image": REPLICA_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "command": command,
                "args": args,
                "securityContext": {
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
                "env": [
                    {"name": "RLOG_CA", "value": "/etc/rlog/tls/ca.crt"},
                    {"name": "RLOG_CERT", "value": "/etc/rlog/tls/tls.crt"},
                    {"name": "RLOG_KEY", "value": "/etc/rlog/tls/tls.key"},
                ],
                "volumeMounts": [{"name": "tls", "mountPath": "/etc/rlog/tls"}, *mounts],
            }
        ],
        "volumes": [
            {
                "name": "tls",
                "secret": {"secretName": f"{log.name}-tls-operator", "optional": True},
            },
            *volumes,
        ],
    }
    if service_account is not None:
        spec["serviceAccountName"] = service_account
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


WRITER_SCRIPT = r"""
import json, os, ssl, sys, threading, time, urllib.request
import grpc
from rlog.client import Client, Credentials, status_name
from rlog.wire import CLIENT_CHANNEL_OPTIONS
from rlog.proto import rlog_pb2 as pb, rlog_pb2_grpc as pbg
# The operator's certificate, mounted from its Secret when the log is mutual TLS.
creds = Credentials.from_env() if os.path.exists(os.environ.get("RLOG_CA", "")) else None

peers = sys.argv[1].split(",")
service = sys.argv[2]
tag = sys.argv[3]
selector = sys.argv[4]
STOP = "/tmp/stop"
SA = "/var/run/secrets/kubernetes.io/serviceaccount"

def emit(**kw):
    print(json.dumps(kw), flush=True)

def pod_ips():
    # The pods' addresses from the API server, fresh each sample: a replica recreated under
    # its DNS name is asked at its new address at once, not after the DNS answers for the
    # old one have expired (the cluster DNS caches them for seconds).
    namespace = open(f"{SA}/namespace").read().strip()
    api = f"{os.environ['KUBERNETES_SERVICE_HOST']}:{os.environ['KUBERNETES_SERVICE_PORT']}"
    url = f"https://{api}/api/v1/namespaces/{namespace}/pods?labelSelector={selector}"
    request = urllib.request.Request(
        url, headers={"Authorization": "Bearer " + open(f"{SA}/token").read().strip()})
    context = ssl.create_default_context(cafile=f"{SA}/ca.crt")
    with urllib.request.urlopen(request, context=context, timeout=3) as answer:
        items = json.load(answer)["items"]
    return {p["metadata"]["name"]: (p.get("status") or {}).get("podIP") for p in items}

channels = {}

def stub(peer, ip):
    # One kept channel per (replica, address), dialled by address; TLS still checks the
    # replica's name (its certificate's), as any client of the DNS name would.
    key = (peer, ip)
    if key not in channels:
        address = f"{ip}:{peer.rsplit(':', 1)[1]}"
        if creds is None:
            channel = grpc.insecure_channel(address, options=CLIENT_CHANNEL_OPTIONS)
        else:
            options = [*CLIENT_CHANNEL_OPTIONS,
                       ("grpc.ssl_target_name_override", peer.rsplit(":", 1)[0])]
            channel = grpc.secure_channel(address, creds.channel_credentials(), options)
        channels[key] = pbg.LogStub(channel)
    return channels[key]

def ask(peer, ip, states, why):
    name = peer.split(".")[0]
    if not ip:
        states[name], why[name] = "error:NO_POD_IP", "no pod, or no address yet"
        return
    try:
        answer = stub(peer, ip).Status(pb.StatusRequest(), timeout=3.0)
        states[name] = status_name(answer.status)
    except grpc.RpcError as e:  # UNAVAILABLE (down), DEADLINE_EXCEEDED (slow), ...
        states[name] = f"error:{e.code().name}"
        why[name] = f"{ip}: " + (e.details() or "")[:400]  # gRPC's own words

def sample():
    while not os.path.exists(STOP):
        states, why = {}, {}
        try:
            ips = pod_ips()
        except Exception as e:
            emit(t=time.time(), sample_error=f"listing pods: {e}"[:300])
            time.sleep(0.5)
            continue
        askers = [
            threading.Thread(target=ask, args=(p, ips.get(p.split(".")[0]), states, why))
            for p in peers
        ]
        for a in askers:
            a.start()
        for a in askers:
            a.join()
        emit(t=time.time(), sample=states, why=why)
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


SAMPLER_RBAC = """
apiVersion: v1
kind: ServiceAccount
metadata:
  name: rlog-e2e-sampler
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: rlog-e2e-sampler
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: rlog-e2e-sampler
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: rlog-e2e-sampler
subjects:
- kind: ServiceAccount
  name: rlog-e2e-sampler
"""


@dataclass
class WriterReport:
    acks: list[tuple[int, str]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    samples: list[tuple[float, dict[str, str]]] = field(default_factory=list)
    # why a replica's status could not be had, by sample time (the error's details)
    why: dict[float, dict[str, str]] = field(default_factory=dict)
    sample_errors: list[str] = field(default_factory=list)  # the pod list could not be had

    def voting_counts(self) -> list[int]:
        return [sum(1 for s in st.values() if s == "VOTING") for _, st in self.samples]


@dataclass(frozen=True)
class Disruption:
    """What one disruption cost the continuous writer (reported at the end of the run)."""

    test: str
    what: str
    acknowledged: int
    failed_calls: int
    seconds: float


# Every writer's outcome in this process, in order, until conftest.py moves them into the
# report of the test that ran them (the run prints them as a table)
DISRUPTIONS: list[Disruption] = []


class Writer:
    """A pod (the replica image) appending unique values through the client Service with
    failover to the peers, and sampling every replica's status twice a second. `what`
    names the disruption it writes through, for the run's report (DISRUPTIONS)."""

    def __init__(self, log: Log, tag: str, what: str = "", node: str | None = None) -> None:
        self.log, self.tag, self.node = log, tag, node
        self.what = what or tag
        self.pod = f"writer-{tag}"
        self.started = 0.0

    def start(self) -> None:
        # the sampler reads the pods' addresses from the API (see WRITER_SCRIPT)
        self.log.k.apply(SAMPLER_RBAC)
        spec = client_pod(
            self.log,
            self.pod,
            ["python3", "-u", "-c", WRITER_SCRIPT],
            [
                ",".join(self.log.peers),
                self.log.service,
                self.tag,
                f"app.kubernetes.io/instance={self.log.name}",
            ],
            service_account="rlog-e2e-sampler",
            node=self.node,
        )
        self.log.k.apply(json.dumps(spec))
        self.started = time.monotonic()
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
                if item.get("why"):
                    report.why[float(item["t"])] = item["why"]
            elif "sample_error" in item:
                report.sample_errors.append(item["sample_error"])
        return report

    def stop(self) -> WriterReport:
        self.log.k(
            "exec", self.pod, "--", "python3", "-c", "open('/tmp/stop', 'w').close()", timeout=30
        )
        wait_until(f"{self.pod} to stop", lambda: '"done"' in self.log.k("logs", self.pod), 60)
        report = self.report()
        self.log.k("delete", "pod", self.pod, "--wait=false")
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0].split("::")[-1]
        DISRUPTIONS.append(
            Disruption(
                test,
                self.what,
                len(report.acks),
                len(report.errors),
                time.monotonic() - self.started,
            )
        )
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
