"""The history of one run: operations as the checker reads them (one JSON object a line).

Times are `time.monotonic_ns()`: one clock for every client thread of the process.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OK = "ok"  # completed
FAIL = "fail"  # certainly did not happen (dropped by the checker)
INFO = "info"  # an append that may or may not have happened: open until the end

# The operation kinds (`f`). Every append kind lands its values at consecutive positions;
# "append" is plain (no session), "append-idempotent" goes through a client session that
# retries unknown outcomes itself, "append-if-next" names the position it must land at,
# "append-epoch" is fenced by a writer epoch that "take-epoch" took. "read" is linearizable;
# "read-min-position" is a stale read that must hold every position up to its bound.
APPEND = "append"
APPEND_IDEMPOTENT = "append-idempotent"
APPEND_IF_NEXT = "append-if-next"
APPEND_EPOCH = "append-epoch"
TAKE_EPOCH = "take-epoch"
READ = "read"
READ_MIN_POSITION = "read-min-position"
APPENDS = frozenset({APPEND, APPEND_IDEMPOTENT, APPEND_IF_NEXT, APPEND_EPOCH})
READS = frozenset({READ, READ_MIN_POSITION})


def now() -> int:
    return time.monotonic_ns()


@dataclass
class Op:
    process: int
    f: str  # one of APPENDS, READS or TAKE_EPOCH
    invoke: int
    complete: int = 0
    result: str = FAIL
    values: list[str] | None = None  # append
    position: int | None = None  # append, ok: the first value's position (take-epoch: its entry's)
    positions: list[int] | None = None  # append, ok: every value's position
    from_: int | None = None  # read
    entries: list[tuple[int, str]] | None = None  # read, ok
    if_next: int | None = None  # append-if-next: where its first value must land
    epoch: int | None = None  # append-epoch: its writer epoch; take-epoch, ok: the one taken
    min_position: int | None = None  # read-min-position: the position it must hold
    endpoint: str = ""
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        record: dict[str, Any] = {
            "process": self.process,
            "f": self.f,
            "invoke": self.invoke,
            "complete": self.complete,
            "result": self.result,
            "endpoint": self.endpoint,
        }
        if self.error:
            record["error"] = self.error
        for name in ("if_next", "epoch", "min_position"):
            if getattr(self, name) is not None:
                record[name] = getattr(self, name)
        if self.f in APPENDS:
            record["values"] = self.values
            if self.result == OK:
                record["position"] = self.position
                record["positions"] = self.positions
        elif self.f == TAKE_EPOCH:
            if self.result == OK:
                record["position"] = self.position
        else:
            record["from"] = self.from_
            if self.result == OK:
                record["entries"] = [[p, v] for p, v in self.entries or []]
        return record

    @staticmethod
    def from_json(record: dict[str, Any]) -> Op:
        entries = record.get("entries")
        return Op(
            process=record["process"],
            f=record["f"],
            invoke=record["invoke"],
            complete=record["complete"],
            result=record["result"],
            values=record.get("values"),
            position=record.get("position"),
            positions=record.get("positions"),
            from_=record.get("from"),
            entries=[(int(p), str(v)) for p, v in entries] if entries is not None else None,
            endpoint=record.get("endpoint", ""),
            error=record.get("error", ""),
            if_next=record.get("if_next"),
            epoch=record.get("epoch"),
            min_position=record.get("min_position"),
        )


@dataclass
class History:
    """Thread-safe list of completed operations, in completion order."""

    start: int = field(default_factory=now)
    ops: list[Op] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, op: Op) -> None:
        with self._lock:
            self.ops.append(op)

    def snapshot(self) -> list[Op]:
        with self._lock:
            return list(self.ops)

    def write(self, path: Path) -> None:
        with open(path, "w") as out:
            for op in self.snapshot():
                out.write(json.dumps(op.to_json(), separators=(",", ":")) + "\n")


def load(path: Path) -> list[Op]:
    return [Op.from_json(json.loads(line)) for line in path.read_text().splitlines() if line]
