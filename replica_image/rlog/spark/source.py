"""The rlog source: plan position ranges over the VOTING replicas, read each range as Arrow
record batches (stale reads with failover), and the batch and streaming readers Spark calls
(docs/spark.md: "Partitioning and failover", "Streaming source").
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from rlog import packed
from rlog.client import Client, parse_endpoints, status_name
from rlog.client.errors import (
    NotVoting,
    PastEnd,
    RlogError,
    Timeout,
    Truncated,
    Unavailable,
)
from rlog.proto import rlog_pb2 as pb
from rlog.spark.connections import PLANNING_TIMEOUT, client_of, use_credentials
from rlog.spark.markers import MARKER_MAGIC
from rlog.spark.options import Options, ReadOptions, StreamReadOptions

SCHEMA = StructType(
    [
        StructField("position", LongType(), nullable=False),
        StructField("value", BinaryType(), nullable=False),
    ]
)
ARROW_SCHEMA = pa.schema(
    [pa.field("position", pa.int64(), nullable=False), pa.field("value", pa.binary(), False)]
)
# Positions asked per Read response (one Arrow batch each): 0, the server's own bounds (4 MiB
# of values, 1024 stored runs), so a run is never cut for the batch (docs/data-path.md,
# "Reads and Tail").
READ_MAX_BATCH = 0
_EMPTY = pa.RecordBatch.from_arrays(
    [pa.array([], pa.int64()), pa.array([], pa.binary())], schema=ARROW_SCHEMA
)


# ---- what the driver sees ---------------------------------------------------------------------


@dataclass(frozen=True)
class LogView:
    """What the driver saw of the log at planning time."""

    begin: int  # first position not truncated (the highest begin among VOTING replicas)
    learned: int  # highest position learned with no gap (the highest among VOTING replicas)
    replicas: tuple[tuple[str, int], ...]  # (endpoint, learned) of each VOTING replica reached
    leader: str | None  # endpoint of the leader, if one of the endpoints is the leader


def statuses(endpoints: Sequence[str]) -> dict[str, pb.StatusResponse | RlogError]:
    """Every endpoint's status, asked concurrently (an unreachable one: its error)."""
    return client_of(endpoints, timeout=PLANNING_TIMEOUT).statuses()


def observe(endpoints: Sequence[str]) -> LogView:
    """Ask every endpoint for its status. Unavailable if no VOTING replica answers."""
    voting: list[tuple[str, pb.StatusResponse]] = []
    errors: list[str] = []
    for endpoint, status in statuses(endpoints).items():
        if isinstance(status, RlogError):
            errors.append(f"{endpoint}: {status}")
        elif status.status != pb.VOTING:
            errors.append(f"{endpoint}: {status_name(status.status)}")
        else:
            voting.append((endpoint, status))
    if not voting:
        raise Unavailable("no VOTING replica among the endpoints: " + "; ".join(errors))
    leader = next((e for e, s in voting if s.role == "leader"), None)
    return LogView(
        begin=max(s.begin for _, s in voting),
        learned=max(s.learned for _, s in voting),
        replicas=tuple((e, s.learned) for e, s in voting),
        leader=leader,
    )


def wait_learned(endpoints: str | Sequence[str], position: int, timeout: float = 30.0) -> None:
    """Wait until every VOTING replica among `endpoints` has learned `position` (tests and
    examples: follower reads then cover everything)."""
    addresses = parse_endpoints(endpoints)
    deadline = time.monotonic() + timeout
    while True:
        seen = statuses(addresses)
        if all(isinstance(s, pb.StatusResponse) and s.learned >= position for s in seen.values()):
            return
        if time.monotonic() > deadline:
            learned = {e: s if isinstance(s, RlogError) else s.learned for e, s in seen.items()}
            raise Timeout(
                f"replicas did not learn position {position} within {timeout:g} s: {learned}"
            )
        time.sleep(0.05)


# ---- planning ------------------------------------------------------------------------------


@dataclass
class RlogPartition(InputPartition):
    """Positions [start, end] (inclusive), read from `replicas` in order (stale reads), then
    through `endpoints` (a consistent read, forwarded to the leader)."""

    start: int
    end: int
    replicas: tuple[str, ...]
    endpoints: tuple[str, ...]
    skip_markers: bool = True

    def __post_init__(self) -> None:
        InputPartition.__init__(self, (self.start, self.end))


