"""rlog.version.semver: the chart's and the image tags' spelling of the PEP 440 version."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.version import Version

from rlog import __version__
from rlog.version import PREVIOUS_RELEASE, semver

ROOT = Path(__file__).resolve().parents[1]
# SemVer 2's grammar (semver.org, the suggested regular expression)
SEMVER = re.compile(
    r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?"
)
# an image reference's tag (the distribution spec's grammar): no '+', at most 128 characters
IMAGE_TAG = re.compile(r"[\w][\w.-]{0,127}")


@pytest.mark.parametrize(
    ("pep440", "expected"),
    [
        ("0.1.0", "0.1.0"),
        ("0.2.0.dev0", "0.2.0-dev.0"),
        ("1.10.3.dev12", "1.10.3-dev.12"),
        ("0.2.0rc1", "0.2.0-rc.1"),
        ("0.2.0rc01", "0.2.0-rc.1"),
    ],
)
def test_spellings(pep440: str, expected: str) -> None:
    assert semver(pep440) == expected
    assert SEMVER.fullmatch(expected) and IMAGE_TAG.fullmatch(expected)


@pytest.mark.parametrize(
    "bad", ["v0.1.0", "0.1", "0.1.0+local", "0.1.0a1", "0.1.0.post1", "01.0.0", "0.1.0.dev", ""]
)
def test_what_it_cannot_spell_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match=re.escape("X.Y.Z, X.Y.Z.devN or X.Y.ZrcN")):
        semver(bad)


def _semver_key(v: str) -> tuple[tuple[int, ...], int, tuple[object, ...]]:
    """SemVer 2 precedence (enough for these forms): a pre-release sorts before its release."""
    core, _, pre = v.partition("-")
    parts = tuple(int(p) if p.isdigit() else p for p in pre.split(".")) if pre else ()
    return tuple(int(p) for p in core.split(".")), 0 if pre else 1, parts


def test_both_spellings_order_alike() -> None:
    versions = ["0.2.0", "0.1.0", "0.2.0rc1", "0.2.0.dev0", "0.2.0.dev1", "0.2.0rc2", "0.10.0"]
    by_pep440 = sorted(versions, key=Version)
    assert sorted(versions, key=lambda v: _semver_key(semver(v))) == by_pep440


def test_the_project_version_has_a_spelling_and_images_sh_gets_it() -> None:
    """e2e/cluster/images.sh runs `python3 -m rlog.version [VERSION]` with this tree's path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "replica_image")}
    run = [sys.executable, "-m", "rlog.version"]
    out = subprocess.run(run, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == semver(__version__)
    out = subprocess.run([*run, "0.3.0rc2"], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0.3.0-rc.2"
    bad = subprocess.run([*run, "0.3.0+x"], env=env, capture_output=True, text=True)
    assert bad.returncode == 2 and "X.Y.Z, X.Y.Z.devN or X.Y.ZrcN" in bad.stderr


def test_the_previous_release_is_a_release_before_this_version() -> None:
    """rlog.version.PREVIOUS_RELEASE, the tag the mixed-version tests run against: `v` and
    a release (no dev or rc) older than this tree's version; a release updates it."""
    assert PREVIOUS_RELEASE.startswith("v"), PREVIOUS_RELEASE
    previous = Version(PREVIOUS_RELEASE.removeprefix("v"))
    assert not previous.is_prerelease and semver(str(previous)) == str(previous)
    assert previous < Version(__version__)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "replica_image")}
    out = subprocess.run(
        [sys.executable, "-m", "rlog.version", "--previous-release"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == PREVIOUS_RELEASE
