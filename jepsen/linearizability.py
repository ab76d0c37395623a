"""Build (cached) and run the Go linearizability checker on a history file."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD_SCRIPT = HERE / "build-checker.sh"

LINEARIZABLE, VIOLATION, BAD_INPUT, TIMED_OUT = 0, 1, 2, 3


def build() -> Path:
    """The checker binary, built by build-checker.sh into the cache dir if missing or old."""
    out = subprocess.run(
        [str(BUILD_SCRIPT)], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.strip()
    return Path(out.splitlines()[-1])


@dataclass
class Verdict:
    status: int  # the checker's exit status
    verdict: str
    operations: int
    seconds: float  # the check itself (Porcupine), as the checker measured it
    visualization: Path | None

    @property
    def linearizable(self) -> bool:
        return self.status == LINEARIZABLE


def check(
    history: Path, visualize: Path | None = None, timeout_s: float = 300.0, model: str = "log"
) -> Verdict:
    """`model`: "log" (appends and reads) or "registers" (fetch and compare-and-set store
    of named registers, as rlog.state's variables; checker/registers.go)."""
    binary = build()
    cmd = [str(binary), "-json", f"-timeout={timeout_s}s", f"-model={model}"]
    if visualize is not None:
        cmd += ["-visualize", str(visualize)]
    done = subprocess.run([*cmd, str(history)], capture_output=True)
    if done.returncode == BAD_INPUT:
        raise ValueError(f"the checker refused {history}: {done.stderr.decode().strip()}")
    summary = json.loads(done.stdout)
    written = visualize if visualize is not None and visualize.exists() else None
    return Verdict(
        done.returncode,
        summary["verdict"],
        summary["operations"],
        summary["check_seconds"],
        written,
    )
