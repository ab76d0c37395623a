"""Plaintext is safe by construction (runtime/plaintext.py; docs/security.md, "Plaintext").

Real replicas bound to this host's own non-loopback address (the test is skipped on a host
without one): a caller that reaches a plaintext replica there may not call the Admin API
(StepDown, GrantPermit, RevokePermit), while the same call from loopback is answered and
`--admin-from-anywhere` opens it again; and a plaintext replica refuses to listen beyond
loopback at all unless started with `--insecure`, which Status then shows.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from live import wait_until

from rlog.client import Client
from rlog.client.errors import PermissionDenied, RlogError
from rlog.tools.dev import DevCluster, free_port

SIOCGIFADDR = 0x8915


def host_address() -> str | None:
    """An IPv4 address of this host's own that is not loopback (None: it has none)."""
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                packed = fcntl.ioctl(
                    sock.fileno(), SIOCGIFADDR, struct.pack("256s", name[:15].encode())
                )
            except OSError:
                continue
        address = socket.inet_ntoa(packed[20:24])
        if not ipaddress.ip_address(address).is_loopback:
            return address
    return None


HOST = host_address()
needs_host_address = pytest.mark.skipif(HOST is None, reason="no non-loopback address here")


class WideCluster(DevCluster):
    """Replicas known to each other by HOST, each bound to 0.0.0.0 (so reachable on
    127.0.0.1 too), plaintext, with --insecure."""

    def command(self, i: int) -> list[str]:
        port = self.addresses[i].rpartition(":")[2]
        return [*super().command(i), "--listen", f"0.0.0.0:{port}", "--insecure"]


@pytest.fixture
def wide(tmp_path: Path) -> Iterator[DevCluster]:
    assert HOST is not None
    with WideCluster(3, tmp_path, host=HOST, election_timeout=0.5, log_id="wide") as cluster:
        yield cluster


def on_loopback(address: str) -> str:
    return f"127.0.0.1:{address.rpartition(':')[2]}"


@needs_host_address
def test_admin_calls_from_beyond_loopback_are_refused_in_plaintext(wide: DevCluster) -> None:
    leader = wide.wait_for_leader()
    before = wide.status(leader, timeout=5)
    assert before.admin == "loopback" and before.insecure and before.transport == "plaintext"
    with Client(wide.endpoints[leader], timeout=5) as stranger:  # HOST: not loopback
        with pytest.raises(PermissionDenied, match="loopback only"):
            stranger.step_down()
        with pytest.raises(PermissionDenied, match="loopback only"):
            stranger.grant_permit("wide")
        with pytest.raises(PermissionDenied, match="loopback only"):
            stranger.revoke_permit("wide")
    # The leader stayed: same replica, same proposal (no election was started).
    after = wide.status(leader, timeout=5)
    assert after.role == "leader" and after.proposal == before.proposal
    assert "Admin call refused" in wide.log_file(leader).read_text()
    # From loopback the same call is answered: the leader steps down.
    with Client(on_loopback(wide.endpoints[leader]), timeout=5) as local:
        local.step_down()
    wait_until(
        lambda: any(
            s is not None and s.role == "leader" and s.proposal > before.proposal
            for s in wide.statuses(timeout=2)
        ),
        30,
        "a new leadership after the step-down from loopback",
    )


@needs_host_address
def test_admin_from_anywhere_answers_every_caller(tmp_path: Path) -> None:
    assert HOST is not None
    with WideCluster(
        3,
        tmp_path,
        host=HOST,
        election_timeout=0.5,
        log_id="wide",
        replica_args=["--admin-from-anywhere"],
    ) as cluster:
        leader = cluster.wait_for_leader()
        before = cluster.status(leader, timeout=5)
        assert before.admin == "anywhere"
        with Client(cluster.endpoints[leader], timeout=5) as stranger:
            stranger.step_down()
        wait_until(
            lambda: any(
                s is not None and s.role == "leader" and s.proposal > before.proposal
                for s in cluster.statuses(timeout=2)
            ),
            30,
            "a new leadership after the step-down from beyond loopback",
        )


def _replica(tmp_path: Path, listen: str, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "rlog.tools.cli",
        "replica",
        "--id",
        "0",
        "--peers",
        listen,
        "--data-dir",
        str(tmp_path / "data"),
        "--log-id",
        "plain",
        *extra,
    ]


@pytest.mark.parametrize("where", ["0.0.0.0", "host"])
def test_plaintext_beyond_loopback_needs_insecure(tmp_path: Path, where: str) -> None:
    host = "0.0.0.0" if where == "0.0.0.0" else HOST
    if host is None:
        pytest.skip("no non-loopback address here")
    address = f"{host}:{free_port(host)}"
    refused = subprocess.run(
        _replica(tmp_path, address), capture_output=True, text=True, timeout=20
    )
    assert refused.returncode != 0
    assert "refusing to serve PLAINTEXT" in refused.stderr, refused.stderr
    assert "--insecure" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "data").exists() or not any((tmp_path / "data").iterdir())


def answers(client: Client) -> bool:
    try:
        return client.status().id == 0
    except RlogError:
        return False


def test_insecure_starts_warns_and_says_so_in_status(tmp_path: Path) -> None:
    port = free_port("0.0.0.0")
    log = tmp_path / "replica.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            _replica(tmp_path, f"127.0.0.1:{port}", "--listen", f"0.0.0.0:{port}", "--insecure"),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        with Client(f"127.0.0.1:{port}", timeout=5) as client:
            wait_until(lambda: answers(client), 30, "the replica to answer")
            status = client.status()
        assert status.insecure and status.transport == "plaintext"
        assert "--insecure" in log.read_text()
    finally:
        process.terminate()
        process.wait(timeout=30)
