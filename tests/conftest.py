import os
import sys
from pathlib import Path

import pytest

# gRPC's fork handlers, on by default in grpcio, restart gRPC's threads in a forked child;
# when the child then closes its inherited descriptors before exec (subprocess with a
# preexec_fn, as PySpark launches its JVM) a restarted poller trips over its closed epoll
# descriptor and the child dies before exec: 49 of 2,000 such children failed while other
# threads made calls (tests/tools/test_fork_exec.py). This process only ever forks to exec, or to
# run code without gRPC (tests/storage/test_storage.py), so the handlers only do harm here. Set
# before anything imports grpc, which reads it when it starts.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# tests/ holds the shared helpers (e.g. paxos_sim, live) that test modules import.
sys.path.insert(0, str(Path(__file__).parent))
# Helpers whose asserts are a test's checks (live.check, cli_runs.assert_one_line_error) have
# them rewritten as a test module's are, so that a failure shows the values compared.
pytest.register_assert_rewrite("live", "cli_runs", "raw_sockets")
# The repository root, last (it must shadow nothing): the consistency suite in jepsen/.
sys.path.append(str(Path(__file__).parents[1]))
