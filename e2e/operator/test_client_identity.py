"""Client identities the operator issues, on the real cluster (docs/security.md, "Client
identities"): `kubectl rlog certificate` asks for one (spec.auth.clients), the operator
writes its Secret from the client CA, the certificate reads through the client Service;
`--revoke` takes it out of the roles file and deletes the Secret, and once every replica's
roles file no longer lists it that certificate is refused by every replica while another
identity still reads. Needs the operator and replica images built from this tree."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from e2elib import wait_until
from oplib import Log, client_files, created_log, exists, plugin, port_forward

from rlog_operator.plugin import cluster as plugin_cluster
from rlog_operator.plugin import patches

pytestmark = pytest.mark.extended

NAME = "identity-log"


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    with created_log(namespace, NAME) as log:
        yield log


def issued(log: Log, namespace: str, client: str, directory: str) -> dict[str, str]:
    """Ask for `client` (role read) and write its Secret's files: RLOG_CA/CERT/KEY."""
    plugin(namespace, "certificate", NAME, "--name", client, "--role", "read", "--wait")
    return client_files(log.k, f"{NAME}-client-{client}", directory)


def status(endpoint: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlog.tools.cli", "status", "--endpoint", endpoint],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def listed(log: Log) -> list[list[str]]:
    """The identities each replica's roles file lists (what its volume holds now)."""
    out = []
    for pod in log.pods:
        text = log.k("exec", pod, "-c", "replica", "--", "cat", "/etc/rlog/auth/roles.json")
        out.append(sorted(e["name"] for e in json.loads(text).get("certificates") or []))
    return out


def test_issue_read_and_revoke(log: Log, namespace: str, tmp_path) -> None:
    kept = issued(log, namespace, "kept", str(tmp_path))
    revoked = issued(log, namespace, "revoked", str(tmp_path))
    # usable once the replicas have the new roles file: the kubelet refreshes a Secret
    # volume on its periodic pod sync (a minute by default, 10 s on the local cluster)
    wait_until(
        "every replica's roles file with both identities",
        lambda: all(names == ["kept", "revoked"] for names in listed(log)),
        240,
        5,
    )
    with port_forward(log.k, f"svc/{NAME}") as forward:
        for env in (kept, revoked):
            assert status(forward.endpoint, env).returncode == 0
    plugin(namespace, "certificate", NAME, "--revoke", "revoked")
    wait_until(
        "the revoked identity's Secret deleted",
        lambda: not exists(log.k, "secret", f"{NAME}-client-revoked"),
        120,
        1,
    )
    wait_until(
        "every replica's roles file without the revoked identity",
        lambda: all(names == ["kept"] for names in listed(log)),
        240,
        5,
    )
    for pod in log.pods:
        with port_forward(log.k, f"pod/{pod}") as forward:
            refused = status(forward.endpoint, revoked)
            assert refused.returncode != 0 and "permission denied" in refused.stderr, pod
            assert status(forward.endpoint, kept).returncode == 0, pod


def test_a_request_built_from_a_stale_read_is_built_again(log: Log, namespace: str) -> None:
    """`certificate` replaces spec.auth.clients whole with the resourceVersion it read, so a
    write in between (the operator's own, several a second while a log settles: a CI run
    failed on it) is a Conflict; the plugin then reads the log and builds its request
    again, and adds to what the other writer left."""
    cluster = plugin_cluster.Cluster(None, None)
    stale = cluster.log(namespace, NAME)
    log.k("annotate", "replicatedlog", NAME, "e2e.rlog.io/touched=1", "--overwrite")

    def add(current):
        return patches.certificate_request(current, "stale", "read")

    with pytest.raises(patches.ConflictError):
        cluster.apply(namespace, add(stale))
    _, attempts = plugin_cluster.apply_fresh(cluster, namespace, NAME, add, stale)
    assert attempts >= 2
    body = log.body()
    assert body["metadata"]["annotations"]["e2e.rlog.io/touched"] == "1"
    names = [e["name"] for e in body["spec"]["auth"]["clients"]]
    assert "stale" in names and "kept" in names, names
    plugin(namespace, "certificate", NAME, "--revoke", "stale")
    names = [e["name"] for e in log.body()["spec"]["auth"]["clients"]]
    assert "stale" not in names and "kept" in names, names
