"""`rlog.tools.dev.free_port`: the ports test clusters listen on come from below the kernel's
ephemeral range, where no outgoing connection takes its source port."""

from __future__ import annotations

import socket

from rlog.tools.dev import _ephemeral_range, _port_free, free_port


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
