"""Every module of `rlog` and `rlog_operator` imports on its own, in a fresh interpreter with
nothing imported before it: a missing import or a cycle that another module's import order
hides shows up here. (The import graph itself is checked by test_import_cycles.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "rlog": ROOT / "replica_image" / "rlog",
    "rlog_operator": ROOT / "operator" / "rlog_operator",
}


def _modules() -> list[str]:
    modules: list[str] = []
    for package, directory in PACKAGES.items():
        for path in sorted(directory.rglob("*.py")):
            parts = [package, *path.relative_to(directory).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            modules.append(".".join(parts))
    return sorted(modules)


@pytest.mark.parametrize("module", _modules())
def test_module_imports_alone(module: str) -> None:
    result = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
