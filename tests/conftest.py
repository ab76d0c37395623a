import sys
from pathlib import Path

# tests/ holds shared helpers (e.g. paxos_sim) imported by several test modules.
sys.path.insert(0, str(Path(__file__).parent))
# The repository root, last (it must shadow nothing): the consistency suite in jepsen/.
sys.path.append(str(Path(__file__).parents[1]))
