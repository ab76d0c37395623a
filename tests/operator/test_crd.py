"""The CRD is a structural apiextensions.k8s.io/v1 schema whose CEL rules keep a log's name
short enough for the objects it names and its replicas immutable; its storage may change
(the operator grows or migrates the claims, rlog_operator.storage)."""

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlog_operator import constants as c

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / "replicatedlog.yaml"

# keys a structural schema node may carry (apiextensions v1 JSONSchemaProps we use)
ALLOWED = {
    "type",
    "format",
    "description",
    "properties",
    "items",
    "required",
    "default",
    "enum",
    "pattern",
    "anyOf",
    "additionalProperties",
    "x-kubernetes-validations",
    "x-kubernetes-int-or-string",
    "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "minimum",
    "maximum",
    "maxLength",
}


@pytest.fixture(scope="module")
def crd() -> dict[str, Any]:
    docs = list(yaml.safe_load_all(CRD_PATH.read_text()))
    assert len(docs) == 1
    return docs[0]


@pytest.fixture(scope="module")
def version(crd):
    (v,) = crd["spec"]["versions"]
    return v


@pytest.fixture(scope="module")
def schema(version):
    return version["schema"]["openAPIV3Schema"]


def walk(node: dict[str, Any], path: str = ""):
    yield path, node
    for name, child in node.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from walk(node["additionalProperties"], f"{path}{{}}")


def test_identity(crd, version):
    assert crd["apiVersion"] == "apiextensions.k8s.io/v1"
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == f"{c.PLURAL}.{c.GROUP}"
    spec = crd["spec"]
    assert spec["group"] == c.GROUP
    assert spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == c.KIND
    assert spec["names"]["plural"] == c.PLURAL
    assert c.SHORT_NAME in spec["names"]["shortNames"]
    assert version["name"] == c.VERSION
    assert version["served"] and version["storage"]
    assert version["subresources"] == {"status": {}}


def test_structural(schema):
    """Every node has a type (or is int-or-string / preserve-unknown), only known keys, a
    description on every field, and anyOf branches carry nothing but types."""
    for path, node in walk(schema):
        assert set(node) <= ALLOWED, (path, set(node) - ALLOWED)
        if node.get("x-kubernetes-int-or-string"):
            assert "type" not in node, path
            assert [b["type"] for b in node["anyOf"]] == ["integer", "string"], path
            assert all(set(b) == {"type"} for b in node["anyOf"]), path
        else:
            assert node.get("type") in {"object", "array", "string", "integer", "boolean"}, path
        if node.get("type") == "array":
            assert isinstance(node.get("items"), dict), path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            assert node.get("type") == "object", path
        for key in node.get("required", []):
            assert key in node.get("properties", {}), (path, key)
        if node.get("x-kubernetes-list-type") == "map":
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in node["items"]["required"], (path, key)
        last = path.rsplit(".", 1)[-1]
        is_field = path and not path.endswith(("[]", "}")) and last != "metadata"
        if is_field:
            assert node.get("description"), f"no description on {path}"


def test_spec_fields_and_defaults(schema):
    spec = schema["properties"]["spec"]
    props = spec["properties"]
    assert spec["required"] == ["storage"]
    assert props["replicas"]["type"] == "integer" and props["replicas"]["default"] == 3
    assert props["autoInitialize"]["type"] == "boolean"
    assert props["autoInitialize"]["default"] is True
    assert props["storage"]["required"] == ["size"]
    assert props["storage"]["properties"]["size"]["x-kubernetes-int-or-string"] is True
    assert props["storage"]["properties"]["storageClassName"]["type"] == "string"
    assert props["image"]["type"] == "string"
    assert set(props["resources"]["properties"]) == {"limits", "requests"}
    for key in ("podAnnotations", "nodeSelector", "tolerations", "affinity"):
        assert key in props


