"""Authorization rules (rlog.runtime.authz), without a server: the RPC table covers the
services, roles grant what docs/security.md says, and the roles file is checked."""

from __future__ import annotations

import hashlib
import json

import grpc
import pytest

from rlog.config import ConfigError
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.authz import (
    ROLE_GRANTS,
    RPC_KINDS,
    Caller,
    Kind,
    decide,
    load_policy,
    parse_policy,
)


def all_methods() -> set[str]:
    return {
        f"/{service.full_name}/{method.name}"
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }


def test_every_rpc_of_the_services_is_classified():
    missing = all_methods() - set(RPC_KINDS)
    assert not missing, f"RPCs with no kind in authz.RPC_KINDS (refused to all): {missing}"
    stale = set(RPC_KINDS) - all_methods()
    assert not stale, f"authz.RPC_KINDS names RPCs the services do not have: {stale}"


def test_admin_and_peer_kinds():
    admin = {m for m, k in RPC_KINDS.items() if k is Kind.ADMIN}
    assert admin == {f"/rlog.v1.Admin/{n}" for n in ("GrantPermit", "RevokePermit", "StepDown")}
    assert {m for m, k in RPC_KINDS.items() if k is Kind.PEER} == {
        m for m in all_methods() if m.startswith("/rlog.v1.Replica/")
    }


POLICY = parse_policy(
    {
        "subjects": {
            "operator": "admin",
            "replica-*": "peer",
            "writer": "append",
            "reader": "read",
            "*.example.org": "read",
        },
        "tokens": [
            {"name": "ci", "token": "s3cret", "role": "append"},
            {"name": "dash", "sha256": hashlib.sha256(b"dash-token").hexdigest(), "role": "read"},
        ],
    },
    "test",
)


def allowed(method: str, **caller) -> bool:
    return decide(POLICY, method, Caller(**caller)).allowed


@pytest.mark.parametrize(
    ("names", "kind_allowed"),
    [
        (("operator",), {Kind.READ, Kind.APPEND, Kind.ADMIN}),
        (("replica-2", "10.0.0.3"), {Kind.READ, Kind.APPEND, Kind.PEER}),
        (("writer",), {Kind.READ, Kind.APPEND}),
        (("reader",), {Kind.READ}),
        (("someone", "app.example.org"), {Kind.READ}),  # matched by a SAN
        (("stranger",), set()),
        ((), set()),
    ],
)
def test_roles_by_certificate(names, kind_allowed):
    for method, kind in RPC_KINDS.items():
        assert allowed(method, names=names) == (kind in kind_allowed), (names, method)


def test_tokens():
    append = "/rlog.v1.Log/Append"
    assert allowed(append, token="s3cret")
    assert not allowed(append, token="dash-token")
    assert allowed("/rlog.v1.Log/Read", token="dash-token")
    wrong = decide(POLICY, append, Caller(token="nope"))
    assert not wrong.allowed and wrong.code == grpc.StatusCode.UNAUTHENTICATED
    # A token adds to a certificate's role: the reader's certificate with the CI token.
    assert allowed(append, names=("reader",), token="s3cret")


def test_denial_reason_is_one_line_and_names_the_role():
    decision = decide(POLICY, "/rlog.v1.Admin/StepDown", Caller(names=("writer",)))
    assert not decision.allowed
    assert decision.code == grpc.StatusCode.PERMISSION_DENIED
    assert "\n" not in decision.reason
    assert "StepDown" in decision.reason and "'writer'" in decision.reason
    assert "append" in decision.reason


def test_unknown_method_is_refused():
    assert not allowed("/rlog.v1.Log/Unheard", names=("operator",))


def test_default_role():
    policy = parse_policy({"default": "read"})
    assert decide(policy, "/rlog.v1.Log/Status", Caller()).allowed
    assert not decide(policy, "/rlog.v1.Log/Append", Caller()).allowed


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "must hold an object"),
        ({"subjects": {"x": "superuser"}}, "is not one of"),
        ({"subject": {}}, "unknown keys subject"),
        ({"tokens": [{"role": "read"}]}, "give token or sha256"),
        ({"tokens": [{"role": "read", "token": "a", "sha256": "00"}]}, "give token or sha256"),
        ({"tokens": [{"role": "read", "sha256": "zz"}]}, "not hexadecimal"),
        ({"tokens": [{"role": "read", "sha256": "00"}]}, "64 hexadecimal"),
        ({"default": "admin!"}, "is not one of"),
    ],
)
def test_bad_roles_files(data, message):
    with pytest.raises(ConfigError, match=message):
        parse_policy(data, "roles.json")


def test_roles_file_json_and_yaml(tmp_path):
    path = tmp_path / "roles.json"
    path.write_text(json.dumps({"subjects": {"a": "read"}}))
    assert load_policy(path).subjects == (("a", "read"),)
    pytest.importorskip("yaml")
    path = tmp_path / "roles.yaml"
    path.write_text("subjects:\n  a: admin\ndefault: read\n")
    policy = load_policy(path)
    assert policy.subjects == (("a", "admin"),) and policy.default == "read"
    path.write_text("subjects: [")
    with pytest.raises(ConfigError, match="not valid"):
        load_policy(path)


def test_roles_grant_nested_sets():
    assert ROLE_GRANTS["read"] < ROLE_GRANTS["append"] < ROLE_GRANTS["admin"]
    assert Kind.ADMIN not in ROLE_GRANTS["peer"]
    assert Kind.PEER not in ROLE_GRANTS["admin"]


def test_roles_file_is_reloaded_when_it_changes(tmp_path, monkeypatch):
    from rlog.runtime.authz import PolicyFile

    monkeypatch.setattr(PolicyFile, "CHECK_INTERVAL", 0.0)
    path = tmp_path / "roles.json"
    path.write_text(json.dumps({"subjects": {"a": "read"}}))
    roles = PolicyFile(path)
    assert roles.current().role_of_subject(["a"]) == ("read", "a")
    path.write_text(json.dumps({"subjects": {"a": "admin", "b": "read"}}))
    assert roles.current().role_of_subject(["a"]) == ("admin", "a")
    assert roles.reloads == 1
    # A broken file is not taken: the roles in force stay.
    path.write_text("{not json")
    assert roles.current().role_of_subject(["b"]) == ("read", "b")
    assert roles.reloads == 1
