"""Raw socket reads for the tests that speak a replica's lane protocol by hand."""

from __future__ import annotations

import socket
import ssl


def recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        assert chunk, f"connection closed after {len(data)} of {n} bytes"
        data += chunk
    return data


def closed(sock: socket.socket) -> bool:
    """The replica closed the connection (EOF within 10 s; over TLS, an alert or EOF)."""
    sock.settimeout(10)
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True
