"""e2e/cluster/release_source.sh: which commit is the previous release, in every kind of clone.

The mixed-build and upgrade tests run this tree against the previous release. CI's clone once
had no tags, and a tag-only lookup failed it; the script now takes the tag if present (which
must be the commit rlog.version names), else the commit, else in a shallow clone fetches the
commit from `origin`, else exits 3 so the tests skip with the reason. Each case runs the real
script in a real git repository built here: a release commit, a later head naming it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from rlog.version import PREVIOUS_RELEASE, PREVIOUS_RELEASE_COMMIT

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = Path("e2e/cluster/release_source.sh")
TAG = "v9.8.7"


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def run(repo: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["bash", str(repo / SCRIPT), *args], capture_output=True)


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose first commit is release TAG and whose head names it in version.py."""
    repo = tmp_path / "upstream"
    (repo / SCRIPT.parent).mkdir(parents=True)
    for name in ("lib.sh", "release_source.sh"):
        shutil.copy(ROOT / "e2e" / "cluster" / name, repo / SCRIPT.parent / name)
    package = repo / "replica_image" / "rlog"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "9.8.7"\n')
    version_py = (ROOT / "replica_image" / "rlog" / "version.py").read_text()
    (package / "version.py").write_text(version_py)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "release")
    release = git(repo, "rev-parse", "HEAD")
    git(repo, "tag", "-a", TAG, "-m", "the release")
    (package / "__init__.py").write_text('__version__ = "9.9.0.dev0"\n')
    (package / "version.py").write_text(
        version_py.replace(f'"{PREVIOUS_RELEASE}"', f'"{TAG}"').replace(
            PREVIOUS_RELEASE_COMMIT, release
        )
    )
    git(repo, "commit", "-q", "-am", "head: next dev version")
    return repo, release


def test_the_tag_when_present(upstream: tuple[Path, str]) -> None:
    repo, release = upstream
    out = run(repo, "commit")
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == release


def test_the_commit_in_a_clone_without_tags(upstream: tuple[Path, str], tmp_path: Path) -> None:
    repo, release = upstream
    clone = tmp_path / "no-tags"
    subprocess.run(["git", "clone", "-q", "--no-tags", str(repo), str(clone)], check=True)
    assert git(clone, "tag") == ""
    out = run(clone, "commit")
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == release
    # and the release's files, not the head's
    tree = run(clone, "archive", "replica_image/rlog/__init__.py")
    listed = subprocess.run(
        ["tar", "-xO"], input=tree.stdout, capture_output=True, check=True
    ).stdout.decode()
    assert listed == '__version__ = "9.8.7"\n'


def test_a_moved_tag_is_an_error(upstream: tuple[Path, str]) -> None:
    repo, release = upstream
    git(repo, "tag", "-f", "-a", TAG, "-m", "moved", "HEAD")
    out = run(repo, "commit")
    assert out.returncode == 1 and out.stdout == b""
    assert f"git tag {TAG} is {git(repo, 'rev-parse', 'HEAD')}" in out.stderr.decode()
    assert release in out.stderr.decode()


def test_a_shallow_clone_fetches_the_commit(upstream: tuple[Path, str], tmp_path: Path) -> None:
    repo, release = upstream
    clone = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "-q", "--depth=1", "--no-tags", f"file://{repo}", str(clone)],
        check=True,
    )
    assert subprocess.run(["git", "-C", str(clone), "cat-file", "-e", release]).returncode != 0
    out = run(clone, "commit")
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == release


def test_a_clone_that_cannot_have_it_exits_3(upstream: tuple[Path, str], tmp_path: Path) -> None:
    repo, release = upstream
    clone = tmp_path / "shallow-alone"
    subprocess.run(
        ["git", "clone", "-q", "--depth=1", "--no-tags", f"file://{repo}", str(clone)],
        check=True,
    )
    git(clone, "remote", "remove", "origin")
    for args in (["commit"], ["archive", "replica_image"]):
        out = run(clone, *args)
        assert out.returncode == 3 and out.stdout == b"", out
        assert f"neither git tag {TAG} nor its commit {release}" in out.stderr.decode()


def test_this_repository_names_its_previous_release_consistently() -> None:
    """In this clone: the tag, where present, is PREVIOUS_RELEASE_COMMIT, and the commit is
    in HEAD's history wherever the history is there (it is a release of this line)."""
    out = run(ROOT, "commit")
    if out.returncode == 3:
        pytest.skip(out.stderr.decode())
    assert out.returncode == 0, out.stderr
    assert out.stdout.decode().strip() == PREVIOUS_RELEASE_COMMIT
    ancestor = subprocess.run(
        ["git", "-C", str(ROOT), "merge-base", "--is-ancestor", PREVIOUS_RELEASE_COMMIT, "HEAD"]
    )
    assert ancestor.returncode == 0, f"{PREVIOUS_RELEASE_COMMIT} is not in HEAD's history"
