"""A local N-replica log as real processes: the `DevCluster` harness of the tests, the
benchmarks and `rlog dev` (the command is tools/dev_cli.py).

    with DevCluster(replicas=3) as cluster:      # initializes fresh dirs, starts, elects
        client = cluster.client()
        client.append([b"x"])
        cluster.kill(0)                          # SIGKILL replica 0 (its process group)
        cluster.restart(0)                       # same port, same data dir
        cluster.wipe(1)                          # stop it, empty its data dir (volume loss)

Layout of the cluster dir: `replica-<i>/data` (the data dir), `replica-<i>/replica.log`
(the replica's stdout and stderr, appended across restarts), `cluster.json` (addresses).
Each replica runs in its own process group; `stop()` and `kill()` signal the whole group.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rlog.client import Client
from rlog.client.errors import RlogError
from rlog.client.security import Credentials
from rlog.config import ConfigError, check_replica_count
from rlog.initialize import initialize, is_fresh
from rlog.proto import rlog_pb2 as pb
from rlog.storage import AUTO

STOP_GRACE = 5.0
# The status polls' channels reconnect every 100 ms: a poll is how a test sees a replica it
# just started, and the clients' back-off (growing to 1 s) saw it up to 0.9 s after it
# listened, past the second a capped catch-up stays under half done (a test waiting to kill
# it mid-copy then timed out). A poll costs a loopback connection attempt, nothing more.
POLLING_BACKOFF = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 100),
]


# Ports below the kernel's ephemeral range are never handed out as the source port of an
# outgoing connection; from here up to that range we choose listening ports.
_LISTEN_PORTS_FROM = 15000


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


# RLOG_LISTEN_PORTS=LOW-HIGH: free_port draws from [LOW, HIGH) only, and claim_port refuses a
# port outside it. Processes that run side by side each get their own slice (the parallel test
# workers do, tests/conftest.py): the claims below are per process, and two processes that
# drew the same random port both saw it free before either bound it.
LISTEN_PORTS_ENV = "RLOG_LISTEN_PORTS"


def listen_ports() -> tuple[int, int] | None:
    """The [low, high) slice RLOG_LISTEN_PORTS gives this process, or None when unset."""
    value = os.environ.get(LISTEN_PORTS_ENV, "")
    if not value:
        return None
    try:
        low, high = (int(part) for part in value.split("-"))
    except ValueError:
        low = high = 0
    if not 0 < low < high <= 65536:
        raise ValueError(f"{LISTEN_PORTS_ENV}={value!r}: expected LOW-HIGH with 0 < LOW < HIGH")
    return low, high


def listen_ports_default() -> tuple[int, int]:
    """The [low, high) free_port draws from without RLOG_LISTEN_PORTS: below the ephemeral
    range."""
    return _LISTEN_PORTS_FROM, _ephemeral_range()[0]


def listen_ports_slice(index: int, count: int) -> str:
    """The RLOG_LISTEN_PORTS value of process `index` of `count` run side by side: its share
    of this process's range (RLOG_LISTEN_PORTS if set, else listen_ports_default)."""
    low, high = listen_ports() or listen_ports_default()
    size = (high - low) // count
    if not 0 <= index < count or size < 1:
        raise ValueError(f"no slice {index} of {count} in ports {low}-{high}")
    return f"{low + index * size}-{low + (index + 1) * size}"


# Ports this process has handed out (free_port, and the write lanes' next to them): never
# handed out twice. Clusters started at once in one process (tests do, from threads) chose
# the same random port now and then, both saw it free before either replica bound it, and
# one replica failed "Address already in use" while the other cluster's replica answered
# in its place (a CI run's election test waited 60 s for a leader that way).
_claimed: set[tuple[str, int]] = set()
_claim_lock = threading.Lock()


