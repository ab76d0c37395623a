"""Immutable means immutable: the CRD's CEL rules on the real API server hold when a field
appears or goes, not only when it changes.

A rule on a field (`self == oldSelf`) does not run when the field is new or removed, so a
default log (no `spec.tls`) once accepted `spec.tls.mode: disabled` and the operator rendered
it plaintext with authorization off; `spec.bootstrap` could be added or removed the same way.

These tests need no operator and touch no shared object: the repository's CRD file is
installed under a group of its own (its names changed so that nothing else on the cluster
resolves to it; its schema and rules exactly as in the file), in a namespace of its own, and
both are deleted afterwards. The status the operator would write is written through the
status subresource. Seconds in all. The operator's own refusal, on a CRD without the rules,
is test_operator.py's test_a_tls_mode_change_past_the_crd_is_refused_by_the_operator.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml
from e2elib import Kubectl, wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CRD_FILE = os.path.join(ROOT, "crds", "replicatedlog.yaml")
# what the operator writes as status.tls of a log it built in mode operator (pki.tls_status)
BUILT = {"mode": "operator", "transport": "mutual-tls", "authorization": "roles"}
SOURCE = {"fromArchive": {"bucket": "archives", "prefix": "old", "credentialsSecret": "s3"}}


@dataclass
class Logs:
    """ReplicatedLogs of the private copy of the CRD, in a namespace of their own."""

    k: Kubectl
    resource: str  # plural.group: never ambiguous with the real ReplicatedLog
    api_version: str
    kind: str

    def create(self, name: str, **spec: Any) -> None:
        body = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "metadata": {"name": name},
            "spec": {"storage": {"size": "64Mi"}, **spec},
        }
        self.k.run("create", "-f", "-", input=json.dumps(body))

    def write_status(self, name: str, status: dict[str, Any]) -> None:
        """Write the status as the operator does (the status subresource)."""
        self.k.run(
            "patch", self.resource, name, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}),
        )  # fmt: skip

    def patch(self, name: str, spec: dict[str, Any]) -> str:
        """Merge-patch the spec; "" when accepted, else the API server's refusal."""
        p = self.k.run(
            "patch", self.resource, name, "--type=merge", "-p", json.dumps({"spec": spec}),
            check=False,
        )  # fmt: skip
        return "" if p.returncode == 0 else p.stderr

    def spec(self, name: str) -> dict[str, Any]:
        return self.k.json("get", self.resource, name)["spec"]


def _established(cluster: Kubectl, name: str) -> bool:
    got = cluster.run(
        "get", "crd", name, "-o",
        "jsonpath={.status.conditions[?(@.type=='Established')].status}",
        check=False, namespaced=False,
    )  # fmt: skip
    return got.returncode == 0 and got.stdout.strip() == "True"


@pytest.fixture(scope="module")
def logs(cluster: Kubectl) -> Iterator[Logs]:
    """The repository's CRD under a private group and names, and a namespace for its
    objects; both deleted afterwards."""
    tag = uuid.uuid4().hex[:6]
    with open(CRD_FILE) as f:
        crd = yaml.safe_load(f)
    group = f"cel{tag}.e2e.rlog.io"
    names = crd["spec"]["names"]
    names.update(
        kind="CelReplicatedLog",
        listKind="CelReplicatedLogList",
        plural=f"cel{tag}logs",
        singular=f"cel{tag}log",
    )
    names.pop("shortNames", None)
    names.pop("categories", None)
    crd["spec"]["group"] = group
    crd["metadata"] = {"name": f"{names['plural']}.{group}"}
    (version,) = crd["spec"]["versions"]
    namespace = f"rlog-cel-{tag}"
    cluster.run("create", "-f", "-", input=json.dumps(crd), namespaced=False)
    try:
        cluster.run("create", "namespace", namespace, namespaced=False)
        # Polled, not `kubectl wait --for=condition=Established`: on a CRD the API server
        # has not given conditions yet, kubectl wait fails at once (".status.conditions
        # accessor error: <nil> is of the type <nil>"), as CI saw on 8cbdf03.
        wait_until(
            "the CRD Established",
            lambda: _established(cluster, crd["metadata"]["name"]),
            60,
        )
        yield Logs(
            Kubectl(namespace),
            f"{names['plural']}.{group}",
            f"{group}/{version['name']}",
            names["kind"],
        )
    finally:
        if os.environ.get("E2E_KEEP_NAMESPACE") != "1":
            cluster.run("delete", "crd", crd["metadata"]["name"], "--wait=false", check=False,
                        namespaced=False)  # fmt: skip
            cluster.run("delete", "namespace", namespace, "--wait=false", check=False,
                        namespaced=False)  # fmt: skip


