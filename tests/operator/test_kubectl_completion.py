"""`kubectl_complete-rlog` (rlog_operator/plugin/completion.py): what a TAB offers after
`kubectl rlog`, from the plugin's own parser; the log names come from the function given
(the API in use: e2e/operator/test_kubectl_rlog.py completes against a real cluster)."""

from __future__ import annotations

import subprocess
import sys

from rlog_operator.plugin.completion import choices

LOGS = {"team-a": ["orders", "payments"], "default": ["events"]}


def names(asked: list[str | None]):
    def of(namespace: str | None) -> list[str]:
        asked.append(namespace)
        return LOGS.get(namespace or "default", [])

    return of


def test_commands_then_flags_then_log_names():
    asked: list[str | None] = []
    assert "status" in choices([""], names(asked))
    assert choices(["re"], names(asked)) == [
        "reinitialize",
        "replace-volume",
        "report",
        "restore",
        "resume",
    ]
    assert choices(["status", "--n"], names(asked)) == ["--namespace"]
    assert choices(["status", ""], names(asked)) == ["events"]
    assert choices(["-n", "team-a", "status", "p"], names(asked)) == ["payments"]
    assert choices(["status", "--namespace=team-a", ""], names(asked)) == ["orders", "payments"]
    assert asked == [None, "team-a", "team-a"]  # asked only where a log's name goes


def test_fixed_choices_and_nothing_where_nothing_fits():
    never: list[str | None] = []
    assert choices(["certificate", "orders", "--role", ""], names(never)) == [
        "append",
        "owner",
        "read",
    ]
    assert choices(["restore", "orders", ""], names(never)) == []  # NEW: a name not yet used
    assert choices(["status", "orders", ""], names(never)) == []  # one log per command
    assert choices(["bogus", ""], names(never)) == []
    assert choices(["backup", "x", "--timeout", ""], names(never)) == []  # a number
    assert "--version" not in choices(["backup", "x", "--"], names(never))  # not after it
    assert never == []


def test_the_executable_ends_with_the_no_files_directive_and_never_fails():
    """Without a cluster (a kubeconfig that does not exist) there are no names, and
    nothing but the choices reaches the terminal."""
    out = subprocess.run(
        [
            *(sys.executable, "-m", "rlog_operator.plugin.completion"),
            *("status", "--kubeconfig", "/nonexistent/kubeconfig", ""),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.splitlines() == [":4"]
