"""Running the real `rlog` console script as a subprocess, and the check of a failed run: one
line on stderr, no traceback, the expected exit code."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

RLOG = shutil.which("rlog", path=str(Path(sys.executable).parent)) or "rlog"


def rlog(
    *args: str, stdin: bytes | None = None, timeout: float = 60
) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RLOG_ENDPOINT", "RLOG_DEBUG")}
    return subprocess.run(
        [RLOG, *args],
        input=stdin,
        capture_output=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def assert_one_line_error(result: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    stderr = result.stderr.decode()
    assert result.returncode == code, (result.returncode, stderr, result.stdout)
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert lines[0].startswith("rlog")
    return lines[0]
