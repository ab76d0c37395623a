"""Short live runs of the consistency suite: concurrent clients append (single values and
batches; plain, idempotent through a session, conditional on the next position, fenced by
a writer epoch) and read (linearizable, and stale bounded by min_position) through three
real replicas, without faults and then under a short seeded
mix of process faults (SIGSTOP, SIGKILL and restart, wiped data dirs; no partitions: they
need root); the recorded history must be linearizable (Porcupine) and pass every direct
check. The long runs, with partitions, are `make jepsen` (see docs/jepsen.md)."""

from __future__ import annotations

import pytest

from jepsen.history import APPENDS, READS, TAKE_EPOCH, History, load
from jepsen.nemesis import Nemesis, Step
from jepsen.run import RunConfig, run_once
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow


def test_a_fault_free_run_is_linearizable(tmp_path):
    result = run_once(RunConfig(seed=7, seconds=4.0, nemesis=[], out=tmp_path), log=False)
    assert result.error == ""
    assert result.verdict is not None
    assert result.verdict.verdict == "linearizable", f"see {tmp_path}/history.jsonl"
    assert {name: problems for name, problems in result.problems.items() if problems} == {}
    assert result.operations > 0
    assert result.faults == 0
    # Every operation kind was performed and completed at least once.
    done = {op.f for op in load(tmp_path / "history.jsonl") if op.result == "ok"}
    assert done == {*APPENDS, *READS, TAKE_EPOCH}


def test_a_short_run_under_process_faults_is_linearizable(tmp_path):
    kinds = [
        "pause-leader",
        "pause-random",
        "kill-leader",
        "kill-random",
        "wipe-leader",
        "wipe-random",
    ]
    result = run_once(
        RunConfig(
            seed=3,
            seconds=12.0,
            nemesis=kinds,
            out=tmp_path,
            hold=(0.3, 1.2),
            interval=(0.1, 0.6),
        ),
        log=False,
    )
    assert result.error == ""
    assert result.verdict is not None
    assert result.verdict.verdict == "linearizable", f"see {tmp_path}/history.jsonl"
    assert {name: problems for name, problems in result.problems.items() if problems} == {}
    assert result.faults > 0 and result.operations > 0


def test_a_wipe_waits_for_a_voting_quorum_without_its_target(tmp_path):
    """wipe-random never wipes a replica while the others are not a VOTING quorum (that
    could destroy the last copy of a value); once they are, it wipes one and it recovers."""
    with DevCluster(3, tmp_path / "cluster") as cluster:
        leader = cluster.wait_for_leader()
        down, target = [i for i in range(3) if i != leader]
        cluster.kill(down)  # the others without `target`: the leader alone
        nemesis = Nemesis(cluster, ["wipe-random"], 0.5, History(), quorum_wait=1.0)
        # pick 0.75: the second non-leader, `target`
        step = Step("wipe-random", wait=0.0, hold=0.0, pick=0.75)
        assert nemesis.inject(step) is None
        assert nemesis.skipped == ["wipe-random"] and nemesis.faults == []
        assert any(cluster.data_dir(target).iterdir()), "the data dir was touched"

        cluster.start_replica(down)
        cluster.wait_for(
            lambda sts: all(s is not None and s.status == pb.VOTING for s in sts),
            what="every replica VOTING",
        )
        fault = nemesis.inject(step)
        assert fault is not None and fault.targets == [target]
        assert not any(cluster.data_dir(target).iterdir()), "the data dir was not wiped"
        nemesis.heal()  # restarted empty: EMPTY -> RECOVERING -> VOTING
        cluster.wait_for(
            lambda sts: sts[target] is not None and sts[target].status == pb.VOTING,
            what="the wiped replica VOTING again",
        )
        assert nemesis.wiped == {target}