def claim_port(host: str, port: int) -> bool:
    """Whether `port` was free and not handed out by this process before; claims it if so."""
    given = listen_ports()
    if given is not None and not given[0] <= port < given[1]:
        return False  # another process's slice
    with _claim_lock:
        if (host, port) in _claimed or not _port_free(host, port):
            return False
        _claimed.add((host, port))
        return True


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now and this process never handed out, for a server that
    binds it a little later.

    Not one the kernel picks for port 0: that comes from the ephemeral range, which is also
    where every outgoing connection takes its source port, and a replica binding its port a
    second after the choice (the interpreter starting) then failed "Address already in use"
    now and then on a machine busy with connections (a CI run did). Below that range only
    listeners compete, and the choice is random so concurrent processes rarely meet (and never
    do when each has its own RLOG_LISTEN_PORTS slice)."""
    given = listen_ports()
    if given is not None:
        for _ in range(200):
            port = random.randrange(*given)
            if claim_port(host, port):
                return port
        raise RlogError(f"no free port in {LISTEN_PORTS_ENV}={given[0]}-{given[1]}")
    low, _ = _ephemeral_range()
    if low - _LISTEN_PORTS_FROM >= 1000:
        for _ in range(200):
            port = random.randrange(_LISTEN_PORTS_FROM, low)
            if claim_port(host, port):
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _port_free(host: str, port: int) -> bool:
    """Bindable by any server, also one that does not set SO_REUSEADDR. The probe sets no
    options: with SO_REUSEADDR it also passed ports whose connections a server with that option
    had closed (TIME_WAIT), and a plain bind there fails "Address already in use" (a CI run's
    test did)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


DIE_WITH_PARENT_ENV = "RLOG_DIE_WITH_PARENT"  # value: the parent's pid


def die_with_parent_if_asked() -> None:
    """Called first thing by `rlog` itself: with RLOG_DIE_WITH_PARENT=<pid>, get SIGKILLed
    when the process that started us dies (Linux), so a crashed test run leaves no replicas
    behind. Done in the child after exec, not in a preexec_fn: Python code between fork and
    exec can deadlock when the parent has threads (gRPC's), and did here."""
    parent = os.environ.get(DIE_WITH_PARENT_ENV)
    if not parent:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):
        os._exit(1)  # the parent died before the signal was armed


def _the_leader(found: Sequence[pb.StatusResponse | None]) -> int | None:
    """The one replica that says it leads (None if none does, or several do)."""
    leaders = [
        i
        for i, st in enumerate(found)
        if st is not None and st.role == "leader" and st.status == pb.VOTING
    ]
    return leaders[0] if len(leaders) == 1 else None


def _describe(found: Sequence[pb.StatusResponse | None]) -> str:
    return ", ".join(
        "down"
        if st is None
        else f"{pb.Status.Name(st.status)}/{st.role}/learned={st.learned}/promised={st.promised}"
        + (f"/leader={st.leader}" if st.leader else "")
        + (f" [{st.reason}]" if st.reason else "")
        for st in found
    )


