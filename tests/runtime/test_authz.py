"""Authorization rules (rlog.runtime.authz), without a server: the RPC table covers the
services, roles grant what docs/security.md's tables say (read from the page), and the
roles file is checked."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import grpc
import pytest

from rlog.config import ConfigError
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.authz import (
    IDENTITY_URI_PREFIX,
    ROLE_GRANTS,
    RPC_KINDS,
    Caller,
    Kind,
    caller_of_tls,
    certificate_identity,
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
            "compactor": "owner",
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
        (("operator",), {Kind.READ, Kind.APPEND, Kind.DESTROY, Kind.ADMIN}),
        (("replica-2", "10.0.0.3"), {Kind.READ, Kind.APPEND, Kind.DESTROY, Kind.PEER}),
        (("writer",), {Kind.READ, Kind.APPEND}),
        (("compactor",), {Kind.READ, Kind.APPEND, Kind.DESTROY}),
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
    assert ROLE_GRANTS["read"] < ROLE_GRANTS["append"] < ROLE_GRANTS["owner"]
    assert ROLE_GRANTS["owner"] < ROLE_GRANTS["admin"]
    assert ROLE_GRANTS["owner"] < ROLE_GRANTS["peer"]
    assert Kind.ADMIN not in ROLE_GRANTS["peer"]
    assert Kind.PEER not in ROLE_GRANTS["admin"]


def test_destroy_calls_are_their_own_kind():
    """Truncate and TakeEpoch take from other callers (every reader's entries below the
    cut, every other writer's epoch): role append does not allow them; StepDown stays
    admin."""
    assert {m for m, k in RPC_KINDS.items() if k is Kind.DESTROY} == {
        "/rlog.v1.Log/Truncate",
        "/rlog.v1.Log/TakeEpoch",
    }
    assert RPC_KINDS["/rlog.v1.Admin/StepDown"] is Kind.ADMIN
    assert {r for r, kinds in ROLE_GRANTS.items() if Kind.DESTROY in kinds} == {
        "owner",
        "admin",
        "peer",
    }


@pytest.mark.parametrize("method", ["/rlog.v1.Log/Truncate", "/rlog.v1.Log/TakeEpoch"])
def test_append_role_refused_destroy_says_what_to_change(method):
    for caller in (Caller(names=("writer",)), Caller(token="s3cret")):
        decision = decide(POLICY, method, caller)
        assert not decision.allowed and decision.code == grpc.StatusCode.PERMISSION_DENIED
        assert "\n" not in decision.reason
        assert "needs a role allowing destroy calls" in decision.reason
        assert "role append no longer allows Truncate or TakeEpoch" in decision.reason
        assert "give this caller role owner" in decision.reason
    # A reader was never allowed: no migration hint, just the refusal.
    reader = decide(POLICY, method, Caller(names=("reader",)))
    assert not reader.allowed and "owner" not in reader.reason


# ---- docs/security.md's table of every RPC, checked against the code --------------------

SECURITY_MD = Path(__file__).parents[2] / "docs" / "security.md"


def table_after(header: str) -> list[list[str]]:
    """The rows of the markdown table in docs/security.md whose header line starts with
    `header`, as lists of stripped cells (header and rule lines left out)."""
    lines = SECURITY_MD.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def test_security_md_lists_every_rpc_with_its_kind_and_roles():
    documented = {}
    for rpc, kind, roles in table_after("| RPC "):
        assert re.fullmatch(r"(Log|Admin|Replica)/\w+", rpc), rpc
        assert rpc not in documented, f"docs/security.md lists {rpc} twice"
        documented[f"/rlog.v1.{rpc}"] = (kind, {r.strip() for r in roles.split(",")})
    actual = {
        method: (kind.value, {role for role, kinds in ROLE_GRANTS.items() if kind in kinds})
        for method, kind in RPC_KINDS.items()
    }
    assert documented == actual, "docs/security.md's RPC table and authz disagree"


def test_security_md_lists_every_role_with_its_kinds():
    documented = {}
    for role, kinds, _why in table_after("| role   | kinds"):
        documented[role] = set() if kinds == "nothing" else {k.strip() for k in kinds.split(",")}
    assert documented == {
        role: {kind.value for kind in kinds} for role, kinds in ROLE_GRANTS.items()
    }


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


def test_peer_and_admin_rules_need_a_certificate_of_the_peer_ca():
    """With a peer CA, a caller whose certificate it did not issue never gets peer or admin
    from a rule or a token, whatever names it carries: the next rule that names it decides.
    Without a peer CA (from_peer_ca None) the names alone decide, as before."""
    policy = parse_policy(
        {
            "subjects": {"replica-*": "peer", "rlog-operator": "admin", "*": "read"},
            "tokens": [{"name": "ops", "token": "t0k", "role": "admin"}],
        }
    )
    learned, step_down = "/rlog.v1.Replica/Learned", "/rlog.v1.Admin/StepDown"
    status = "/rlog.v1.Log/Status"
    for names, method in ((("replica-1",), learned), (("x", "rlog-operator"), step_down)):
        forged = decide(policy, method, Caller(names, from_peer_ca=False))
        assert not forged.allowed and forged.code == grpc.StatusCode.PERMISSION_DENIED
        assert "not issued by the peer CA" in forged.reason and forged.roles == ("read",)
        assert decide(policy, status, Caller(names, from_peer_ca=False)).allowed
        assert decide(policy, method, Caller(names, from_peer_ca=True)).allowed
        assert decide(policy, method, Caller(names)).allowed  # no peer CA: by name
    token = Caller(("writer",), token="t0k", from_peer_ca=False)
    assert not decide(policy, step_down, token).allowed
    assert decide(policy, step_down, Caller(("writer",), token="t0k", from_peer_ca=True)).allowed
    # A certificate of the peer CA still needs a rule: the CA says "one of ours", the name
    # says which (a replica is no admin).
    assert not decide(policy, step_down, Caller(("replica-0",), from_peer_ca=True)).allowed


def test_issued_identities_get_a_role_by_fingerprint_only():
    """A certificate the operator issued (IDENTITY_URI_PREFIX) has the role of the entry
    listing its fingerprint, and none once no entry does (revoked, or another certificate
    of the same name): no name rule or default gives it one, whatever its name matches."""
    pytest.importorskip("cryptography")
    from rlog import certs

    ca = certs.new_ca("client CA")
    uri = [f"{IDENTITY_URI_PREFIX}spark-reader"]
    current = certs.issue(ca, "spark-reader", days=1, uris=uri).cert
    other = certs.issue(ca, "spark-reader", days=1, uris=uri).cert  # same name, other key
    fingerprint, issued = certificate_identity(current)
    assert issued and len(fingerprint) == 64
    assert certificate_identity(certs.issue(ca, "spark-reader", days=1).cert)[1] is False
    data = {
        "subjects": {"spark-*": "append"},
        "certificates": [{"name": "spark-reader", "role": "read", "sha256": [fingerprint]}],
        "default": "read",
    }
    policy = parse_policy(data)
    read, append = "/rlog.v1.Log/Read", "/rlog.v1.Log/Append"

    def caller(pem: bytes) -> Caller:
        return caller_of_tls(("spark-reader", uri[0]), pem, "", None)

    assert decide(policy, read, caller(current)).allowed
    assert not decide(policy, append, caller(current)).allowed  # read, not the pattern's append
    replaced = decide(policy, read, caller(other))
    assert not replaced.allowed and "revoked or replaced" in replaced.reason
    revoked = parse_policy({**data, "certificates": []})
    assert not decide(revoked, read, caller(current)).allowed
    # a certificate without the mark keeps the name rules
    plain = certs.issue(ca, "spark-reader", days=1).cert
    assert decide(revoked, append, caller_of_tls(("spark-reader",), plain, "", None)).allowed


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"name": "x", "role": "admin", "sha256": ["0" * 64]}, "issued identity"),
        ({"name": "x", "role": "read", "sha256": ["zz"]}, "64 hexadecimal"),
        ({"name": "x", "role": "read", "sha256": "0" * 64}, "sha256 list"),
    ],
)
def test_bad_certificate_entries(entry, message):
    with pytest.raises(ConfigError, match=message):
        parse_policy({"certificates": [entry]})


# ---- docs/security.md's threat model names an attack test per boundary ----------------------


def _threat_model() -> str:
    text = SECURITY_MD.read_text()
    start = text.index("## Threat model")
    return text[start : text.index("\n## ", start + 1)]


def test_every_attack_test_the_threat_model_names_exists():
    """Each boundary of the threat model names the test that attacks it: a file, or a file
    and its test function (`path::test_name`); a renamed or deleted test fails here rather
    than leaving a boundary claimed without one."""
    import re

    root = SECURITY_MD.parents[1]
    named = re.findall(r"`((?:tests|e2e)/[\w/]+\.py)(?:::(\w+))?`", _threat_model())
    assert len(named) >= 10, named
    missing = []
    for path, test in named:
        file = root / path
        if not file.exists():
            missing.append(path)
        elif test and not re.search(rf"^(async )?def {test}\(", file.read_text(), re.M):
            missing.append(f"{path}::{test}")
    assert not missing, f"docs/security.md's threat model names missing tests: {missing}"