def split_range(first: int, last: int, parts: int) -> list[tuple[int, int]]:
    """[first, last] cut into at most `parts` contiguous ranges of nearly equal length."""
    if last < first:
        return []
    total = last - first + 1
    parts = max(1, min(parts, total))
    ranges = []
    start = first
    for i in range(parts):
        size = total // parts + (1 if i < total % parts else 0)
        ranges.append((start, start + size - 1))
        start += size
    return ranges


def plan_partitions(
    view: LogView,
    endpoints: Sequence[str],
    first: int,
    last: int,
    parts: int | None,
    skip_markers: bool = True,
) -> list[RlogPartition]:
    """Partitions of [first, last]: range i goes to the VOTING replicas in turn from replica
    i mod k, those that had learned the whole range first; a range only the leader had
    learned goes to the leader first."""
    replicas = [e for e, _ in view.replicas]
    learned = dict(view.replicas)
    count = parts if parts is not None else max(1, len(replicas))
    result = []
    for i, (start, end) in enumerate(split_range(first, last, count)):
        rotated = replicas[i % len(replicas) :] + replicas[: i % len(replicas)]
        able = [e for e in rotated if learned[e] >= end]
        if not able and view.leader is not None:
            able = [view.leader]
        # A replica that had not learned the range yet may have by now: last before the leader.
        order = able + [e for e in rotated if e not in able]
        result.append(RlogPartition(start, end, tuple(order), tuple(endpoints), skip_markers))
    return result


# ---- reading ---------------------------------------------------------------------------------


_LITTLE = sys.byteorder == "little"
_counting = pa.array(range(1 << 14), pa.int64())  # 0, 1, ...: positions are first + these


def run_positions(first: int, count: int) -> pa.Array:
    """first, first+1, ..., first+count-1 as an int64 array (a slice of a shared 0, 1, ...
    plus `first`: vectorized, no Python int per row)."""
    global _counting
    if count > len(_counting):
        _counting = pa.array(range(max(count, 2 * len(_counting))), pa.int64())
    return pc.add(_counting.slice(0, count), pa.scalar(first, pa.int64()))


@dataclass(frozen=True)
class PackedRun:
    """A run's fields, each read from the message once: reading a bytes field of a protobuf
    message copies it, and a run's data is up to megabytes (docs/spark.md,
    "Performance notes")."""

    first: int
    data: bytes
    offsets: bytes  # count+1 little-endian uint32

    @property
    def count(self) -> int:
        return packed.count_of(self.offsets)

    @property
    def last(self) -> int:
        return self.first + self.count - 1


def packed_runs(runs: Sequence[pb.Run]) -> list[PackedRun]:
    """The runs that hold values, their fields read once each."""
    out = []
    for run in runs:
        offsets = run.offsets
        if packed.count_of(offsets):
            out.append(PackedRun(run.first, run.data, offsets))
    return out


def run_values(run: PackedRun) -> pa.Array:
    """A run's values as an Arrow binary array over its own buffers: the run's packed layout
    (data + count+1 little-endian uint32 offsets) is Arrow's binary layout."""
    if not _LITTLE:  # Arrow's offsets are native-endian
        return pa.array(packed.values_of(run.data, run.offsets), pa.binary())
    values = pa.Array.from_buffers(
        pa.binary(), run.count, [None, pa.py_buffer(run.offsets), pa.py_buffer(run.data)]
    )
    values.validate(full=True)  # offsets within data and never decreasing (C, per batch)
    return values


def to_arrow(runs: Sequence[pb.Run], skip_markers: bool) -> pa.RecordBatch:
    """Runs as one Arrow record batch of SCHEMA, without the sink's markers if asked; no
    Python object per row."""
    return arrow_batch(packed_runs(runs), skip_markers)


