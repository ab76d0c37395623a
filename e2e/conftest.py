"""Fixtures of the e2e suites: they run against whatever the current kubeconfig context
points at (the local cluster of e2e/cluster, or kind on a laptop). See e2elib.py.
"""

from __future__ import annotations

import os
import shutil
import sys
import uuid
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2elib import Kubectl, wait_until


@pytest.fixture(scope="session")
def cluster() -> Kubectl:
    """The cluster of the current context; fails the run early if it does not answer."""
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not on the PATH (make cluster-up puts it in /usr/local/bin)")
    k = Kubectl()
    p = k.run("get", "--raw", "/readyz", check=False, timeout=30, namespaced=False)
    if p.returncode != 0:
        ctx = k.run("config", "current-context", check=False, namespaced=False).stdout.strip()
        pytest.fail(
            f"no reachable Kubernetes in context {ctx!r}: {p.stderr.strip()} "
            "(start one with `make cluster-up` or `make e2e-kind`)"
        )
    return k


@pytest.fixture(scope="session")
def namespace(cluster: Kubectl) -> Iterator[str]:
    """A fresh namespace for the session, deleted afterwards."""
    name = f"e2e-{uuid.uuid4().hex[:6]}"
    cluster.run("create", "namespace", name, namespaced=False)
    wait_until(
        "default service account",
        lambda: (
            cluster.run(
                "-n", name, "get", "serviceaccount", "default", check=False, namespaced=False
            ).returncode
            == 0
        ),
        60,
    )
    yield name
    if os.environ.get("E2E_KEEP_NAMESPACE") != "1":
        cluster.run("delete", "namespace", name, "--wait=false", check=False, namespaced=False)


@pytest.fixture(scope="session")
def kube(namespace: str) -> Kubectl:
    return Kubectl(namespace)
