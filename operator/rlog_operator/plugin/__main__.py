"""`python -m rlog_operator.plugin`: `kubectl rlog` where the console script is not on the
PATH."""

import sys

from rlog_operator.plugin.cli import main

sys.exit(main())
