"""How long one connection attempt may take (wire.CONNECT_TIMEOUT_MS), against a real
replica process behind a TCP relay that holds each new connection for a while, as a busy
replica (a loaded node) answers a handshake late; and an address that swallows packets (a
deleted pod's) still fails over before a call's own timeout.

Once, `grpc.min_reconnect_backoff_ms` was 100 ms, which gRPC takes as the time a connection
attempt may take: a replica that was 100 ms late to finish a handshake failed fresh
connections with UNAVAILABLE ("connection attempt timed out before receiving SETTINGS
frame"), which e2e runs on a loaded machine saw as replicas "failing to connect"."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from rlog.client import Client
from rlog.tools.dev import DevCluster
from rlog.wire import CONNECT_TIMEOUT_MS


class Relay:
    """Forwards 127.0.0.1:port to `upstream`, holding each new connection `delay` seconds
    before the first byte passes, or forever (`delay` None: a black hole)."""

    def __init__(self, upstream: str, delay: float | None) -> None:
        host, port = upstream.rsplit(":", 1)
        self.upstream = (host, int(port))
        self.delay = delay
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.accepted: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.held.append(conn)
            self.accepted.append(conn)
            if self.delay is not None:
                threading.Thread(target=self._relay, args=(conn,), daemon=True).start()

    def _relay(self, conn: socket.socket) -> None:
        time.sleep(self.delay or 0)
        up = socket.create_connection(self.upstream)
        self.held.append(up)
        for a, b in ((conn, up), (up, conn)):
            threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()
        for s in self.held:
            s.close()


@pytest.fixture(scope="module")
def replica(tmp_path_factory) -> Iterator[DevCluster]:
    with DevCluster(1, tmp_path_factory.mktemp("one")) as cluster:
        cluster.wait_for_leader()
        yield cluster


def test_a_replica_slow_to_answer_a_new_connection_is_still_reached(replica):
    late = CONNECT_TIMEOUT_MS / 1000 / 4  # far beyond the old 100 ms, well inside the limit
    for _ in range(3):
        # A fresh relay (a new address) each time: gRPC's process-wide subchannel pool can
        # hand a new channel to the same address the previous client's still-open
        # connection, which then never meets the relay's hold.
        relay = Relay(replica.endpoint, delay=late)
        try:
            t0 = time.monotonic()
            with Client(relay.address, timeout=5.0) as client:
                status = client.status()
            took = time.monotonic() - t0
            assert status.learned >= 0
            assert len(relay.accepted) == 1  # one connection, and it went through the hold
            assert took >= late, took  # so no answer could come before the hold ended
        finally:
            relay.close()


def test_an_address_that_swallows_packets_fails_over_before_the_call_times_out(replica):
    hole = Relay(replica.endpoint, delay=None)
    try:
        with Client([hole.address, replica.endpoint], timeout=5.0, append_timeout=5.0) as client:
            t0 = time.monotonic()
            (position,) = client.append([b"after a black hole"])
            took = time.monotonic() - t0
        assert position > 0
        # abandoned after one connection attempt, then the next endpoint: not the call's 5 s
        assert took < 5.0, took
    finally:
        hole.close()
