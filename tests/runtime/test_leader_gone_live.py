"""A killed leader is replaced before an election timeout of silence has passed
(runtime/leader_links.py, `Election.leader_gone`): real replica processes, the leader
SIGKILLed, its write connections (the gRPC WriteStream, and the write lane where the log
has one) closed by the kernel at once. The election timeout is 10 s here, so the timer
alone would stand no one before about 10 s after the last heartbeat; the followers must
elect the next leader well before that, and they must say why in their logs."""

from __future__ import annotations

import signal
import time

import pytest
from live import append_acked

from rlog.client import Client
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

T = 10.0  # the election timeout: the sign's wait is T/4 to T/2 (2.5 to 5 s)


@pytest.mark.parametrize("lane", [0, 1], ids=["stream", "write lane"])
def test_a_killed_leader_is_replaced_before_the_timeout(tmp_path, lane):
    with DevCluster(3, tmp_path, election_timeout=T, write_lane_offset=lane) as cluster:
        leader = cluster.wait_for_leader(timeout=4 * T)
        with Client(cluster.addresses, timeout=5.0) as client:
            append_acked(client, [b"before"])  # the leader's write connections are open
        cluster.kill(leader, signal.SIGKILL)
        killed = time.monotonic()
        successor = cluster.wait_for_leader(timeout=4 * T, exclude=[leader])
        took = time.monotonic() - killed
        # The timer alone: T to 2T after the last heartbeat (sent every 0.2 s).
        assert took < T - 2, f"replica {successor} led {took:.1f} s after the kill"
        said = [cluster.log_file(i).read_text() for i in range(3) if i != leader]
        assert all(f"replica {leader}'s write connections all closed" in s for s in said)
        with Client(cluster.addresses, timeout=5.0) as client:
            append_acked(client, [b"after"])
