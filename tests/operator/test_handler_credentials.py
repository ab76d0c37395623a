"""Every call the operator makes to a replica presents the operator's credentials: on a TLS
log (the default) a call without them fails its handshake, which once left the
`rlog.io/step-down` annotation unserved while every unit test passed."""

from __future__ import annotations

import ast
from pathlib import Path

HANDLERS = Path(__file__).resolve().parents[2] / "operator" / "rlog_operator" / "handlers.py"
# the helpers that open a client to a replica, and where their credentials argument sits
REPLICA_CALLS = {"_replica_call": 3, "_replica_status": 1, "_status_client": 1}


def test_every_replica_call_passes_credentials() -> None:
    tree = ast.parse(HANDLERS.read_text())
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in REPLICA_CALLS
    ]
    assert len(calls) >= 4, "the helpers were renamed: update REPLICA_CALLS"
    for call in calls:
        assert isinstance(call.func, ast.Name)
        given = len(call.args) > REPLICA_CALLS[call.func.id] or any(
            k.arg == "credentials" for k in call.keywords
        )
        assert given, f"handlers.py:{call.lineno}: {call.func.id}(...) without credentials"


def test_every_client_the_handlers_open_gets_credentials() -> None:
    tree = ast.parse(HANDLERS.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "AsyncClient":
            keywords = {k.arg for k in node.keywords}
            assert "credentials" in keywords, f"handlers.py:{node.lineno}: AsyncClient(...)"