class DevCluster:
    """N `rlog replica` processes on loopback sharing one log.

    - `dir`: the cluster dir (default: a new dir under ~/.cache/rlog-dev, or the temp dir);
      an existing cluster dir is reused (same addresses, from cluster.json).
    - `initialize`: run `rlog initialize` on every data dir when ALL are fresh (a brand-new
      log), so the replicas start VOTING. Never done to a single wiped dir: that replica
      must recover through the protocol. With `initialize=False` use `auto_initialize`.
    - `distinct_hosts`: bind replica i to 127.0.0.(i+1) instead of sharing `host`.
    - `base_port`: replica i listens on base_port + i (default: free ports chosen at
      `start()`, kept across restarts).
    - `storage_engine`: `rlog replica --storage-engine`, left out for the default `auto`
      (each data dir opened with the engine of the store it holds, a fresh one with the
      default engine); may be changed between a stop and a start.
    - `metrics`, `health`: serve metrics / grpc.health.v1 on free ports, kept across
      restarts (`metrics_ports`, `health_ports`).
    - `replica_args`: extra `rlog replica` arguments for every replica.
    - `write_lane_offset`: >0 gives every replica a write lane at its port + this offset
      (`rlog replica --write-lane-offset`; ports chosen so the lanes' are free too).
    - `die_with_parent`: replicas are SIGKILLed if the process that started them dies
      (PR_SET_PDEATHSIG; tied to the starting *thread*).
    - `tls`: mutual TLS and roles, with a throwaway CA and certificates in `<dir>/tls`
      (rlog.certs.make_dev_pki); `client()` then connects as "admin" unless given
      other `credentials` (see `credentials(name)`).
    - `builds`: replica i runs the `rlog` package of the directory `builds[i]` (its
      PYTHONPATH is that directory alone, e.g. another release's `replica_image` taken from
      a git tag), the others this process's; a mixed-version log. The attribute may be
      changed between a stop and a start of a replica (a rolling upgrade).
    """

    def __init__(
        self,
        replicas: int = 3,
        dir: str | Path | None = None,
        *,
        host: str = "127.0.0.1",
        base_port: int | None = None,
        distinct_hosts: bool = False,
        initialize: bool = True,
        auto_initialize: bool = False,
        log_id: str = "dev",
        storage_engine: str = AUTO,
        election_timeout: float | None = None,
        max_entry_size: int | None = None,
        metrics: bool = False,
        health: bool = False,
        replica_args: Sequence[str] = (),
        python: str = sys.executable,
        env: dict[str, str] | None = None,
        die_with_parent: bool = True,
        tls: bool = False,
        write_lane_offset: int = 0,
        builds: Mapping[int, Path] | None = None,
    ) -> None:
        check_replica_count(replicas)
        self.tls = tls
        if write_lane_offset < 0:
            raise ConfigError("the write lane offset must be 0 (off) or positive")
        self.write_lane_offset = write_lane_offset
        self.replicas = replicas
        self._dir_given = dir is not None
        self.dir = Path(dir) if dir is not None else _default_dir()
        self.host = host
        self.base_port = base_port
        self.distinct_hosts = distinct_hosts
        self.initialize = initialize
        self.auto_initialize = auto_initialize
        self.log_id = log_id
        self.storage_engine = storage_engine
        self.election_timeout = election_timeout
        self.max_entry_size = max_entry_size
        self.metrics = metrics
        self.health = health
        self.replica_args = list(replica_args)
        self.python = python
        self.env = env
        self.builds: dict[int, Path] = dict(builds or {})
        self.die_with_parent = die_with_parent
        self.addresses: list[str] = []
        self.metrics_ports: list[int | None] = [None] * replicas
        self.health_ports: list[int | None] = [None] * replicas
        self.processes: list[subprocess.Popen[bytes] | None] = [None] * replicas
        self._clients: dict[int, Client] = {}
        self._lock = threading.Lock()

    # ---- layout ------------------------------------------------------------------------

    def replica_dir(self, i: int) -> Path:
        return self.dir / f"replica-{i}"

    def data_dir(self, i: int) -> Path:
        return self.replica_dir(i) / "data"

    def log_file(self, i: int) -> Path:
        return self.replica_dir(i) / "replica.log"

    @property
    def data_dirs(self) -> list[Path]:
        return [self.data_dir(i) for i in range(self.replicas)]

    @property
    def log_files(self) -> list[Path]:
        return [self.log_file(i) for i in range(self.replicas)]

    @property
    def tls_dir(self) -> Path:
        return self.dir / "tls"

    def credentials(self, name: str = "admin", token: bool = False) -> Credentials:
        """A client's credentials in a TLS cluster: the certificate of `name` (one of
        certs.DEV_CLIENTS), and with `token` the dev token too."""
        from rlog.certs import DevPki

        pki = DevPki(self.tls_dir)
        return Credentials.from_files(
            pki.ca, pki.cert(name), pki.key(name), token_file=pki.token if token else None
        )

    @property
    def endpoints(self) -> list[str]:
        """The replicas' H:P addresses, in id order."""
        return list(self.addresses)

    @property
    def endpoint(self) -> str:
        """Every address, comma-separated (for `--endpoint`)."""
        return ",".join(self.addresses)

    def host_of(self, i: int) -> str:
        return f"127.0.0.{i + 1}" if self.distinct_hosts else self.host

    def _choose_addresses(self) -> None:
        saved = self.dir / "cluster.json"
        if not self.addresses and saved.exists() and self.base_port is None:
            try:
                addresses = json.loads(saved.read_text())["addresses"]
            except (ValueError, KeyError, OSError):
                addresses = []
            if len(addresses) == self.replicas and all(
                self._ports_free(a.rpartition(":")[0], int(a.rpartition(":")[2]), [])
                for a in addresses
            ):
                self.addresses = list(addresses)
        if not self.addresses:
            addresses = []
            for i in range(self.replicas):
                host = self.host_of(i)
                if self.base_port is not None:
                    port = self.base_port + i
                    if not self._ports_free(host, port, addresses):
                        lane = f" (or its write lane's, {port + self.write_lane_offset})"
                        raise RlogError(
                            f"port {host}:{port}{lane if self.write_lane_offset else ''} "
                            "is in use or taken by another replica"
                        )
                else:
                    port = free_port(host)
                    while not self._ports_free(host, port, addresses) or (
                        self.write_lane_offset
                        and not claim_port(host, port + self.write_lane_offset)
                    ):
                        port = free_port(host)
                addresses.append(f"{host}:{port}")
            self.addresses = addresses
        if self.metrics:
            self.metrics_ports = [
                p if p is not None else free_port(self.host_of(i))
                for i, p in enumerate(self.metrics_ports)
            ]
        if self.health:
            self.health_ports = [
                p if p is not None else free_port(self.host_of(i))
                for i, p in enumerate(self.health_ports)
            ]
        saved.write_text(json.dumps({"addresses": self.addresses, "log_id": self.log_id}) + "\n")

    def _ports_free(self, host: str, port: int, taken: list[str]) -> bool:
        """`port` (and its write lane's) free, and clear of the replicas chosen so far."""
        ports = [port] + ([port + self.write_lane_offset] if self.write_lane_offset else [])
        used = {int(a.rpartition(":")[2]) for a in taken}
        if self.write_lane_offset:
            used |= {p + self.write_lane_offset for p in used}
        return all(p < 65536 and p not in used and _port_free(host, p) for p in ports)

    # ---- lifecycle ---------------------------------------------------------------------

    def prepare(self) -> DevCluster:
        """Create the dirs, choose the addresses and initialize a brand-new log, without
        starting anything (then `start_replica(i)` starts replicas one by one)."""
        for i in range(self.replicas):
            self.replica_dir(i).mkdir(parents=True, exist_ok=True)
        self._choose_addresses()
        if self.tls:
            from rlog.certs import make_dev_pki

            make_dev_pki(self.tls_dir, [self.host_of(i) for i in range(self.replicas)])
        if self.initialize and all(is_fresh(d, self.storage_engine) for d in self.data_dirs):
            for data_dir in self.data_dirs:
                initialize(data_dir, self.storage_engine)
        return self

    def start(self, wait: bool = True, timeout: float = 30.0) -> DevCluster:
        """Prepare, start every replica, and (with `wait`) wait until a leader is
        elected and every replica still running answers.

        A quorum elects while the last replica may still be starting (seconds, on a busy
        host): a caller that then asked that replica for anything met "connection refused"."""
        self.prepare()
        for i in range(self.replicas):
            self.start_replica(i)
        if wait:
            deadline = time.monotonic() + timeout
            self.wait_for_leader(timeout)
            self.wait_for(
                lambda found: all(
                    status is not None or not self.running(i) for i, status in enumerate(found)
                ),
                max(1.0, deadline - time.monotonic()),
                "every replica to answer",
            )
        return self

    def command(self, i: int) -> list[str]:
        """The `rlog replica` command line of replica i."""
        cmd = [
            self.python,
            "-m",
            "rlog.tools.cli",
            "replica",
            "--id",
            str(i),
            "--peers",
            self.endpoint,
            "--data-dir",
            str(self.data_dir(i)),
            "--log-id",
            self.log_id,
        ]
        if self.storage_engine != AUTO:  # the default left out, as the operator leaves it
            cmd += ["--storage-engine", self.storage_engine]
        if self.auto_initialize:
            cmd.append("--auto-initialize")
        if self.election_timeout is not None:
            cmd += ["--election-timeout", str(self.election_timeout)]
        if self.max_entry_size is not None:
            cmd += ["--max-entry-size", str(self.max_entry_size)]
        if self.write_lane_offset:
            cmd += ["--write-lane-offset", str(self.write_lane_offset)]
        port = self.metrics_ports[i]
        if port is not None:
            cmd += ["--metrics-port", str(port)]
        if (health := self.health_ports[i]) is not None:
            cmd += ["--health-port", str(health)]
        if self.tls:
            from rlog.certs import DevPki

            pki = DevPki(self.tls_dir)
            name = pki.replica(i)
            cmd += ["--tls-cert", str(pki.cert(name)), "--tls-key", str(pki.key(name))]
            cmd += ["--tls-client-ca", str(pki.client_ca), "--auth-config", str(pki.auth_config)]
            if pki.split:  # a dir made before the peer CA trusts peers by name
                cmd += ["--tls-peer-ca", str(pki.peer_ca)]
        return cmd + self.replica_args

    def start_replica(self, i: int) -> None:
        """Start replica i (no-op if it runs)."""
        with self._lock:
            process = self.processes[i]
            if process is not None and process.poll() is None:
                return
            self.data_dir(i).mkdir(parents=True, exist_ok=True)
            env = self.replica_env(i)
            with open(self.log_file(i), "ab") as log:
                log.write(f"---- {time.strftime('%H:%M:%S')} starting replica {i}\n".encode())
                log.flush()
                self.processes[i] = subprocess.Popen(
                    self.command(i),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group
                    env=env,
                )

    def replica_env(self, i: int) -> dict[str, str]:
        """The environment replica i starts with (its build's PYTHONPATH: `builds`)."""
        env = dict(os.environ if self.env is None else self.env)
        if env.pop("RLOG_QUIETED_GRPC", None):  # set by the `rlog` CLI, not the user
            env.pop("GRPC_VERBOSITY", None)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if self.die_with_parent:
            env[DIE_WITH_PARENT_ENV] = str(os.getpid())
        else:
            env.pop(DIE_WITH_PARENT_ENV, None)
        build = self.builds.get(i)
        if build is not None:  # alone: this tree's path would shadow the other build
            env["PYTHONPATH"] = str(build)
        return env

    def running(self, i: int) -> bool:
        process = self.processes[i]
        return process is not None and process.poll() is None

    def pid(self, i: int) -> int | None:
        process = self.processes[i]
        return process.pid if process is not None and process.poll() is None else None

    def kill(self, i: int, sig: int = signal.SIGKILL, wait: bool = True) -> None:
        """Send `sig` to replica i's process group (default SIGKILL). With a terminating
        signal and `wait`, wait for it to exit. SIGSTOP pauses it; `resume(i)` continues."""
        process = self.processes[i]
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        if sig in (signal.SIGSTOP, signal.SIGCONT, signal.SIGTSTP) or not wait:
            return
        if sig == signal.SIGKILL:
            # A stopped process still dies on SIGKILL.
            process.wait(timeout=30)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGCONT)  # a paused replica cannot exit
            try:
                process.wait(timeout=STOP_GRACE)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)

    def pause(self, i: int) -> None:
        """SIGSTOP replica i (it keeps its sockets: peers see a hung replica)."""
        self.kill(i, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        """SIGCONT replica i."""
        self.kill(i, signal.SIGCONT)

    def stop_replica(self, i: int) -> None:
        """SIGTERM replica i, SIGKILL after a grace period; wait for it."""
        self.kill(i, signal.SIGTERM)
        self._drop_client(i)

    def restart(self, i: int, sig: int = signal.SIGTERM) -> None:
        """Stop replica i (with `sig`) and start it again on the same address and data dir."""
        self.kill(i, sig)
        self._drop_client(i)
        self.start_replica(i)

    def wipe(self, i: int) -> None:
        """Stop replica i (SIGKILL) and empty its data dir, as if its volume were lost. It
        is not restarted: call `start_replica(i)` or `restart(i)`."""
        self.kill(i, signal.SIGKILL)
        self._drop_client(i)
        shutil.rmtree(self.data_dir(i), ignore_errors=True)
        self.data_dir(i).mkdir(parents=True, exist_ok=True)

    def stop(self) -> None:
        """Stop every replica: SIGTERM to each group, SIGKILL after a grace period."""
        for process in self.processes:
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGCONT)
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for process in self.processes:
            if process is None:
                continue
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(timeout=30)
            # Anything left in the group (the replica is its leader, it forks nothing).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        for i in list(self._clients):
            self._drop_client(i)

    def __enter__(self) -> DevCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # ---- observing ---------------------------------------------------------------------

    def client(self, i: int | None = None, **kwargs: Any) -> Client:
        """A new blocking client of every replica (or only replica i). Close it yourself."""
        if self.tls:
            kwargs.setdefault("credentials", self.credentials())
        return Client(self.addresses if i is None else [self.addresses[i]], **kwargs)

    def _status_client(self, i: int) -> Client:
        client = self._clients.get(i)
        if client is None:
            credentials = self.credentials() if self.tls else None
            client = Client(
                self.addresses[i],
                timeout=1.0,
                credentials=credentials,
                connect_wait=0,
                channel_options=POLLING_BACKOFF,
            )
            self._clients[i] = client
        return client

    def _drop_client(self, i: int) -> None:
        client = self._clients.pop(i, None)
        if client is not None:
            client.close()

    def status(self, i: int, timeout: float = 1.0) -> pb.StatusResponse:
        """Replica i's status (raises RlogError if it does not answer in time)."""
        client = self._status_client(i)
        client._async.timeout = timeout
        return client.status()

    def statuses(self, timeout: float = 1.0) -> list[pb.StatusResponse | None]:
        """Every replica's status, None for those that do not answer (asked concurrently)."""
        results: list[pb.StatusResponse | None] = [None] * self.replicas

        def ask(i: int) -> None:
            if self.running(i):
                with contextlib.suppress(RlogError):
                    results[i] = self.status(i, timeout)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(self.replicas)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return results

    def leader(self, timeout: float = 1.0) -> int | None:
        """The id of the replica that says it leads (None if none does, or several do)."""
        return _the_leader(self.statuses(timeout))

    def wait_for_leader(self, timeout: float = 30.0, exclude: Sequence[int] = ()) -> int:
        """Wait until exactly one replica leads (optionally not one of `exclude`); returns its
        id. Raises RlogError with the replicas' logs' tails on timeout, or when every
        replica process has exited."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.statuses()
            leader = _the_leader(found)
            if leader is not None and leader not in exclude:
                return leader
            if not any(self.running(i) for i in range(self.replicas)):
                raise RlogError(f"every replica exited; see {self.dir}/replica-*/replica.log")
            if time.monotonic() > deadline:
                besides = f" besides {list(exclude)}" if exclude else ""
                raise RlogError(
                    f"no leader{besides} elected within {timeout:g} s "
                    f"({_describe(found)})\n{self._tails()}"
                )
            time.sleep(0.05)

    def wait_for(self, predicate: Any, timeout: float = 30.0, what: str = "the condition") -> None:
        """Poll `predicate(statuses)` (a list as `statuses()` returns) until true."""
        deadline = time.monotonic() + timeout
        while not predicate(found := self.statuses()):
            if time.monotonic() > deadline:
                raise RlogError(
                    f"timed out after {timeout:g} s waiting for {what} "
                    f"({_describe(found)})\n{self._tails()}"
                )
            time.sleep(0.05)

    def _tails(self) -> str:
        return "\n".join(
            f"--- replica {i} log tail:\n{self.log_tail(i, 15)}" for i in range(self.replicas)
        )

    def log_tail(self, i: int, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_file(i).read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _default_dir() -> Path:
    base = Path.home() / ".cache" / "rlog-dev"
    try:
        base.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="log-", dir=base))
    except OSError:
        return Path(tempfile.mkdtemp(prefix="rlog-dev-"))
