"""Every call the operator makes to a replica presents the operator's credentials: on a TLS
log (the default) a call without them fails its handshake, which once left the
`rlog.io/step-down` annotation unserved while every unit test passed."""

from __future__ import annotations

import ast
from pathlib import Path

OPERATOR = Path(__file__).resolve().parents[2] / "operator" / "rlog_operator"
# the helpers of rlog_operator.replica_calls that open a client to a replica, and where their
# credentials argument sits
REPLICA_CALLS = {"replica_call": 3, "replica_status": 1, "status_client": 1}


def _trees() -> list[tuple[str, ast.AST]]:
    return [(path.name, ast.parse(path.read_text())) for path in sorted(OPERATOR.glob("*.py"))]


def _called(call: ast.Call) -> str:
    """The name of the called function: `f(...)` or `module.f(...)`."""
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return ""


def test_every_replica_call_passes_credentials() -> None:
    calls = [
        (name, node)
        for name, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and _called(node) in REPLICA_CALLS
    ]
    assert len(calls) >= 4, "the helpers were renamed: update REPLICA_CALLS"
    for name, call in calls:
        given = len(call.args) > REPLICA_CALLS[_called(call)] or any(
            k.arg == "credentials" for k in call.keywords
        )
        assert given, f"{name}:{call.lineno}: {_called(call)}(...) without credentials"


def test_every_client_the_operator_opens_gets_credentials() -> None:
    opened = 0
    for name, tree in _trees():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _called(node) == "AsyncClient":
                opened += 1
                keywords = {k.arg for k in node.keywords}
                assert "credentials" in keywords, f"{name}:{node.lineno}: AsyncClient(...)"
    assert opened >= 2, "the clients are opened elsewhere now: update this test"
