"""`kubectl rlog` as one file, and the krew manifest that installs it (make release):

    python3 plugin_bundle.py VERSION DIST [--base-url URL]

writes into DIST:
  kubectl-rlog-VERSION.tar.gz  `kubectl-rlog` (a zipapp: the plugin, the rlog modules it
                               imports and the kubernetes client with its pure-Python
                               dependencies; it needs python3 3.11 or later and nothing
                               installed) and LICENSE
  rlog-krew-VERSION.yaml       a krew plugin manifest naming that archive and its sha256

A zipapp rather than a binary (PyInstaller, Nuitka): one portable file for every OS and
CPU that has a python3, built from the package index alone; the cost is that python3. The
zip cannot load C extensions, so none is shipped: PyYAML and charset-normalizer fall back
to their pure-Python code, as they do wherever their wheels' extensions do not load.

krew installs it from a local file (no index is involved, and the project has no public
download URL yet, so --base-url only names where the archive will be served):

    kubectl krew install --manifest=DIST/rlog-krew-VERSION.yaml \\
        --archive=DIST/kubectl-rlog-VERSION.tar.gz

Uses the running interpreter's pip, under constraints.txt (the versions the tests ran).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipapp
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# what the plugin imports besides the standard library: its own code and the kubernetes
# client (pyproject's `kubectl` extra); never grpc, protobuf or kopf. The client of 36, the
# last release whose models are plain Python: from 37 on they need pydantic-core, a Rust
# extension, which a zip cannot load (and which ties an archive to one Python and CPU).
# Installed, the plugin runs on the 37+ of constraints.txt; bundled, on this one, and
# e2e/operator/test_plugin_bundle.py runs the bundle against the cluster.
BUNDLED_CLIENT = "kubernetes==36.0.0"
REQUIREMENTS = [BUNDLED_CLIENT, "pyyaml"]
PACKAGES = {
    "rlog": ROOT / "replica_image" / "rlog",
    "rlog_operator": ROOT / "operator" / "rlog_operator",
}
MAIN = '''"""kubectl-rlog, the zipapp (e2e/cluster/plugin_bundle.py)."""
import sys

if sys.version_info < (3, 11):
    sys.exit(
        "kubectl rlog needs Python 3.11 or later; this python3 is %d.%d" % sys.version_info[:2]
    )

from rlog_operator.plugin.cli import main

sys.exit(main())
'''
DESCRIPTION = """\
Inspect and operate rlog ReplicatedLogs (a Paxos replicated log run by the rlog
operator): status of every replica, step-down, volume replacement, initialization,
backups, replica logs and a support bundle. Needs python3 3.11 or later on the PATH."""


def constraints(tmp: Path) -> Path:
    """constraints.txt without its kubernetes pin (the bundle takes BUNDLED_CLIENT)."""
    lines = (ROOT / "constraints.txt").read_text().splitlines()
    kept = [line for line in lines if not line.lower().startswith("kubernetes==")]
    path = tmp / "constraints.txt"
    path.write_text("\n".join(kept) + "\n")
    return path


def build_tree(stage: Path, tmp: Path) -> None:
    """The zipapp's contents under `stage`: the dependencies, the two packages, __main__."""
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile",
         "--disable-pip-version-check", "--target", str(stage),
         "-c", str(constraints(tmp)), *REQUIREMENTS],
        check=True,
    )  # fmt: skip
    for name, source in PACKAGES.items():
        shutil.copytree(source, stage / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in sorted(stage.rglob("*"), reverse=True):
        # C extensions (a zip cannot load them), compiled files, console scripts
        if path.is_file() and (path.suffix in (".so", ".pyd", ".pyc") or path.parent.name == "bin"):
            path.unlink()
    shutil.rmtree(stage / "bin", ignore_errors=True)
    (stage / "__main__.py").write_text(MAIN)


def add_file(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def manifest(version: str, archive: str, sha256: str, base_url: str) -> str:
    """The krew manifest (krew.googlecontainertools.github.com/v1alpha2 Plugin): one
    archive for every OS krew knows of that has a python3."""
    description = "\n".join(f"    {line}" for line in DESCRIPTION.splitlines())
    return f"""\
apiVersion: krew.googlecontainertools.github.com/v1alpha2
kind: Plugin
metadata:
  name: rlog
spec:
  version: v{version}
  shortDescription: Inspect and operate rlog replicated logs
  description: |
{description}
  caveats: |
    kubectl rlog runs with the python3 on your PATH (3.11 or later).
  platforms:
    - selector:
        matchExpressions:
          - {{key: os, operator: In, values: [linux, darwin]}}
      uri: {base_url.rstrip("/")}/{archive}
      sha256: {sha256}
      bin: kubectl-rlog
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version", help="the SemVer spelling of the project version")
    parser.add_argument("dist", type=Path)
    parser.add_argument(
        "--base-url",
        default=os.environ.get("RLOG_RELEASE_URL", "https://example.invalid/rlog/releases/v{v}"),
        help="where the archive will be served ({v}: the version); krew reads it only when "
        "installing without --archive",
    )
    args = parser.parse_args()
    args.dist.mkdir(parents=True, exist_ok=True)
    archive = f"kubectl-rlog-{args.version}.tar.gz"
    with tempfile.TemporaryDirectory(prefix="kubectl-rlog-") as tmp:
        stage = Path(tmp) / "stage"
        build_tree(stage, Path(tmp))
        pyz = Path(tmp) / "kubectl-rlog"
        zipapp.create_archive(stage, pyz, interpreter="/usr/bin/env python3", compressed=True)
        with tarfile.open(args.dist / archive, "w:gz") as tar:
            add_file(tar, "kubectl-rlog", pyz.read_bytes(), 0o755)
            add_file(tar, "LICENSE", (ROOT / "LICENSE").read_bytes(), 0o644)
    sha256 = hashlib.sha256((args.dist / archive).read_bytes()).hexdigest()
    text = manifest(args.version, archive, sha256, args.base_url.format(v=args.version))
    (args.dist / f"rlog-krew-{args.version}.yaml").write_text(text)
    print(args.dist / archive)
    return 0


if __name__ == "__main__":
    sys.exit(main())
