"""`rlog.tools.dev.free_port`: the ports test clusters listen on come from below the kernel's
ephemeral range, where no outgoing connection takes its source port."""

from __future__ import annotations

import socket

from rlog.tools.dev import _ephemeral_range, free_port


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
