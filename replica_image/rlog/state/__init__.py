"""Replicated state on an rlog log: named, versioned variables shared by any number of
processes, mutations batched as the Mesos Registrar does, snapshots and compaction, strict
recovery. The design: docs/state.md.

    from rlog.state import State, Variable

    with State("127.0.0.1:7001") as state:
        v = state.fetch("leader")
        state.store(Variable("leader", b"node-3", v.version))
"""

from rlog.state.format import (
    FORMAT_VERSION,
    CorruptEntry,
    StateError,
    StateFormatError,
    UnknownFormat,
)
from rlog.state.image import Variable
from rlog.state.store import AsyncState, StateLost, StateRecoveryFailed
from rlog.state.sync import State

__all__ = [
    "FORMAT_VERSION",
    "AsyncState",
    "CorruptEntry",
    "State",
    "StateError",
    "StateFormatError",
    "StateLost",
    "StateRecoveryFailed",
    "UnknownFormat",
    "Variable",
]
