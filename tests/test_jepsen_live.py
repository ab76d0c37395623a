"""A short live run of the consistency suite WITHOUT faults: concurrent clients append and
read through three real replicas, and the recorded history must be linearizable (Porcupine)
and pass every direct check. The runs with faults, which find today's stale reads through a
cut-off leader, are `make jepsen` (see docs/jepsen.md)."""

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
