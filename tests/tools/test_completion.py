"""`rlog completion bash|zsh|tcsh`: a script generated from the CLI's own parser. The bash
one is loaded into a real bash and asked what a TAB offers, as bash's programmable
completion would."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

RLOG = [sys.executable, "-m", "rlog.tools.cli"]


def script(shell: str) -> str:
    out = subprocess.run([*RLOG, "completion", shell], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def offered(completion: str, *words: str) -> list[str]:
    """COMPREPLY after a TAB at the end of `rlog WORDS...` (the last word may be "")."""
    line = " ".join(("rlog", *words))
    probe = (
        f"{completion}\n"
        f"COMP_WORDS=(rlog {' '.join(repr(w) for w in words)}); "
        f"COMP_CWORD={len(words)}; COMP_LINE={line!r}; COMP_POINT={len(line)}; "
        '_shtab_rlog; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    out = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [w for w in out.stdout.split() if w]


@pytest.mark.skipif(shutil.which("bash") is None, reason="no bash")
def test_bash_completes_commands_and_each_commands_flags():
    completion = script("bash")
    assert offered(completion, "ap") == ["append"]
    assert {"replica", "dev", "append", "read", "status", "completion"} <= set(
        offered(completion, "")
    )
    flags = offered(completion, "append", "--")
    assert {"--endpoint", "--stdin", "--if-next"} <= set(flags)
    assert "--data-dir" not in flags  # the replica's, not append's
    assert "--data-dir" in offered(completion, "replica", "--")


def test_zsh_and_tcsh_scripts_name_the_commands():
    assert script("zsh").startswith("#compdef rlog")
    assert "append" in script("tcsh")


def test_an_unknown_shell_is_refused_by_name():
    out = subprocess.run([*RLOG, "completion", "fish"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "invalid choice: 'fish'" in out.stderr and "Traceback" not in out.stderr
