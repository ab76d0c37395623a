"""A timer decides from one version of its object.

kopf gives a timer the live body: each watch event replaces its contents, also while the
handler awaits. An observe tick that read spec.replicas = 3 before an await and 5 after it
once wrote a status listing five replicas of a three-replica log next to the refusal of that
very change (e2e test_a_replicas_change_past_the_crd_is_refused_by_the_operator, CI
2026-11-28)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import kopf

from rlog_operator import handlers, specs

HANDLERS = Path(__file__).resolve().parents[2] / "operator" / "rlog_operator" / "handlers.py"


def _log(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "rlog.io/v1alpha1",
        "kind": "ReplicatedLog",
        "metadata": {"name": "log", "namespace": "ns", "annotations": {"a": "1"}},
        "spec": {"replicas": replicas},
    }


def test_a_snapshot_keeps_the_version_it_was_taken_from() -> None:
    live = kopf.Body(_log(3))  # type: ignore[arg-type]
    frozen = handlers.snapshot(live)
    live._replace_with(_log(5))  # type: ignore[arg-type]  # what kopf does on a watch event
    assert specs.replicas_of(live) == 5  # the race: kopf's body moved under the handler
    assert specs.replicas_of(frozen) == 3
    assert dict(frozen.metadata.annotations) == {"a": "1"}


def test_a_snapshot_shares_nothing_with_the_live_body() -> None:
    raw = _log(3)
    frozen = handlers.snapshot(kopf.Body(raw))  # type: ignore[arg-type]
    raw["spec"]["replicas"] = 7
    raw["metadata"]["annotations"]["a"] = "2"
    assert specs.replicas_of(frozen) == 3
    assert frozen.metadata.annotations["a"] == "1"


def _handles_the_log(decorator: ast.expr) -> bool:
    """@kopf.timer/daemon(...) or @kopf.on.create/update/resume/delete(...) on the CR."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    if not isinstance(target, ast.Attribute):
        return False
    if target.attr in ("timer", "daemon"):
        return True
    return target.attr in ("create", "update", "resume", "delete", "field") and (
        ast.unparse(target.value) == "kopf.on"
    )


def test_every_handler_of_the_log_takes_a_snapshot_first() -> None:
    tree = ast.parse(HANDLERS.read_text())
    handlers_of_the_log = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef | ast.FunctionDef)
        and any(_handles_the_log(d) for d in node.decorator_list)
    ]
    names = {fn.name for fn in handlers_of_the_log}
    assert {"observe", "reconcile"} <= names, f"handlers renamed or moved: {names}"
    for fn in handlers_of_the_log:
        statements = fn.body[1:] if ast.get_docstring(fn) else fn.body
        assert ast.unparse(statements[0]).startswith("body = snapshot(body)"), (
            f"handlers.py:{fn.lineno}: {fn.name} reads kopf's live body; begin it with "
            "`body = snapshot(body)`"
        )
