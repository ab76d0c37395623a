"""Direct checks of a history and of the replicas' logs after healing, beside Porcupine.

Each returns a list of problems (empty: the check passed), one line each. They need no
search, so they also say *which* operation went wrong, and when.
"""

from __future__ import annotations

import bisect
import itertools
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from jepsen.history import (
    APPEND_EPOCH,
    APPEND_IF_NEXT,
    APPENDS,
    INFO,
    OK,
    READ,
    READ_MIN_POSITION,
    READS,
    TAKE_EPOCH,
    Op,
)


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


def final_log_holds_the_appends(
    ops: Sequence[Op], final: Sequence[tuple[int, str]], lagging: bool = False
) -> list[str]:
    """In the log after healing: no value twice, nothing that was never appended, every
    acknowledged append at its positions, every append whole and contiguous in call order
    (or absent: only an append of unknown outcome may be, and a failed one must be).

    `lagging`: the log is one replica's own, which may be a prefix of the log: an
    acknowledged append past its last position may be missing, and a batch may be cut at
    its end."""
    problems: list[str] = []
    position_of: dict[str, int] = {}
    for position, value in final:
        if value in position_of:
            problems.append(f"value {value} at positions {position_of[value]} and {position}")
        position_of[value] = position
    last = final[-1][0] if final else -1
    appended = {v for op in ops if op.f in APPENDS for v in op.values or []}
    for value in position_of.keys() - appended:
        problems.append(f"value {value} at position {position_of[value]} was never appended")
    for op in ops:
        if op.f not in APPENDS or not op.values:
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
            expected = [p if not lagging or p <= last else None for p in op.positions]
            if present != expected:
                problems.append(
                    f"append {op.values} acknowledged at {op.positions} but found at {present}"
                )
        elif any(p is not None for p in present):
            torn = _torn(present, last if lagging else None)
            if torn:
                problems.append(f"append {op.values} ({op.result}) is {torn}: {present}")
            elif op.result != INFO:
                problems.append(f"append {op.values} failed but is in the log at {present}")
    return problems


def _torn(present: Sequence[int | None], last: int | None) -> str:
    """Why a batch found at `present` (a position per value, None: absent) is not whole and
    contiguous in call order; "" if it is. `last`: the end of a lagging log, past which the
    batch may be cut."""
    known = [(k, p) for k, p in enumerate(present) if p is not None]
    base = known[0][1] - known[0][0]
    if any(p != base + k for k, p in known):
        return "split or out of order"
    if any(p is None and (last is None or base + k <= last) for k, p in enumerate(present)):
        return "partly present"
    return ""


def reads_see_batches_whole(ops: Sequence[Op]) -> list[str]:
    """A read that returns any value of a batch returns it at consecutive positions in call
    order, and every value of it whose position lies within what the read covers (from its
    `from` to its last entry)."""
    problems: list[str] = []
    batch_of: dict[str, tuple[int, Op]] = {}
    for op in ops:
        if op.f in APPENDS and op.values and len(op.values) > 1:
            for k, value in enumerate(op.values):
                batch_of[value] = (k, op)
    for read in ops:
        if read.f not in READS or read.result != OK or not read.entries:
            continue
        position_of = {v: p for p, v in read.entries}
        last = read.entries[-1][0]
        done: set[int] = set()
        for _, value in read.entries:
            if value not in batch_of or id(batch_of[value][1]) in done:
                continue
            batch = batch_of[value][1]
            done.add(id(batch))
            assert batch.values is not None
            present = [position_of.get(v) for v in batch.values]
            known = [(k, p) for k, p in enumerate(present) if p is not None]
            base = known[0][1] - known[0][0]
            start = read.from_ if read.from_ is not None else -1
            if any(p != base + k for k, p in known) or any(
                p is None and start <= base + k <= last for k, p in enumerate(present)
            ):
                problems.append(
                    f"read by {read.process} at {read.invoke}: batch {batch.values} "
                    f"({batch.result}) torn: {present}"
                )
    return problems


def reads_are_sane(ops: Sequence[Op]) -> list[str]:
    """Every read returns increasing positions, each value once, only values appended."""
    problems: list[str] = []
    appended = {v for op in ops if op.f in APPENDS for v in op.values or []}
    for op in ops:
        if op.f not in READS or op.result != OK:
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
        (op for op in ops if op.f in APPENDS and op.result == OK and op.position is not None),
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
    # When each (position, value) was first known: later sightings change nothing, and
    # keeping them made the check quadratic (every read repeats what earlier ones returned).
    first_known: dict[tuple[int, str], int] = {}
    for op in ops:
        seen: Iterable[tuple[int, str]]
        if op.f in APPENDS and op.result == OK and op.positions and op.values:
            seen = zip(op.positions, op.values, strict=False)
        elif op.f in READS and op.result == OK:
            seen = iter(op.entries or [])
        else:
            continue
        for pair in seen:
            if pair not in first_known or op.complete < first_known[pair]:
                first_known[pair] = op.complete
    known = sorted((at, p, v) for (p, v), at in first_known.items())
    positions_of: defaultdict[str, list[int]] = defaultdict(list)
    for _, p, v in known:
        positions_of[v].append(p)
    # Known pairs per position, counted as they become known (a Fenwick tree over the
    # positions in order), so "how many known pairs at >= from" is a logarithmic question.
    order = sorted({p for _, p, _ in known})
    rank = {p: i for i, p in enumerate(order)}
    tree = [0] * (len(order) + 1)

    def add(position: int) -> None:
        i = rank[position] + 1
        while i < len(tree):
            tree[i] += 1
            i += i & -i

    def below(position: int | None) -> int:  # known pairs at positions < position
        if position is None:
            return 0
        i = bisect.bisect_left(order, position)
        total = 0
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total

    found: list[StaleRead] = []
    reads = sorted((op for op in ops if op.f == READ and op.result == OK), key=lambda o: o.invoke)
    learned = 0
    for read in reads:
        while learned < len(known) and known[learned][0] < read.invoke:
            add(known[learned][1])
            learned += 1
        values = {v for _, v in read.entries or []}
        covered = sum(
            1
            for v in values
            for p in positions_of.get(v, ())
            if first_known[(p, v)] < read.invoke and (read.from_ is None or p >= read.from_)
        )
        if covered == learned - below(read.from_):
            continue
        # Some known pair is missing: name the first one known, as a reader of the report
        # would look for it.
        for at, position, value in known[:learned]:
            if (read.from_ is None or position >= read.from_) and value not in values:
                found.append(StaleRead(read, value, at))
                break
    return found