def rules(node) -> dict[str, str]:
    return {v["rule"]: v["message"] for v in node.get("x-kubernetes-validations", [])}


def test_cel_rules(schema):
    props = schema["properties"]["spec"]["properties"]
    replicas = rules(props["replicas"])
    assert "self in [1, 3, 5, 7]" in replicas
    assert (
        replicas["self == oldSelf"]
        == "reconfiguration is not supported: spec.replicas is immutable"
    )
    # spec.storage may change: no immutability rule (a shrink is refused by the operator)
    assert rules(props["storage"]) == {}
    assert "type(self) == string || self >= 0" in rules(props["catchUpRate"])
    spec_rules = rules(schema["properties"]["spec"])
    assert "has(self.replicas) == has(oldSelf.replicas)" in spec_rules
    root = rules(schema)
    assert any("self.metadata.name" in rule for rule in root)
    # a rule on a field does not run when the field appears or goes: the immutable ones
    # that may be absent hold one level up too (e2e/operator/test_immutable.py runs them)
    assert "has(self.bootstrap) == has(oldSelf.bootstrap)" in spec_rules
    assert "self == oldSelf" in rules(props["bootstrap"])
    (tls_mode,) = [rule for rule in root if "tls.mode" in rule]
    for unset_means in ("oldSelf.status.tls.mode", "'disabled'", "'operator'"):
        assert unset_means in tls_mode  # the mode the log was built with (specs.mode_of)
    assert "spec.tls.mode is immutable" in root[tls_mode]
    # every rule has a message: kubectl shows it on rejection
    for _, node in walk(schema):
        for v in node.get("x-kubernetes-validations", []):
            assert v["message"], v


def test_status_fields(schema):
    status = schema["properties"]["status"]["properties"]
    for key in (
        "phase",
        "initialized",
        "leader",
        "quorum",
        "replicas",
        "conditions",
        "observedGeneration",
        "rollingUpdate",
    ):
        assert key in status, key
    assert set(status["phase"]["enum"]) == {
        "Pending",
        "Initializing",
        "Ready",
        "Degraded",
        "Recovering",
        "RollingUpdate",
        "DataLoss",
        "Failed",
    }
    item = status["replicas"]["items"]["properties"]
    assert {"name", "status", "begin", "end", "ready", "revision"} <= set(item)
    queue = status["rollingUpdate"]["properties"]["queue"]["items"]
    assert {"pod", "uid", "action"} <= set(queue["required"])


def test_printer_columns(version):
    columns = {col["name"]: col for col in version["additionalPrinterColumns"]}
    assert list(columns) == ["Replicas", "Voting", "Leader", "Phase", "Paused", "Age"]
    assert columns["Paused"]["jsonPath"] == ".status.paused"
    assert columns["Replicas"]["jsonPath"] == ".spec.replicas"
    assert columns["Phase"]["jsonPath"] == ".status.phase"
    assert columns["Age"]["type"] == "date"


def test_status_builder_fields_exist_in_schema(schema):
    """Whatever status.py writes must be in the schema (the API server prunes the rest)."""
    from rlog_operator import status as st

    status_props = schema["properties"]["status"]["properties"]
    assert set(st.STATUS_FIELDS) <= set(status_props)
    replica_props = status_props["replicas"]["items"]["properties"]
    assert set(st.REPLICA_FIELDS) <= set(replica_props)


def test_rolling_queue_fields_exist_in_schema(schema):
    """Every key of a rolling queue entry survives the API server's pruning (a pruned
    `participating` was seen on a real cluster)."""
    from rlog_operator import rolling

    status_props = schema["properties"]["status"]["properties"]
    rolling_props = status_props["rollingUpdate"]["properties"]
    queue_props = rolling_props["queue"]["items"]["properties"]
    assert set(rolling.QueueEntry.__annotations__) <= set(queue_props)
    assert set(rolling.Action("none").as_status()) <= set(rolling_props)