def test_a_running_default_log_cannot_be_turned_to_plaintext(logs: Logs) -> None:
    logs.create("default")
    logs.write_status("default", {"initialized": True, "phase": "Ready", "tls": BUILT})
    for mode in ("disabled", "certManager"):
        refusal = logs.patch("default", {"tls": {"mode": mode}})
        assert "spec.tls.mode is immutable" in refusal, (mode, refusal)
    assert "tls" not in logs.spec("default")
    # the mode it runs, written out, is no change; nor is removing it again
    assert logs.patch("default", {"tls": {"mode": "operator"}}) == ""
    assert logs.patch("default", {"tls": None}) == ""
    # other changes and the operator's status writes go on
    assert logs.patch("default", {"image": "docker.io/rlog/rlog-replica:other"}) == ""
    logs.write_status("default", {"phase": "RollingUpdate"})


def test_a_mode_cannot_go_nor_change(logs: Logs) -> None:
    # created plaintext, not built yet: without spec.tls it would become a mode-operator log
    logs.create("plain", tls={"mode": "disabled"})
    refusal = logs.patch("plain", {"tls": None})
    assert "spec.tls.mode is immutable" in refusal, refusal
    assert "spec.tls.mode is immutable" in logs.patch("plain", {"tls": {"mode": "operator"}})
    assert logs.spec("plain")["tls"] == {"mode": "disabled"}
    # built in mode certManager: unset means certManager, so removing changes nothing
    issuer = {"mode": "certManager", "issuerRef": {"name": "ca"}}
    logs.create("certs", tls=issuer)
    logs.write_status("certs", {"tls": {**BUILT, "mode": "certManager"}})
    assert "spec.tls.mode is immutable" in logs.patch("certs", {"tls": {"mode": "operator"}})
    assert logs.patch("certs", {"tls": None}) == ""


def test_a_log_from_before_tls_stays_plaintext(logs: Logs) -> None:
    """Initialized by an operator that predates TLS (no status.tls): unset means disabled
    (docs/security.md); securing it takes a new log."""
    logs.create("legacy")
    logs.write_status("legacy", {"initialized": True})
    assert "spec.tls.mode is immutable" in logs.patch("legacy", {"tls": {"mode": "operator"}})
    assert logs.patch("legacy", {"tls": {"mode": "disabled"}}) == ""


def test_bootstrap_cannot_appear_change_or_go(logs: Logs) -> None:
    logs.create("fresh")
    refusal = logs.patch("fresh", {"bootstrap": SOURCE})
    assert "spec.bootstrap is immutable" in refusal, refusal
    assert "bootstrap" not in logs.spec("fresh")

    logs.create("restored", bootstrap=SOURCE)
    moved = {"fromArchive": {**SOURCE["fromArchive"], "toPosition": 5}}
    assert "spec.bootstrap is immutable" in logs.patch("restored", {"bootstrap": moved})
    refusal = logs.patch("restored", {"bootstrap": None})
    assert "spec.bootstrap is immutable" in refusal, refusal
    assert logs.spec("restored")["bootstrap"] == SOURCE
    assert logs.patch("restored", {"image": "docker.io/rlog/rlog-replica:other"}) == ""


def test_a_backup_needs_keys_or_an_identity(logs: Logs) -> None:
    """spec.backup with neither credentialsSecret nor serviceAccountName is refused (the
    archiver would have no way to sign); either one, or both, is taken."""
    bare = {"bucket": "archives"}
    with pytest.raises(AssertionError, match=r"spec\.backup needs credentials"):
        logs.create("no-keys", backup=bare)
    logs.create("keys", backup={**bare, "credentialsSecret": "s3"})
    logs.create("identity", backup={**bare, "serviceAccountName": "archiver-s3"})
    logs.create("both", backup={**bare, "credentialsSecret": "s3", "serviceAccountName": "a"})
    refusal = logs.patch("keys", {"backup": {"credentialsSecret": None}})
    assert "spec.backup needs credentials" in refusal, refusal
    assert logs.spec("keys")["backup"]["credentialsSecret"] == "s3"
