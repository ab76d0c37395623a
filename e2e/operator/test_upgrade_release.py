"""Upgrading from the previous release: its chart and images under a live log, then the CRD,
the operator and every replica to this tree (docs/upgrades.md, "Upgrading the operator").

The previous release is a git tag of this repository, `rlog.version.PREVIOUS_RELEASE`, and
its commit, `PREVIOUS_RELEASE_COMMIT` (a clone may lack tags; e2e/cluster/release_source.sh
finds it either way). Its images must be in the cluster: `e2e/cluster/images.sh release`
builds them from the release's tree with its own Dockerfiles, tagged with its version, and
imports them (`make e2e-operator` and `make e2e-extended` run it first).

1. The release's chart (its tree's `helm/rlog-operator`) installed as release
   `rlog-previous` in a namespace of its own with the release's images, serving a log
   namespace of its own; a ReplicatedLog created there, every replica running the release
   (its image, and `rlog --version` naming the release's version).
2. Under a continuous writer: this tree's CRD applied server-side and the release upgraded
   with `helm upgrade` to this tree's packaged chart and images (`dev`, as the other
   suites). The operator pods are replaced by this tree's; the new operator finds the replica image
   changed and rolls the replicas to it: each pod replaced once, never fewer than a quorum
   VOTING in a sample of the writer.
3. Every replica and operator pod runs this tree, and every acknowledged append is at its
   position on every replica.

The suite's session fixtures install this tree's chart for the other tests. This module has
its own `namespace` and `operator` fixtures (overriding conftest.py's, whose failure report
then describes these), so the two installs never share a release, a namespace, a Lease or a
cluster-scoped RBAC name. The CRD is cluster-scoped and shared: `helm install` installs the
release's only when the cluster has none and skips an existing one (e.g. this tree's, from a
session that ran before), which this test must not replace with an older one: the API
server would drop the fields it lacks from every log on the cluster.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2elib import Kubectl, wait_until
from oplib import (
    OPERATOR_LABEL,
    REPLICA_IMAGE,
    Log,
    Writer,
    check_acknowledged,
    created_log,
    watch_pods,
)

from rlog import __version__
from rlog.version import PREVIOUS_RELEASE, semver

# Day-two operations: `make e2e-extended` runs them alone; `make test` with the rest.
pytestmark = pytest.mark.extended

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "replicatedlog.yaml"
OPERATOR_IMAGE = os.environ.get("E2E_OPERATOR_IMAGE", "docker.io/rlog/rlog-operator:dev")
RELEASE_VERSION = PREVIOUS_RELEASE.removeprefix("v")  # its PEP 440 version
RELEASE_TAG = semver(RELEASE_VERSION)  # its images' tag (images.sh release) and appVersion
# a release whose name says rlog-operator: the previous release named its objects
# rlog-operator-rlog-operator, this chart names a fresh install's rlog-operator and must keep
# the old names on the upgrade (two Deployments would be two operators acting at once)
HELM_RELEASE = "rlog-operator"
LEGACY_NAME = f"{HELM_RELEASE}-rlog-operator"
NAME = "release-log"
QUORUM = 2


def _helm(*args: str, timeout: float = 400) -> None:
    p = subprocess.run(["helm", *args], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"helm {' '.join(args)} failed ({p.returncode}): {p.stderr}"


def _image_values(operator_image: str, replica_image: str) -> list[str]:
    op_repo, op_tag = operator_image.rsplit(":", 1)
    rep_repo, rep_tag = replica_image.rsplit(":", 1)
    return [
        "--set", f"image.repository={op_repo}", "--set", f"image.tag={op_tag}",
        "--set", "image.pullPolicy=IfNotPresent",
        "--set", f"replicaImage.repository={rep_repo}", "--set", f"replicaImage.tag={rep_tag}",
        "--set", "replicaImage.pullPolicy=IfNotPresent",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def release_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's chart, from its git tag or commit (e2e/cluster/release_source.sh,
    which also tells a clone that cannot have it)."""
    archive = subprocess.run(
        ["bash", str(ROOT / "e2e" / "cluster" / "release_source.sh"), "archive",
         "helm/rlog-operator"],
        capture_output=True,
    )  # fmt: skip
    if archive.returncode == 3:
        pytest.skip(archive.stderr.decode().strip())
    assert archive.returncode == 0, archive.stderr.decode()
    dest = tmp_path_factory.mktemp("release-chart")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(dest, filter="data")
    return dest / "helm" / "rlog-operator"


@pytest.fixture(scope="module")
def namespace(cluster: Kubectl) -> Iterator[str]:
    """This module's log namespace (not the session's), deleted afterwards."""
    name = f"e2e-rel-{uuid.uuid4().hex[:6]}"
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


@pytest.fixture(scope="module")
def operator(cluster: Kubectl, namespace: str, release_chart: Path) -> Iterator[str]:
    """The previous release's chart and images as release `rlog-operator` in a namespace of
    its own, serving only `namespace`; yields the operator's namespace, uninstalled after."""
    if shutil.which("helm") is None:
        pytest.fail("helm is not on the PATH (make cluster-up puts it in /usr/local/bin)")
    ns = f"rlog-rel-{uuid.uuid4().hex[:6]}"
    release_images = _image_values(
        f"docker.io/rlog/rlog-operator:{RELEASE_TAG}", f"docker.io/rlog/rlog-replica:{RELEASE_TAG}"
    )
    try:
        _helm(
            "install", HELM_RELEASE, str(release_chart), "-n", ns, "--create-namespace",
            *release_images, "--set", f"watchNamespaces={{{namespace}}}",
            "--wait", "--timeout", "180s",
        )  # fmt: skip
    except AssertionError as exc:
        raise AssertionError(
            f"{exc}\n(are the release's images in the cluster? e2e/cluster/images.sh release "
            f"{PREVIOUS_RELEASE} builds and imports them)"
        ) from None
    try:
        yield ns
    finally:
        if os.environ.get("E2E_KEEP_NAMESPACE") != "1":
            subprocess.run(["helm", "uninstall", HELM_RELEASE, "-n", ns, "--wait"], timeout=180)
            cluster.run("delete", "namespace", ns, "--wait=false", check=False, namespaced=False)


