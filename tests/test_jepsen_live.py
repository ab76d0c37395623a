"""Short live runs of the consistency suite: concurrent clients append (single values and
batches) and read through three real replicas, without faults and then under a short seeded
mix of process faults (SIGSTOP, SIGKILL and restart, wiped data dirs; no partitions: they
need root); the recorded history must be linearizable (Porcupine) and pass every direct
check. The long runs, with partitions, are `make jepsen` (see docs/jepsen.md)."""

from __future__ import annotations

import pytest

from jepsen.run import RunConfig, run_once

pytestmark = pytest.mark.slow


def test_a_fault_free_run_is_linearizable(tmp_path):
    result = run_once(RunConfig(seed=7, seconds=4.0, nemesis=[], out=tmp_path), log=False)
    assert result.error == ""
    assert result.verdict is not None
    assert result.verdict.verdict == "linearizable", f"see {tmp_path}/history.jsonl"
    assert {name: problems for name, problems in result.problems.items() if problems} == {}
    assert result.operations > 0
    assert result.faults == 0


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
