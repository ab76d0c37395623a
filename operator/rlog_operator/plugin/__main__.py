"""`python -m rlog_operator.plugin`: `kubectl rlog` where the console script is not on the
PATH."""

import sys

from rlog_operator.plugin.cli import main

if __name__ == "__main__":  # imported alone (tests/test_imports.py), it runs nothing
    sys.exit(main())
