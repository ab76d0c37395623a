"""The project version's two spellings: PEP 440 for Python, SemVer 2 for the chart and images.

`rlog.__version__` is written in PEP 440 (`0.2.0.dev0`), which pip and `pyproject.toml`
need. Helm requires SemVer 2 for a chart's version (`0.2.0-dev.0`), and an image tag may
hold only `[A-Za-z0-9_.-]` (no `+`), so the chart's `version`/`appVersion`
(tests/operator/test_chart.py) and the images' tags (e2e/cluster/images.sh, which runs
`python3 -m rlog.version [VERSION]`) use `semver(__version__)` (docs/upgrades.md, "Versions").
The spellings order alike: `X.Y.Z.devN` < `X.Y.ZrcN` < `X.Y.Z` in PEP 440, and `X.Y.Z-dev.N`
< `X.Y.Z-rc.N` < `X.Y.Z` in SemVer ("dev" sorts before "rc").
"""

from __future__ import annotations

import re
import sys

from rlog import __version__

# The git tag of the last release before this tree's version: the tests of a log mixing
# builds (tests/runtime/test_mixed_release_live.py) and of an upgrade from it
# (e2e/operator/test_upgrade_release.py, built by `e2e/cluster/images.sh release`) run this
# tree against it. Cutting a release updates it, in the commit that moves the head to the
# next .dev0 (docs/upgrades.md, "Versions"). Its commit too: a clone may lack the tag (a
# `git push` or `git clone --no-tags` leaves tags behind) but has the commit in its history;
# e2e/cluster/release_source.sh checks the two agree wherever both are present.
PREVIOUS_RELEASE = "v0.1.0"
PREVIOUS_RELEASE_COMMIT = "1848bbcd9d7b2557a81e5b144f435375d632953b"

# the PEP 440 versions this project uses: a release, a release candidate, a development build
_NUMBER = r"(?:0|[1-9]\d*)"
_PEP440 = re.compile(rf"(?P<core>{_NUMBER}\.{_NUMBER}\.{_NUMBER})(?:(?P<pre>rc|\.dev)(?P<n>\d+))?")


def semver(pep440: str) -> str:
    """The SemVer 2 spelling of a PEP 440 `X.Y.Z`, `X.Y.Z.devN` or `X.Y.ZrcN`.

    Anything else (a local `+label`, an alpha, a post release, a leading `v`) raises
    ValueError naming the forms accepted, rather than guessing a spelling Helm or an image
    tag would read differently.
    """
    match = _PEP440.fullmatch(pep440)
    if match is None:
        raise ValueError(
            f"version {pep440!r} is not X.Y.Z, X.Y.Z.devN or X.Y.ZrcN (PEP 440, no leading "
            "zeros): the chart and the image tags have no spelling for it"
        )
    if match["pre"] is None:
        return match["core"]
    label = "dev" if match["pre"] == ".dev" else "rc"
    # int(): SemVer forbids leading zeros in a numeric identifier; PEP 440 reads rc01 as rc1
    return f"{match['core']}-{label}.{int(match['n'])}"


def main(argv: list[str]) -> int:
    """`python3 -m rlog.version [VERSION]`: print the SemVer spelling of VERSION (default
    this tree's `__version__`); exit 2 with the reason on a version it cannot spell.
    `--previous-release`: print PREVIOUS_RELEASE (the tag `images.sh release` builds)."""
    if argv == ["--previous-release"]:
        print(PREVIOUS_RELEASE)
        return 0
    if len(argv) > 1:
        print(
            "usage: python3 -m rlog.version [PEP440-VERSION | --previous-release]", file=sys.stderr
        )
        return 2
    try:
        print(semver(argv[0] if argv else __version__))
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