def conditional_appends_land_where_they_said(ops: Sequence[Op]) -> list[str]:
    """An acknowledged append-if-next is at the position it named. (A refused one must be
    absent: `final_log_holds_the_appends` holds every failed append to that.)"""
    return [
        f"append {op.values} if_next={op.if_next} acknowledged at {op.position}"
        for op in ops
        if op.f == APPEND_IF_NEXT and op.result == OK and op.position != op.if_next
    ]


def epochs_fence(ops: Sequence[Op]) -> list[str]:
    """Writer epochs, by the positions the log gave them: a newer epoch's EPOCH entry comes
    after an older one's, and no append fenced by an epoch was acknowledged at a position
    after the EPOCH entry of a newer epoch (from there on its epoch is fenced). A take-epoch
    of unknown outcome has no known position, so it fences nothing here."""
    problems: list[str] = []
    taken = sorted(
        (op.position, op.epoch)
        for op in ops
        if op.f == TAKE_EPOCH and op.result == OK
        if op.position is not None and op.epoch is not None
    )
    for (p1, e1), (p2, e2) in itertools.pairwise(taken):
        if e2 <= e1:
            problems.append(f"epoch {e1} taken at {p1} but epoch {e2} at {p2}")
    for op in ops:
        if op.f != APPEND_EPOCH or op.result != OK or not op.positions or op.epoch is None:
            continue
        for position, epoch in taken:
            if epoch > op.epoch and op.positions[-1] > position:
                problems.append(
                    f"append {op.values} with epoch {op.epoch} acknowledged at "
                    f"{op.positions} after epoch {epoch} was taken at {position}"
                )
                break
    return problems


def min_position_reads(ops: Sequence[Op], final: Sequence[tuple[int, str]] | None) -> list[str]:
    """A read-min-position (stale, at any replica) holds its bound (read-your-writes: the
    bound is the client's last acknowledged position, so that entry is in the read), and
    its entries are the final log's, all of them from its `from` to its last position."""
    problems: list[str] = []
    final_at = dict(final or [])
    final_positions = sorted(final_at)
    for read in ops:
        if read.f != READ_MIN_POSITION or read.result != OK or read.min_position is None:
            continue
        entries = read.entries or []
        last = entries[-1][0] if entries else -1
        who = f"read-min-position by {read.process} via {read.endpoint} at {read.invoke}"
        if read.min_position > 0 and read.min_position not in dict(entries):
            problems.append(f"{who}: misses its bound {read.min_position} (read to {last})")
        if final is None:
            continue
        start = read.from_ if read.from_ is not None else -1
        expected = [(p, final_at[p]) for p in final_positions if start <= p <= last]
        if list(entries) != expected:
            problems.append(f"{who}: {len(entries)} entries to {last}, not the final log's")
    return problems


def all_problems(
    ops: Sequence[Op],
    final: Sequence[tuple[int, str]] | None,
    replica_logs: Sequence[Sequence[tuple[int, str]] | None],
) -> dict[str, list[str]]:
    result: dict[str, list[str]] = defaultdict(list)
    result["replicas agree"] = replicas_agree(replica_logs)
    result["replica logs"] = [
        f"replica {i}: {problem}"
        for i, log in enumerate(replica_logs)
        if log is not None
        for problem in final_log_holds_the_appends(ops, log, lagging=True)
    ]
    if final is None:
        result["final log"] = ["no final read succeeded"]
    else:
        result["final log"] = final_log_holds_the_appends(ops, final)
    result["reads"] = reads_are_sane(ops)
    result["reads see batches whole"] = reads_see_batches_whole(ops)
    result["append order"] = appends_in_real_time_order(ops)
    result["conditional appends"] = conditional_appends_land_where_they_said(ops)
    result["epochs fence"] = epochs_fence(ops)
    result["read-your-writes"] = min_position_reads(ops, final)
    result["stale reads"] = [
        f"read by {s.read.process} via {s.read.endpoint} misses {s.missed}"
        for s in stale_reads(ops)
    ]
    return dict(result)
