"""`rlog.tools.dev.free_port`: the ports test clusters listen on come from below the kernel's
ephemeral range, where no outgoing connection takes its source port."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from rlog.tools.dev import (
    LISTEN_PORTS_ENV,
    _ephemeral_range,
    _port_free,
    claim_port,
    free_port,
    listen_ports_slice,
)


def test_free_ports_are_below_the_ephemeral_range_and_bindable():
    low, high = _ephemeral_range()
    assert 0 < low <= high
    ports = {free_port() for _ in range(50)}
    assert len(ports) > 40  # random, so concurrent callers rarely meet
    for port in ports:
        assert port < low, (port, low)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_a_listening_port_is_never_chosen():
    taken = []
    try:
        for _ in range(200):
            sock = socket.socket()
            sock.bind(("127.0.0.1", free_port()))
            sock.listen()
            taken.append(sock)
        ports = {s.getsockname()[1] for s in taken}
        assert len(ports) == len(taken)  # each free_port() avoided every listener before it
    finally:
        for sock in taken:
            sock.close()


def test_a_port_in_time_wait_is_never_chosen():
    """A server with SO_REUSEADDR (gRPC's and asyncio's do) that closed an accepted connection
    first leaves it in TIME_WAIT on its own port: a plain bind there fails for a minute."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", free_port()))
    server.listen()
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first, so it is the one in TIME_WAIT
    assert client.recv(1) == b""
    client.close()
    server.close()
    with socket.socket() as plain:
        try:
            plain.bind(("127.0.0.1", port))
        except OSError:
            pass
        else:  # pragma: no cover - the kernel let it go; nothing to check then
            raise AssertionError(f"port {port} was not left in TIME_WAIT; the test needs it")
    assert not _port_free("127.0.0.1", port)


def test_a_port_is_never_handed_out_twice_in_one_process():
    """Clusters started at once from threads of one process each choose ports before any
    replica binds them: the same random port chosen twice made one replica fail "Address
    already in use" and another cluster's replica answer in its place. 600 draws from the
    ~18k ports below the ephemeral range collide with near certainty unless the process
    remembers what it handed out."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        ports = list(pool.map(lambda _: free_port("127.0.0.2"), range(600)))
    assert len(set(ports)) == len(ports)


def _draw_in_a_process(slice_: str | None, host: str, count: int) -> list[int]:
    """`count` ports from free_port in a process of their own, with RLOG_LISTEN_PORTS=slice_."""
    env = {k: v for k, v in os.environ.items() if k != LISTEN_PORTS_ENV}
    if slice_ is not None:
        env[LISTEN_PORTS_ENV] = slice_
    code = (
        "from rlog.tools.dev import free_port\n"
        f"print(' '.join(str(free_port({host!r})) for _ in range({count})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return [int(p) for p in done.stdout.split()]


def test_processes_side_by_side_never_hand_out_the_same_port():
    """Parallel test workers are processes that do not know each other's claims: two that drew
    the same random port both saw it free before either bound it. Each gets its own slice of
    the ports (tests/conftest.py gives every worker listen_ports_slice(i, n)); 600 draws each
    from the ~18k ports below the ephemeral range would meet with near certainty otherwise."""
    slices = [listen_ports_slice(i, 2) for i in range(2)]
    drawn = [_draw_in_a_process(s, "127.0.0.3", 600) for s in slices]
    assert not set(drawn[0]) & set(drawn[1])
    for slice_, ports in zip(slices, drawn, strict=True):
        low, high = (int(p) for p in slice_.split("-"))
        assert all(low <= p < high for p in ports), slice_


def test_a_port_outside_the_slice_is_never_claimed(monkeypatch):
    """A write lane at port + offset past the slice's end would be a port of the next slice."""
    low, high = 20000, 20100
    monkeypatch.setenv(LISTEN_PORTS_ENV, f"{low}-{high}")
    assert not claim_port("127.0.0.3", high)
    assert not claim_port("127.0.0.3", low - 1)
    assert all(low <= free_port("127.0.0.3") < high for _ in range(20))


@pytest.mark.parametrize("value", ["20000", "20100-20000", "x-y", "0-5", "1-70000"])
def test_a_malformed_slice_is_refused_with_its_value(monkeypatch, value):
    monkeypatch.setenv(LISTEN_PORTS_ENV, value)
    with pytest.raises(ValueError, match=LISTEN_PORTS_ENV):
        free_port()
