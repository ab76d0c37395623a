"""rlog: a Paxos replicated log in the design of the Mesos replicated log."""

# The project's version, its one source (docs/upgrades.md, "Versions"): the package's
# (pyproject.toml reads it), `rlog --version`, the operator's start-up line, the chart's
# version and appVersion (tests/operator/test_chart.py fails when they differ) and the
# project images' tags (e2e/cluster/images.sh), those two in its SemVer spelling
# (rlog.version.semver: 0.2.0.dev0 -> 0.2.0-dev.0). Bump it here only. Between releases it
# is the next release's .dev0, so a build of the head never passes for the last release.
__version__ = "0.2.0.dev0"
