"""rlog: a Paxos replicated log in the design of the Mesos replicated log."""

# The project's version, its one source (docs/upgrades.md, "Versions"): the package's
# (pyproject.toml reads it), `rlog --version`, the operator's start-up line, the chart's
# version and appVersion (tests/operator/test_chart.py fails when they differ) and the
# project images' tags (e2e/cluster/images.sh). Bump it here only.
__version__ = "0.1.0"
