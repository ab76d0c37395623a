"""`kubectl rlog` as one file for krew (e2e/cluster/plugin_bundle.py, built by `make
release`): the archive and its manifest installed by a real krew, built from the Go module
proxy, into a fresh krew root; the installed plugin then runs under the system's bare
python3 (no venv, no site packages: `python3 -I`, an empty environment), says its version,
and fails in one line without a cluster. The bundle against a real cluster:
e2e/operator/test_release_install.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from toolchain import find_or_build_krew

from rlog import __version__
from rlog.version import semver

ROOT = Path(__file__).resolve().parents[2]
VERSION = semver(__version__)


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dist = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [sys.executable, str(ROOT / "e2e" / "cluster" / "plugin_bundle.py"), VERSION, str(dist)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return dist


def bare_python() -> str:
    """A python3 outside this venv (the tests' interpreter is the venv's)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(candidate).exists():
            return candidate
    pytest.fail("no system python3 to run the bundle with")


def test_the_manifest_names_the_archive_and_its_checksum(bundle: Path) -> None:
    archive = bundle / f"kubectl-rlog-{VERSION}.tar.gz"
    manifest = yaml.safe_load((bundle / f"rlog-krew-{VERSION}.yaml").read_text())
    assert manifest["kind"] == "Plugin" and manifest["metadata"]["name"] == "rlog"
    assert manifest["spec"]["version"] == f"v{VERSION}"
    (platform,) = manifest["spec"]["platforms"]
    assert platform["sha256"] == hashlib.sha256(archive.read_bytes()).hexdigest()
    assert platform["uri"].endswith(f"/kubectl-rlog-{VERSION}.tar.gz")
    assert platform["bin"] == "kubectl-rlog"
    with tarfile.open(archive) as tar:
        assert sorted(tar.getnames()) == ["LICENSE", "kubectl-rlog"]
        member = tar.extractfile("kubectl-rlog")
        assert member is not None
        pyz = member.read()
    assert pyz.startswith(b"#!/usr/bin/env python3\n")
    path = bundle / "unpacked.pyz"
    path.write_bytes(pyz)
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
    assert "__main__.py" in names and "rlog_operator/plugin/cli.py" in names
    assert "kubernetes/client/api_client.py" in names
    # nothing a zip cannot import, and none of the replica's own dependencies
    assert not [n for n in names if n.endswith((".so", ".pyd"))]
    assert not {n.split("/")[0] for n in names} & {"grpc", "google", "kopf", "pydantic_core"}


def test_krew_installs_it_and_it_runs_on_a_bare_python(bundle: Path, tmp_path: Path) -> None:
    krew = find_or_build_krew()
    root = tmp_path / "krew"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KREW_ROOT": str(root)}
    installed = subprocess.run(
        [krew, "install", f"--manifest={bundle / f'rlog-krew-{VERSION}.yaml'}",
         f"--archive={bundle / f'kubectl-rlog-{VERSION}.tar.gz'}"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert installed.returncode == 0, installed.stderr
    plugin = root / "bin" / "kubectl-rlog"
    assert plugin.exists()
    # krew's record of it (`krew list` needs krew's index, fetched from the internet)
    receipt = yaml.safe_load((root / "receipts" / "rlog.yaml").read_text())
    assert receipt["spec"]["version"] == f"v{VERSION}", receipt

    python = bare_python()
    bare = {**env, "PATH": f"{Path(python).parent}:/usr/bin:/bin"}
    version = subprocess.run(
        [str(plugin), "--version"], env=bare, capture_output=True, text=True, timeout=60
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == f"kubectl-rlog {__version__}"
    isolated = subprocess.run(
        [python, "-I", str(plugin), "--version"], env=bare, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert isolated.stdout == version.stdout, isolated.stderr

    # no kubeconfig: one line naming the cause, no traceback
    (tmp_path / "kubeconfig").write_text("")
    nocluster = subprocess.run(
        [str(plugin), "--kubeconfig", str(tmp_path / "kubeconfig"), "status", "demo"],
        env=bare, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert nocluster.returncode != 0
    assert nocluster.stderr.startswith("kubectl rlog: ") and "Traceback" not in nocluster.stderr
    assert "kubeconfig" in nocluster.stderr, nocluster.stderr
    assert shutil.which("python3", path=bare["PATH"])  # (the manifest's one requirement)
    assert os.access(plugin, os.X_OK)
