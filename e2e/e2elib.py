"""Helpers of the e2e suites: they run against whatever the current kubeconfig
context points at (the local cluster of e2e/cluster, or kind on a laptop).

Only kubectl (and helm for the chart test) are needed on the PATH; no Python client.
Environment:
  E2E_KEEP_NAMESPACE=1   keep the test namespace after the run (for debugging)
  E2E_SMOKE_IMAGE        image of the smoke pods (default docker.io/rlog/e2e-smoke:dev)
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from typing import Any

SMOKE_IMAGE = os.environ.get("E2E_SMOKE_IMAGE", "docker.io/rlog/e2e-smoke:dev")


class Kubectl:
    """Thin wrapper over the kubectl command line, bound to one namespace."""

    def __init__(self, namespace: str | None = None) -> None:
        self.namespace = namespace

    def run(
        self,
        *args: str,
        input: str | None = None,
        check: bool = True,
        timeout: float = 120,
        namespaced: bool = True,
    ) -> subprocess.CompletedProcess:
        cmd = ["kubectl"]
        if namespaced and self.namespace:
            cmd += ["-n", self.namespace]
        cmd += list(args)
        p = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()}")
        return p

    def __call__(self, *args: str, **kw: Any) -> str:
        return self.run(*args, **kw).stdout

    def json(self, *args: str, **kw: Any) -> Any:
        return json.loads(self.run(*args, "-o", "json", **kw).stdout)

    def apply(self, manifest: str) -> None:
        self.run("apply", "-f", "-", input=manifest)

    def exec_py(self, pod: str, code: str, check: bool = True, timeout: float = 60) -> str:
        """Run a Python snippet inside a pod (its image has python3)."""
        return self.run(
            "exec", pod, "--", "python3", "-c", code, check=check, timeout=timeout
        ).stdout


def delete_and_wait(k: Kubectl, kind: str, *names: str, timeout: float = 180) -> None:
    """Delete objects of one kind and return once each is gone or replaced by a new object
    of the same name (a StatefulSet recreates its pods at once, the operator its children),
    told apart by UID.

    Not `kubectl delete --wait=true`: in a CI run it printed all three pods of a
    StatefulSet deleted, the old pods were gone and their replacements running under the
    same names, and it went on waiting until its 180 s timeout (2026-11-28, e2e
    test_every_volume_lost_is_data_loss_until_the_reinitialize_annotation)."""
    before = {name: k.json("get", kind, name)["metadata"]["uid"] for name in names}
    k("delete", kind, *names, "--wait=false")

    def gone() -> bool:
        now = {o["metadata"]["name"]: o["metadata"]["uid"] for o in k.json("get", kind)["items"]}
        return all(now.get(name) != uid for name, uid in before.items())

    wait_until(f"{kind} {', '.join(names)} deleted", gone, timeout, 1)


def wait_until(
    what: str, fn: Callable[[], Any], timeout: float = 120, interval: float = 1.0
) -> Any:
    """Poll fn until it returns something truthy; fail with `what` after timeout seconds."""
    deadline = time.monotonic() + timeout
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except Exception as e:
            last_exc = e
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what}"
        + (f" (last error: {last_exc})" if last_exc else "")
    )
