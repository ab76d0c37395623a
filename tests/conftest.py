import os
import sys
from pathlib import Path
from typing import Any

import pytest

# gRPC's fork handlers, on by default in grpcio, restart gRPC's threads in a forked child;
# when the child then closes its inherited descriptors before exec (subprocess with a
# preexec_fn, as PySpark launches its JVM) a restarted poller trips over its closed epoll
# descriptor and the child dies before exec: 49 of 2,000 such children failed while other
# threads made calls (tests/tools/test_fork_exec.py). This process only ever forks to exec, or to
# run code without gRPC (tests/storage/test_storage.py), so the handlers only do harm here. Set
# before anything imports grpc, which reads it when it starts.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

# Parallel runs (pytest -n N, `make unit`): each worker is its own process and draws the ports
# of its servers at random from its own slice of the listening ports (rlog.tools.dev.free_port),
# inherited by the processes it starts, so two workers never hand out the same port. One
# process remembers what it handed out; two did not know of each other, and both could see a
# port free before either bound it.
_worker = os.environ.get("PYTEST_XDIST_WORKER", "")
if _worker.startswith("gw"):
    from rlog.tools.dev import LISTEN_PORTS_ENV, listen_ports_slice

    os.environ[LISTEN_PORTS_ENV] = listen_ports_slice(
        int(_worker[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    )

# tests/ holds the shared helpers (e.g. paxos_sim, live) that test modules import.
sys.path.insert(0, str(Path(__file__).parent))
# Helpers whose asserts are a test's checks (live.check, cli_runs.assert_one_line_error) have
# them rewritten as a test module's are, so that a failure shows the values compared.
pytest.register_assert_rewrite("live", "cli_runs", "raw_sockets")
# The repository root, last (it must shadow nothing): the consistency suite in jepsen/.
sys.path.append(str(Path(__file__).parents[1]))


SPARK = "tests/spark/"


def _worker_unit(nodeid: str) -> str:
    """What one worker runs whole under `--dist loadfile` (`make unit`): a module, since many
    share a module-scoped cluster that a split would start once per worker; and all of
    tests/spark, which share a session-scoped SparkSession (a JVM) and log."""
    path = nodeid.split("::", 1)[0]
    return SPARK if path.startswith(SPARK) else path


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own, which would answer
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ByWorkerUnit(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _worker_unit(nodeid)

    return ByWorkerUnit(config, log)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In a worker: tests/spark first. Units go out in collection order, and the longest one
    (several minutes) handed out last would run on alone after the others finished."""
    if _worker:
        items.sort(key=lambda item: not item.nodeid.startswith(SPARK))
