"""The test process forks to exec beside gRPC calls (PySpark starting its JVM after earlier
tests left gRPC threads running). With gRPC's fork handlers on, some children died before
exec (the Spark tests failed at setup with "Java gateway process exited") and some hung in
gRPC's after-fork handler, and their parent in Popen with them; conftest.py turns the
handlers off for the test process, and these tests hold it to that."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

PROBE = Path(__file__).parent / "fork_exec_probe.py"
FORKS = 400  # with the handlers on, 2.5 % of such children failed: ~10 of these would


def test_the_handlers_are_off_for_the_test_process() -> None:
    assert os.environ["GRPC_ENABLE_FORK_SUPPORT"].lower() in ("false", "0")


def test_children_forked_beside_grpc_calls_all_reach_exec() -> None:
    # The probe inherits this process's environment, so it runs as this process does; in a
    # session of its own, so that a hung child of it goes with it.
    probe = subprocess.Popen(
        [sys.executable, str(PROBE), str(FORKS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = probe.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(probe.pid, signal.SIGKILL)
        probe.communicate()
        raise AssertionError("a child forked beside gRPC calls hung before exec") from None
    assert probe.returncode == 0, err[-2000:]
    assert out.strip() == f"0 of {FORKS} children failed before exec", out