@pytest.fixture(scope="module")
def log(operator: str, namespace: str) -> Iterator[Log]:
    # deleted while the operator (the upgraded one, of this tree) still serves its finalizer
    with created_log(namespace, NAME, settle=True) as log:
        yield log


def _images(k: Kubectl, selector: str, container: str) -> dict[str, str]:
    pods = k.json("get", "pods", "-l", selector)["items"]
    return {
        p["metadata"]["name"]: next(
            c["image"] for c in p["spec"]["containers"] if c["name"] == container
        )
        for p in pods
        if not p["metadata"].get("deletionTimestamp")
    }


def _versions(log: Log) -> dict[str, str]:
    """`rlog --version` in every replica pod."""
    return {pod: log.rlog(pod, "--version").strip() for pod in log.pods}


def test_an_upgrade_from_the_previous_release_keeps_every_entry(
    log: Log, operator: str, cluster: Kubectl, crd_held: None, chart: str
) -> None:
    op = Kubectl(operator)
    deployments = {d["metadata"]["name"] for d in op.json("get", "deployments")["items"]}
    assert deployments == {LEGACY_NAME}, deployments
    release_replica = f"docker.io/rlog/rlog-replica:{RELEASE_TAG}"
    replicas = f"app.kubernetes.io/instance={NAME}"
    assert set(_images(log.k, replicas, "replica").values()) == {release_replica}
    for pod, version in _versions(log).items():
        # a build of another tree tagged with the release's version is no release
        assert version.startswith(f"rlog {RELEASE_VERSION} "), (pod, version)
    operator_uids = {p["metadata"]["uid"] for p in op.json("get", "pods")["items"]}
    before_uids = log.pod_uids()
    revision_before = log.update_revision()

    writer = Writer(log, "release", f"upgrade from {PREVIOUS_RELEASE}")
    writer.start()
    t0 = time.monotonic()
    cluster("apply", "--server-side", "--force-conflicts", "-f", str(CRD), namespaced=False)
    # the upgrade runs while the replica pods are watched: the new operator may start the
    # rolling replacement before `helm upgrade --wait` returns
    upgrade = subprocess.Popen(
        ["helm", "upgrade", HELM_RELEASE, chart, "-n", operator,
         *_image_values(OPERATOR_IMAGE, REPLICA_IMAGE),
         "--set", f"watchNamespaces={{{log.k.namespace}}}", "--wait", "--timeout", "300s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip

    def operator_replaced() -> bool:
        pods = op.json("get", "pods", "-l", OPERATOR_LABEL)["items"]
        images = _images(op, OPERATOR_LABEL, "operator")
        return (
            bool(images)
            and set(images.values()) == {OPERATOR_IMAGE}
            and not {p["metadata"]["uid"] for p in pods} & operator_uids
        )

    helm_err: list[str] = []

    def upgraded() -> bool:
        if upgrade.poll() is None:
            return False
        if not helm_err:
            helm_err.append(upgrade.communicate()[1])
        assert upgrade.returncode == 0, f"helm upgrade failed ({upgrade.returncode}): {helm_err}"
        return operator_replaced() and log.rolled_out(revision_before)

    try:
        incarnations = watch_pods(log, upgraded, 900)
    finally:
        if upgrade.poll() is None:
            upgrade.kill()
    print(f"{PREVIOUS_RELEASE} -> this tree in {time.monotonic() - t0:.1f}s")
    report = writer.stop()

    # the operator's objects kept their names: one Deployment, never two operators at once
    deployments = {d["metadata"]["name"] for d in op.json("get", "deployments")["items"]}
    assert deployments == {LEGACY_NAME}, deployments
    # every operator pod and replica on this tree, each replica pod replaced exactly once
    for pod in _images(op, OPERATOR_LABEL, "operator"):
        version = op("exec", pod, "-c", "operator", "--", "rlog-operator", "--version").strip()
        assert version == f"rlog-operator {__version__}", (pod, version)
    assert set(_images(log.k, replicas, "replica").values()) == {REPLICA_IMAGE}
    for pod, version in _versions(log).items():
        assert version.startswith(f"rlog {__version__} "), (pod, version)
    after_uids = log.pod_uids()
    for pod in log.pods:
        uids = [u for _, p, u in incarnations if p == pod]
        assert uids == [before_uids[pod], after_uids[pod]], (pod, incarnations)

    # never below a quorum of VOTING replicas, and the rollout did take replicas away
    counts = report.voting_counts()
    assert counts, "the writer took no status sample"
    below = [
        (t, states, report.why.get(t))
        for t, states in report.samples
        if list(states.values()).count("VOTING") < QUORUM
    ]
    assert not below, (
        f"fewer than {QUORUM} VOTING in {len(below)} of {len(counts)} samples: "
        + json.dumps(below[:10])
    )
    assert min(counts) < log.replicas, "no sample saw a replica being replaced"
    check_acknowledged(log, report)
    print(
        f"{len(report.acks)} appends acknowledged, {len(report.errors)} failed (retried with "
        f"new values), {len(report.samples)} status samples, min VOTING {min(counts)}"
    )