def arrow_batch(held: Sequence[PackedRun], skip_markers: bool) -> pa.RecordBatch:
    """`to_arrow` of runs whose fields are read already (each holding values)."""
    if not held:
        return _EMPTY
    positions = [run_positions(run.first, run.count) for run in held]
    values = [run_values(run) for run in held]
    batch = pa.RecordBatch.from_arrays(
        [
            positions[0] if len(held) == 1 else pa.concat_arrays(positions),
            values[0] if len(held) == 1 else pa.concat_arrays(values),
        ],
        schema=ARROW_SCHEMA,
    )
    # Markers are rare: one search of the raw bytes decides whether to look per row at all.
    if skip_markers and any(MARKER_MAGIC in run.data for run in held):
        marker = pc.starts_with(batch.column(1), pattern=MARKER_MAGIC)
        batch = batch.filter(pc.invert(marker))
    return batch


def read_range(
    client: Client, endpoint: str, first: int, last: int, stale: bool, skip_markers: bool
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """[first, last] read from `endpoint` only, one Arrow batch per server message, each with
    the last position the message covered (where to resume: its markers may have been
    dropped). The one place that turns what the client reads into Arrow columns."""
    batches = client.read_columns(first, last, stale, READ_MAX_BATCH, endpoint=endpoint)
    for runs in batches:
        held = packed_runs(runs)
        yield max(run.last for run in held), arrow_batch(held, skip_markers)


def read_partition(partition: RlogPartition) -> Iterator[pa.RecordBatch]:
    """The Arrow batches of one partition: a stale read of each of its replicas in turn, then
    a consistent read through each endpoint, resuming after the last position read."""
    # The replicas are among the endpoints when planned from them: one client of them all.
    client = client_of(tuple(dict.fromkeys(partition.endpoints + partition.replicas)))
    position = partition.start
    failures: list[str] = []
    attempts = [(e, True) for e in partition.replicas] + [(e, False) for e in partition.endpoints]
    for endpoint, stale in attempts:
        if position > partition.end:
            return
        try:
            for last, batch in read_range(
                client, endpoint, position, partition.end, stale, partition.skip_markers
            ):
                position = last + 1
                if batch.num_rows:
                    yield batch
            return
        except Truncated as error:
            raise Truncated(
                f"rlog: positions [{partition.start}, {partition.end}] are truncated "
                f"({error}); read from the log's begin on",
                error.code,
                error.endpoint,
                begin=error.begin,
            ) from None
        except (Unavailable, Timeout, NotVoting, PastEnd) as error:
            # Down, not VOTING, or a follower that has not learned the range yet.
            failures.append(f"{endpoint}{'' if stale else ' (leader read)'}: {error}")
            continue
    raise Unavailable(
        f"rlog: no replica could serve positions [{position}, {partition.end}]: "
        + "; ".join(failures)
    )


# ---- batch source ----------------------------------------------------------------------------


class RlogReader(DataSourceReader):
    """The batch reader (no filter pushdown: see `RlogPushdownReader`)."""

    def __init__(self, options: Options) -> None:
        self.options = ReadOptions.parse(options)
        use_credentials(self.options.credentials)
        # Position bounds from pushed filters (inclusive); clip silently, unlike from/to.
        self.low: int | None = None
        self.high: int | None = None

    def resolve(self, view: LogView) -> tuple[int, int]:
        """The range to read: [from, to] checked against the log, narrowed by filters."""
        first = view.begin if self.options.first is None else self.options.first
        last = view.learned if self.options.last is None else self.options.last
        if first < view.begin:
            raise Truncated(
                f"rlog: position {first} is truncated: the log begins at {view.begin} "
                f"(option 'from' must be at least {view.begin})",
                begin=view.begin,
            )
        if last > view.learned:
            raise PastEnd(
                f"rlog: position {last} is past the end of the log (end {view.learned}): "
                "option 'to' must be at most the learned end",
                end=view.learned,
            )
        if self.low is not None:
            first = max(first, self.low)
        if self.high is not None:
            last = min(last, self.high)
        return first, last

    def partitions(self) -> Sequence[InputPartition]:
        endpoints = self.options.endpoints
        view = observe(endpoints)
        first, last = self.resolve(view)
        return plan_partitions(
            view, endpoints, first, last, self.options.partitions, self.options.skip_markers
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RlogPartition):
            return  # no partitions (an empty range): Spark still calls read once
        use_credentials(self.options.credentials)  # in the task's process
        yield from read_partition(partition)


class RlogPushdownReader(RlogReader):
    """The batch reader with position-range filter pushdown (needs the session conf
    `spark.sql.python.filterPushdown.enabled=true`)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        for f in filters:
            if getattr(f, "attribute", None) != ("position",) or not isinstance(
                getattr(f, "value", None), int
            ):
                yield f
                continue
            value = int(f.value)  # type: ignore[attr-defined]  # checked just above
            if isinstance(f, EqualTo):
                self._narrow(value, value)
            elif isinstance(f, GreaterThan):
                self._narrow(value + 1, None)
            elif isinstance(f, GreaterThanOrEqual):
                self._narrow(value, None)
            elif isinstance(f, LessThan):
                self._narrow(None, value - 1)
            elif isinstance(f, LessThanOrEqual):
                self._narrow(None, value)
            else:
                yield f

    def _narrow(self, low: int | None, high: int | None) -> None:
        if low is not None:
            self.low = low if self.low is None else max(self.low, low)
        if high is not None:
            self.high = high if self.high is None else min(self.high, high)


# ---- streaming source --------------------------------------------------------------------------


def trigger_end(
    begin: int,
    available: int,
    max_entries: int | None,
    min_entries: int | None,
    waited: float,
    max_delay: float,
    available_now: bool,
) -> int:
    """Where the next micro-batch [begin, end) ends: at most `max_entries` positions of what
    is available; with `min_entries`, no batch (end = begin) while fewer are available and
    the last batch was less than `max_delay` seconds ago, as Kafka's minOffsetsPerTrigger.
    Under Trigger.AvailableNow the minimum is not waited for: nothing more would come."""
    end = available if max_entries is None else min(available, begin + max_entries)
    end = max(begin, end)
    if min_entries is not None and not available_now and end - begin < min_entries:
        if waited < max_delay:
            return begin
    return end


class RlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of position ranges [start, end) with offsets {"position": N}."""

    def __init__(self, options: Options) -> None:
        self.options = StreamReadOptions.parse(options)
        use_credentials(self.options.credentials)
        self._initial: dict[str, int] | None = None
        self._target: int | None = None  # availableNow: the end fixed at query start
        self._last_batch = time.monotonic()  # minEntriesPerTrigger waits from here

    def initialOffset(self) -> dict:
        # Resolved once and then fixed (Spark may call this more than once).
        if self._initial is None:
            starting = self.options.starting
            if starting == "earliest":
                self._initial = {"position": observe(self.options.endpoints).begin}
            elif starting == "latest":
                self._initial = {"position": observe(self.options.endpoints).learned + 1}
            else:
                self._initial = {"position": starting}
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_entries is not None:
            return ReadMaxRows(self.options.max_entries)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._available_end()

    def _available_end(self) -> int:
        """After the learned end, or after `endingPosition` if that comes first."""
        end = observe(self.options.endpoints).learned + 1
        if self.options.ending is not None:
            end = min(end, self.options.ending + 1)
        return end

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["position"])
        available_now = self._target is not None
        available = self._target if self._target is not None else self._available_end()
        now = time.monotonic()
        end = trigger_end(
            begin,
            available,
            int(limit.max_rows) if isinstance(limit, ReadMaxRows) else None,
            self.options.min_entries,
            now - self._last_batch,
            self.options.max_trigger_delay,
            available_now,
        )
        if end > begin:
            self._last_batch = now
        return {"position": end}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, stop = int(start["position"]), int(end["position"])
        if stop <= first:
            return []
        endpoints = self.options.endpoints
        view = observe(endpoints)
        if first < view.begin:
            raise Truncated(
                f"rlog: the stream is at position {first} but the log begins at {view.begin}: "
                "the positions in between were truncated before they were read",
                begin=view.begin,
            )
        return plan_partitions(
            view, endpoints, first, stop - 1, self.options.partitions, self.options.skip_markers
        )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RlogPartition):
            return
        use_credentials(self.options.credentials)  # in the task's process
        yield from read_partition(partition)

    def commit(self, end: dict) -> None:
        pass  # the log keeps everything; truncation is the application's decision
