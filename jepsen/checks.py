"""Direct checks of a history and of the replicas' logs after healing, beside Porcupine.

Each returns a list of problems (empty: the check passed), one line each. They need no
search, so they also say *which* operation went wrong, and when.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from jepsen.history import INFO, OK, Op


@dataclass
class StaleRead:
    read: Op
    missed: str  # a value acknowledged before the read began, absent from it
    known_at: int  # when it was known to be in the log


def replicas_agree(logs: Sequence[Sequence[tuple[int, str]] | None]) -> list[str]:
    """No position holds two values on any replica (each replica's stale read after healing;
    a lagging replica's log is a prefix), and no value is at two positions of one replica."""
    problems: list[str] = []
    at: dict[int, tuple[int, str]] = {}
    for replica, log in enumerate(logs):
        if log is None:
            continue
        seen: dict[str, int] = {}
        for position, value in log:
            if value in seen:
                problems.append(
                    f"replica {replica}: value {value} at positions {seen[value]} and {position}"
                )
            seen[value] = position
            if position in at and at[position][1] != value:
                other, other_value = at[position]
                problems.append(
                    f"position {position}: {other_value} on replica {other}, "
                    f"{value} on replica {replica}"
                )
            at.setdefault(position, (replica, value))
    return problems


def final_log_holds_the_appends(ops: Sequence[Op], final: Sequence[tuple[int, str]]) -> list[str]:
    """In the log after healing: no value twice, nothing that was never appended, every
    acknowledged append at its positions, every append whole and contiguous (or absent:
    only an append of unknown outcome may be)."""
    problems: list[str] = []
    position_of: dict[str, int] = {}
    for position, value in final:
        if value in position_of:
            problems.append(f"value {value} at positions {position_of[value]} and {position}")
        position_of[value] = position
    appended = {v for op in ops if op.f == "append" for v in op.values or []}
    for value in position_of.keys() - appended:
        problems.append(f"value {value} at position {position_of[value]} was never appended")
    for op in ops:
        if op.f != "append" or not op.values:
            continue
        present = [position_of.get(v) for v in op.values]
        if op.result == OK:
            if op.positions is None or len(op.positions) != len(op.values):
                problems.append(f"append {op.values} acknowledged without a position per value")
                continue
            if op.positions != list(range(op.positions[0], op.positions[0] + len(op.values))):
                problems.append(
                    f"append {op.values} acknowledged at {op.positions}: not contiguous"
                )
            if present != op.positions:
                problems.append(
                    f"append {op.values} acknowledged at {op.positions} but found at {present}"
                )
        elif any(p is not None for p in present):
            first = present[0]
            if first is None or present != list(range(first, first + len(present))):
                problems.append(f"append {op.values} ({op.result}) is partly or split: {present}")
            elif op.result != INFO:
                problems.append(f"append {op.values} failed but is in the log at {present}")
    return problems


def reads_are_sane(ops: Sequence[Op]) -> list[str]:
    """Every read returns increasing positions, each value once, only values appended."""
    problems: list[str] = []
    appended = {v for op in ops if op.f == "append" for v in op.values or []}
    for op in ops:
        if op.f != "read" or op.result != OK:
            continue
        positions = [p for p, _ in op.entries or []]
        values = [v for _, v in op.entries or []]
        if positions != sorted(set(positions)):
            problems.append(f"read by {op.process} at {op.invoke}: positions not increasing")
        if len(values) != len(set(values)):
            problems.append(f"read by {op.process} at {op.invoke}: a value twice")
        for value in set(values) - appended:
            problems.append(f"read by {op.process} at {op.invoke}: {value} was never appended")
    return problems


def appends_in_real_time_order(ops: Sequence[Op]) -> list[str]:
    """An append that completed before another began has a lower position."""
    acked = sorted(
        (op for op in ops if op.f == "append" and op.result == OK and op.position is not None),
        key=lambda op: op.invoke,
    )
    problems: list[str] = []
    # For each append, the highest position among appends completed before it began.
    by_complete = sorted(acked, key=lambda op: op.complete)
    best: tuple[int, Op] | None = None
    i = 0
    for op in acked:
        while i < len(by_complete) and by_complete[i].complete < op.invoke:
            done = by_complete[i]
            assert done.position is not None
            if best is None or done.position > best[0]:
                best = (done.position, done)
            i += 1
        assert op.position is not None
        if best is not None and op.position <= best[0]:
            problems.append(
                f"append {op.values} at {op.position} began after {best[1].values} "
                f"was acknowledged at {best[0]}"
            )
    return problems


def stale_reads(ops: Sequence[Op]) -> list[StaleRead]:
    """Reads that miss a value known to be in the log before the read began (the read's
    `from` permitting): its append was acknowledged, or another read had returned it, before
    this read was invoked. A linearizable log never returns those."""
    # (time it was known, position, value), in time order
    known: list[tuple[int, int, str]] = []
    for op in ops:
        if op.f == "append" and op.result == OK and op.positions and op.values:
            known += [(op.complete, p, v) for p, v in zip(op.positions, op.values, strict=False)]
        elif op.f == "read" and op.result == OK:
            known += [(op.complete, p, v) for p, v in op.entries or []]
    known.sort()
    found: list[StaleRead] = []
    for read in (op for op in ops if op.f == "read" and op.result == OK):
        values = {v for _, v in read.entries or []}
        for at, position, value in known:
            if at >= read.invoke:
                break
            if (read.from_ is None or position >= read.from_) and value not in values:
                found.append(StaleRead(read, value, at))
                break
    found.sort(key=lambda s: s.read.invoke)
    return found


def all_problems(
    ops: Sequence[Op],
    final: Sequence[tuple[int, str]] | None,
    replica_logs: Sequence[Sequence[tuple[int, str]] | None],
) -> dict[str, list[str]]:
    result: dict[str, list[str]] = defaultdict(list)
    result["replicas agree"] = replicas_agree(replica_logs)
    if final is None:
        result["final log"] = ["no final read succeeded"]
    else:
        result["final log"] = final_log_holds_the_appends(ops, final)
    result["reads"] = reads_are_sane(ops)
    result["append order"] = appends_in_real_time_order(ops)
    result["stale reads"] = [
        f"read by {s.read.process} via {s.read.endpoint} misses {s.missed}"
        for s in stale_reads(ops)
    ]
    return dict(result)
