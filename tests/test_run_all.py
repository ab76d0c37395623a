"""tests/run_all.sh (`make test`'s runner) on real commands: every suite's failure reaches the
exit status, a failed e2e command stops the ones after it (they need it), the unit suite's
output is shown, and bad usage is refused with a reason."""

from __future__ import annotations

import subprocess
from pathlib import Path

RUN_ALL = Path(__file__).parent / "run_all.sh"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUN_ALL), *args], capture_output=True, text=True, timeout=60, check=False
    )


def test_both_pass_and_the_unit_output_is_shown():
    done = run("echo", "unit-said-this", "--", "true", "echo e2e-said-this")
    assert done.returncode == 0, done.stderr
    assert "unit-said-this" in done.stdout and "e2e-said-this" in done.stdout
    assert "unit suite: passed" in done.stderr and "e2e suites: passed" in done.stderr


def test_a_unit_failure_fails_the_run_after_the_e2e_commands_ran(tmp_path):
    marker = tmp_path / "e2e-ran"
    done = run("false", "--", f"touch {marker}")
    assert done.returncode == 1
    assert marker.exists()
    assert "unit suite: FAILED (rc 1)" in done.stderr and "e2e suites: passed" in done.stderr


def test_a_failed_e2e_command_stops_the_next_and_fails_the_run(tmp_path):
    marker = tmp_path / "second-ran"
    done = run("true", "--", "exit 3", f"touch {marker}")
    assert done.returncode == 1
    assert not marker.exists()
    assert "FAILED: exit 3" in done.stderr and "unit suite: passed" in done.stderr


def test_bad_usage_is_refused():
    for args in ((), ("true",), ("true", "--"), ("--", "true")):
        done = run(*args)
        assert done.returncode == 2, args
        assert "usage" in done.stderr or "no e2e command" in done.stderr, args
