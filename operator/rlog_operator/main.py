"""Entry point of `rlog-operator` (the operator itself is issue 5)."""

import sys


def main() -> None:
    sys.stderr.write("rlog-operator: not built yet (see issue 5)\n")
    raise SystemExit(2)
