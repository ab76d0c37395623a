"""A replica asked to stop (SIGTERM) while it leads steps down first (--drain-timeout):
real 3-replica logs, a continuous writer. The counts of failed appends with and without
the drain are a measurement (bench/drain.py); here the behaviour: the old leader saw another
replica lead before it exited, and no acknowledged append was lost either way."""

from __future__ import annotations

import signal

import pytest

from bench.drain import run
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow


def test_a_leader_asked_to_stop_steps_down_and_waits_for_the_next_leader(tmp_path):
    result = run(tmp_path, drain_timeout=10.0, before=1.0)
    assert result.drained, result
    assert result.acked > 0
    assert result.missing == 0, result


def test_without_a_drain_timeout_the_leader_stops_at_once(tmp_path):
    result = run(tmp_path, drain_timeout=0.0, before=1.0)
    assert not result.drained, result
    assert result.missing == 0, result


def test_a_follower_asked_to_stop_does_not_drain(tmp_path):
    with DevCluster(3, tmp_path, replica_args=["--drain-timeout", "10"]) as cluster:
        leader = cluster.wait_for_leader()
        follower = (leader + 1) % 3
        cluster.kill(follower, signal.SIGTERM, wait=True)
        log = cluster.log_file(follower).read_text()
        assert "stepping down first" not in log
        assert cluster.leader() == leader  # nothing changed for the log
