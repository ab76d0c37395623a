"""The replicated log as a Spark data source and sink (Python Data Source API, `rlog[spark]`).

    from rlog.spark import register
    register(spark)                                   # format "rlog"
    df = spark.read.format("rlog").option("endpoints", "h1:7000,h2:7000,h3:7000").load()
    df.select("value").write.format("rlog").option("endpoints", ...).mode("append").save()

Schema: `position BIGINT NOT NULL, value BINARY NOT NULL`: the log's APPEND entries (the NOP
and TRUNCATE entries are not rows, so positions have gaps; no `type` column: it would be
APPEND on every row).

Batch source options: `endpoints` (replica addresses "H:P,H:P", or one Kubernetes client
Service "name.ns.svc:7000"), `from`, `to` (inclusive; default: the log's begin .. the highest
learned position at planning time), `partitions` (default: one per VOTING replica reached),
`skipMarkers` (default true), `filterPushdown` (see `register`).

Partitions and failover. At planning time the driver asks every endpoint for its status; the
range [from, to] is split into equal position ranges, and each range is given to the VOTING
replicas in turn (partition i to replica i mod k first), but only to replicas that have
already learned the whole range (after non-leading catch-up a follower serves its own learned
entries: a stale read); ranges near the tail that only the leader has learned go to the
leader. A chosen entry never changes, so every replica that has learned a range returns the
same rows for it: the result does not depend on which replica served it. A partition's read
goes to its replicas in order, resuming after the last position it yielded when one is
unreachable, not VOTING, or has not learned the range (a lagging follower); the last resort
is a consistent read through any endpoint (forwarded to the leader). Below the log's begin
the read fails with `Truncated` (the range was truncated), past the learned end with `PastEnd`.

Streaming source: offsets `{"position": N}` (the next position to read), options
`startingPosition` (earliest | latest | N; resolved once per reader and then fixed), and
`maxEntriesPerTrigger` (counted in positions, so NOP entries and sink markers count).
`Trigger.AvailableNow` reads up to the learned end at query start. Each micro-batch is the
fixed position range [start, end), re-planned identically after a restart from Spark's offset
log: with Spark's checkpoint and an idempotent sink (files) the output is exactly once.

Single endpoint. Given one address (a Kubernetes client Service, or a `kubectl port-forward`
to it), the source and the sink contact that address only: never the peer addresses the
replicas report (cluster DNS names, unreachable from outside). Every partition is then read
through it (a stale read of that replica, else a consistent read forwarded to the leader):
set `partitions` to read several ranges in parallel.

Sink (`df.write` / `df.writeStream`): the `value` column (BINARY or STRING) is appended
through the leader in large append calls (`batchSize` rows, at most 4 MiB each). Each task
keeps up to `appendsInFlight` append calls in flight (default 1: with 2 or more tasks, more
was not faster, the replicas' CPU is the limit: bench/README.md), in its row order on one
AppendStream, when its endpoint is the leader (the first endpoint, if one of them leads);
through a follower (a Service or port-forward that does not reach the leader) it sends one
call at a time, since a follower forwards each call on its own. Order: a task's rows are in
the log in the task's order, unless an append failed or the leadership moved during the
task (with several calls in flight, a failure may leave a later call appended and an
earlier one not; the retry appends the missing chunks after it). `appendsInFlight=1` keeps
the order across failures too (a failure leaves a prefix). Each append
call carries, as its last entry, a batch marker: an entry whose value is

    MARKER_MAGIC + JSON {"v": 1, "sink": S, "batch": B, "part": P, "chunk": C, "rows": N}

with MARKER_MAGIC = b"\\x00\\xffrlog-spark-marker\\x00" (21 bytes); the driver's commit of a
streaming batch appends one more {"kind": "commit"} marker. The source skips every entry whose
value starts with MARKER_MAGIC (option `skipMarkers=false` shows them), so a user value that
starts with those 21 bytes is not readable through Spark. Before appending chunk C of
partition P of batch B, a task that may be a replay looks for the marker (S, B, P, C) in the
log and skips the chunk if it is there: see `RlogStreamWriter` for the guarantee and its
limits.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc
import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import BinaryType, LongType, StructField, StructType

from rlog.client.clients import Client, batched, parse_endpoints
from rlog.client.errors import (
    InvalidArgument,
    NotVoting,
    PastEnd,
    RlogError,
    Timeout,
    Truncated,
    Unavailable,
    from_rpc_error,
)
from rlog.client.wire import CLIENT_CHANNEL_OPTIONS
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "rlog"
SCHEMA = StructType(
    [
        StructField("position", LongType(), nullable=False),
        StructField("value", BinaryType(), nullable=False),
    ]
)
ARROW_SCHEMA = pa.schema(
    [pa.field("position", pa.int64(), nullable=False), pa.field("value", pa.binary(), False)]
)

MARKER_MAGIC = b"\x00\xffrlog-spark-marker\x00"
MARKER_VERSION = 1
DEFAULT_BATCH_SIZE = 8192
MAX_APPEND_BYTES = 4 * 1024 * 1024
DEFAULT_DEDUPE_WINDOW = 1_000_000
DEFAULT_APPENDS_IN_FLIGHT = 1  # measured: more was not faster with 2 tasks (bench/README.md)
SCAN_WINDOW = 8192
READ_MAX_BATCH = 4096


# ---- markers ---------------------------------------------------------------------------------


def encode_marker(
    sink: str, batch: int, part: int = -1, chunk: int = -1, rows: int = 0, kind: str = "data"
) -> bytes:
    """The value of a sink batch marker (see the module docstring)."""
    body: dict[str, Any] = {"v": MARKER_VERSION, "kind": kind, "sink": sink, "batch": batch}
    if kind == "data":
        body.update(part=part, chunk=chunk, rows=rows)
    return MARKER_MAGIC + json.dumps(body, separators=(",", ":")).encode()


def decode_marker(value: bytes) -> dict[str, Any] | None:
    """The marker's fields, or None if `value` is not a marker."""
    if not value.startswith(MARKER_MAGIC):
        return None
    try:
        body = json.loads(value[len(MARKER_MAGIC) :])
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


def is_marker(value: bytes) -> bool:
    return value.startswith(MARKER_MAGIC)


# ---- options -----------------------------------------------------------------------------------


def _opt(options: Any, key: str, default: str | None = None) -> str | None:
    value = options.get(key, default)
    return None if value is None else str(value)


def _int_opt(options: Any, key: str, default: int | None = None) -> int | None:
    value = _opt(options, key)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"option {key!r} must be an integer, not {value!r}") from None


def _bool_opt(options: Any, key: str, default: bool) -> bool:
    value = _opt(options, key)
    if value is None:
        return default
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {key!r} must be true or false, not {value!r}")


def _endpoints_opt(options: Any) -> tuple[str, ...]:
    value = _opt(options, "endpoints") or _opt(options, "endpoint")
    if not value:
        raise InvalidArgument(
            "option 'endpoints' is required: replica addresses H:P,H:P,... or a client Service"
        )
    return tuple(parse_endpoints(value))


# ---- connections (per process, opened lazily: everything here is pickled) ---------------------

_lock = threading.Lock()
_stubs: dict[str, pbg.LogStub] = {}
_clients: dict[tuple[tuple[str, ...], bool], Client] = {}


def _stub(endpoint: str) -> pbg.LogStub:
    with _lock:
        stub = _stubs.get(endpoint)
        if stub is None:
            channel = grpc.insecure_channel(endpoint, options=CLIENT_CHANNEL_OPTIONS)
            stub = _stubs[endpoint] = pbg.LogStub(channel)
        return stub


def _client(endpoints: Sequence[str], stream: bool = False) -> Client:
    """A client of `endpoints` (per process); `stream`: appends multiplexed on one
    AppendStream, so that several can be in flight in their order."""
    key = (tuple(endpoints), stream)
    with _lock:
        client = _clients.get(key)
        if client is None:
            client = _clients[key] = Client(list(key[0]), stream=stream)
        return client


def _status(endpoint: str, timeout: float = 5.0) -> pb.StatusResponse:
    try:
        response: pb.StatusResponse = _stub(endpoint).Status(pb.StatusRequest(), timeout=timeout)
        return response
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, endpoint) from None


def _statuses(endpoints: Sequence[str]) -> dict[str, pb.StatusResponse | RlogError]:
    results: dict[str, pb.StatusResponse | RlogError] = {}

    def ask(endpoint: str) -> None:
        try:
            results[endpoint] = _status(endpoint)
        except RlogError as error:
            results[endpoint] = error

    threads = [threading.Thread(target=ask, args=(e,)) for e in endpoints]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {e: results[e] for e in endpoints}


def _read_batches(
    endpoint: str, first: int, last: int, stale: bool
) -> Iterator[tuple[list[int], list[bytes]]]:
    """(positions, values) of the APPEND entries in [first, last] served by `endpoint`."""
    request = pb.ReadRequest(to=last, stale=stale, max_batch=READ_MAX_BATCH)
    setattr(request, "from", first)
    call = _stub(endpoint).Read(request)
    try:
        for response in call:
            entries = response.entries
            if entries:
                yield [e.position for e in entries], [e.value for e in entries]
    except grpc.RpcError as exc:
        raise from_rpc_error(exc, endpoint) from None
    finally:
        call.cancel()


def _to_arrow(positions: list[int], values: list[bytes], skip_markers: bool) -> pa.RecordBatch:
    if skip_markers:
        keep = [i for i, v in enumerate(values) if v.startswith(MARKER_MAGIC)]
        if keep:  # markers present: drop them (rare, so the common path stays a plain copy)
            gone = set(keep)
            positions = [p for i, p in enumerate(positions) if i not in gone]
            values = [v for i, v in enumerate(values) if i not in gone]
    return pa.RecordBatch.from_arrays(
        [pa.array(positions, pa.int64()), pa.array(values, pa.binary())], schema=ARROW_SCHEMA
    )


# ---- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LogView:
    """What the driver saw of the log at planning time."""

    begin: int  # first position not truncated (the highest begin among VOTING replicas)
    learned: int  # highest position learned with no gap (the highest among VOTING replicas)
    replicas: tuple[tuple[str, int], ...]  # (endpoint, learned) of each VOTING replica reached
    leader: str | None  # endpoint of the leader, if one of the endpoints is the leader


def observe(endpoints: Sequence[str]) -> LogView:
    """Ask every endpoint for its status. Unavailable if no VOTING replica answers."""
    voting: list[tuple[str, pb.StatusResponse]] = []
    errors: list[str] = []
    for endpoint, status in _statuses(endpoints).items():
        if isinstance(status, RlogError):
            errors.append(f"{endpoint}: {status}")
        elif status.status != pb.VOTING:
            errors.append(f"{endpoint}: {pb.Status.Name(status.status)}")
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
    """Partitions of [first, last] spread over the VOTING replicas (see the module docstring)."""
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


def read_partition(partition: RlogPartition) -> Iterator[pa.RecordBatch]:
    """The Arrow batches of one partition, failing over between replicas (module docstring)."""
    position = partition.start
    failures: list[str] = []
    attempts = [(e, True) for e in partition.replicas] + [(e, False) for e in partition.endpoints]
    for endpoint, stale in attempts:
        if position > partition.end:
            return
        try:
            for positions, values in _read_batches(endpoint, position, partition.end, stale):
                position = positions[-1] + 1
                batch = _to_arrow(positions, values, partition.skip_markers)
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


# ---- batch source ------------------------------------------------------------------------------


class RlogReader(DataSourceReader):
    """The batch reader (no filter pushdown: see `RlogPushdownReader`)."""

    def __init__(self, options: Any) -> None:
        self.endpoints = _endpoints_opt(options)
        self.first = _int_opt(options, "from")
        self.last = _int_opt(options, "to")
        self.parts = _int_opt(options, "partitions")
        if self.parts is not None and self.parts < 1:
            raise InvalidArgument("option 'partitions' must be at least 1")
        self.skip_markers = _bool_opt(options, "skipMarkers", True)
        if self.first is not None and self.last is not None and self.first > self.last:
            raise InvalidArgument(f"option 'from' ({self.first}) is after 'to' ({self.last})")
        # Position bounds from pushed filters (inclusive); clip silently, unlike from/to.
        self.low: int | None = None
        self.high: int | None = None

    def resolve(self, view: LogView) -> tuple[int, int]:
        """The range to read: [from, to] checked against the log, narrowed by filters."""
        first = view.begin if self.first is None else self.first
        last = view.learned if self.last is None else self.last
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
        view = observe(self.endpoints)
        first, last = self.resolve(view)
        return plan_partitions(view, self.endpoints, first, last, self.parts, self.skip_markers)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RlogPartition):
            return  # no partitions (an empty range): Spark still calls read once
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


class RlogStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batches of position ranges [start, end) with offsets {"position": N}."""

    def __init__(self, options: Any) -> None:
        self.endpoints = _endpoints_opt(options)
        self.starting = (_opt(options, "startingPosition") or "earliest").strip().lower()
        if self.starting not in ("earliest", "latest"):
            try:
                if int(self.starting) < 0:
                    raise ValueError
            except ValueError:
                raise InvalidArgument(
                    "option 'startingPosition' is earliest, latest or a position, "
                    f"not {self.starting!r}"
                ) from None
        self.max_entries = _int_opt(options, "maxEntriesPerTrigger")
        if self.max_entries is not None and self.max_entries < 1:
            raise InvalidArgument("option 'maxEntriesPerTrigger' must be at least 1")
        self.parts = _int_opt(options, "partitions")
        self.skip_markers = _bool_opt(options, "skipMarkers", True)
        self._initial: dict[str, int] | None = None
        self._target: int | None = None  # availableNow: the end fixed at query start

    def initialOffset(self) -> dict:
        # Resolved once and then fixed (Spark may call this more than once).
        if self._initial is None:
            if self.starting == "earliest":
                self._initial = {"position": observe(self.endpoints).begin}
            elif self.starting == "latest":
                self._initial = {"position": observe(self.endpoints).learned + 1}
            else:
                self._initial = {"position": int(self.starting)}
        return dict(self._initial)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.max_entries is not None:
            return ReadMaxRows(self.max_entries)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = observe(self.endpoints).learned + 1

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = int(start["position"])
        end = self._target if self._target is not None else observe(self.endpoints).learned + 1
        if isinstance(limit, ReadMaxRows):
            end = min(end, begin + int(limit.max_rows))
        return {"position": max(begin, end)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, stop = int(start["position"]), int(end["position"])
        if stop <= first:
            return []
        view = observe(self.endpoints)
        if first < view.begin:
            raise Truncated(
                f"rlog: the stream is at position {first} but the log begins at {view.begin}: "
                "the positions in between were truncated before they were read",
                begin=view.begin,
            )
        return plan_partitions(view, self.endpoints, first, stop - 1, self.parts, self.skip_markers)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RlogPartition):
            return
        yield from read_partition(partition)

    def commit(self, end: dict) -> None:
        pass  # the log keeps everything; truncation is the application's decision


# ---- sinks -------------------------------------------------------------------------------------


@dataclass
class RlogCommitMessage(WriterCommitMessage):
    sink: str
    partition: int
    rows: int
    chunks: int
    skipped_chunks: int = 0
    positions: list[int] = field(default_factory=list)  # lowest and highest position appended
    in_flight: int = 1  # append calls the task kept in flight


def _values(batch: pa.RecordBatch) -> list[bytes]:
    index = batch.schema.get_field_index("value")
    if index < 0:
        raise InvalidArgument("the rlog sink needs a 'value' column (BINARY or STRING)")
    column = batch.column(index)
    if column.null_count:
        raise InvalidArgument("the rlog sink's 'value' column has nulls: a value is required")
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return [s.encode() for s in column.to_pylist()]
    if pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
        return column.to_pylist()
    raise InvalidArgument(
        f"the rlog sink's 'value' column must be BINARY or STRING, not {column.type}"
    )


def chunks(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[list[bytes]]:
    """The values of the input cut into append calls of at most `rows` values and about
    MAX_APPEND_BYTES: deterministic for a given input (replays must cut the same chunks)."""
    values = (value for batch in batches for value in _values(batch))
    return batched(values, rows, MAX_APPEND_BYTES)


def find_markers(
    endpoints: Sequence[str],
    sink: str,
    batch: int,
    part: int,
    low: int | None,
    window: int,
) -> set[int]:
    """The chunk numbers of (sink, batch, part) already in the log. Scans back from the
    learned end in windows, down to `low` if given (exact), else until a marker of `sink` for
    an earlier batch, the log's begin, or `window` positions."""
    client = _client(endpoints)
    status = client.status()
    found: set[int] = set()

    def look(entries: Iterable[Any]) -> bool:
        """Collect the chunks of (sink, batch, part); True if an earlier batch's marker."""
        older = False
        for entry in entries:
            marker = decode_marker(entry.value) if is_marker(entry.value) else None
            if marker is None or marker.get("sink") != sink:
                continue
            if marker.get("batch") == batch and marker.get("part") == part:
                found.add(int(marker["chunk"]))
            elif isinstance(marker.get("batch"), int) and marker["batch"] < batch:
                older = True
        return older and low is None

    top = status.learned
    if status.role != "leader":
        # What the leader learned past this replica: a consistent read through the same
        # endpoint (forwarded to the leader), never the leader's own address, which may be
        # unreachable from here (a Kubernetes Service or a port-forward given alone).
        try:
            if look(e for b in client.read_batches(top + 1, None) for e in b):
                return found
        except (PastEnd, Truncated):
            pass
    floor = max(status.begin, top - window + 1 if low is None else low)
    hi = top
    while hi >= floor:
        lo = max(floor, hi - SCAN_WINDOW + 1)
        try:
            entries = [e for b in client.read_batches(lo, hi) for e in b]
        except Truncated:
            break
        if look(entries):
            break
        hi = lo - 1
    return found


def write_chunks(
    endpoints: Sequence[str],
    batches: Iterator[pa.RecordBatch],
    sink: str,
    batch: int,
    part: int,
    rows: int,
    done: set[int],
    in_flight: int = 1,
) -> RlogCommitMessage:
    """Append each chunk not in `done` with its marker as the last entry of the same call.

    `in_flight` > 1: keep up to that many append calls in flight, sent in chunk order on one
    AppendStream, provided the endpoint the stream goes to is the leader now (a leader assigns
    positions in the order it receives the calls; a follower would forward each call on its
    own, in no guaranteed order): else one call at a time. If an append fails, the appends
    still in flight are waited for before the error is raised, so a retry's marker scan never
    races an append of the failed attempt."""
    message = RlogCommitMessage(sink, part, 0, 0)

    def appended(count: int, positions: list[int]) -> None:
        message.rows += count
        if not message.positions:
            message.positions = [positions[0], positions[-1]]
        message.positions = [
            min(message.positions[0], positions[0]),
            max(message.positions[1], positions[-1]),
        ]

    def calls() -> Iterator[tuple[int, list[bytes]]]:
        for number, values in enumerate(chunks(batches, rows)):
            message.chunks += 1
            if number in done:
                message.skipped_chunks += 1
                continue
            yield len(values), [*values, encode_marker(sink, batch, part, number, len(values))]

    stream = _client(endpoints, stream=True) if in_flight > 1 else None
    if stream is not None:
        try:
            leading = stream.status().role == "leader"  # the stream's own endpoint and channel
        except RlogError:
            leading = False
        if not leading:
            stream = None
    if stream is None:
        client = _client(endpoints)
        for count, values in calls():
            appended(count, client.append(values))
        message.in_flight = 1
        return message

    pending: deque[tuple[int, concurrent.futures.Future[list[int]]]] = deque()
    try:
        for count, values in calls():
            while len(pending) >= in_flight:
                waiting, future = pending.popleft()
                appended(waiting, future.result())
            pending.append((count, stream.submit_append(values)))
        while pending:
            waiting, future = pending.popleft()
            appended(waiting, future.result())
    except BaseException:
        concurrent.futures.wait([future for _, future in pending])
        raise
    message.in_flight = in_flight
    return message


def _in_flight_opt(options: Any) -> int:
    value = _int_opt(options, "appendsInFlight", DEFAULT_APPENDS_IN_FLIGHT)
    if value is None or value < 1:
        raise InvalidArgument("option 'appendsInFlight' must be at least 1")
    return value


def _leader_first(endpoints: tuple[str, ...]) -> tuple[str, ...]:
    """The endpoints with the leader (if it is one of them) first: appends go straight there."""
    try:
        view = observe(endpoints)
    except RlogError:
        return endpoints
    if view.leader is None:
        return endpoints
    return (view.leader, *(e for e in endpoints if e != view.leader))


class RlogWriter(DataSourceArrowWriter):
    """`df.write.format("rlog").mode("append")`: each task appends its rows in chunks with
    markers keyed by (a write id made on the driver, 0, partition, chunk). A retried task
    (attempt > 0) first collects its markers appended since the write began, so a task retry
    never appends a chunk twice (a re-run of a whole stage, whose tasks start again at attempt
    0, is not deduplicated: PySpark's TaskContext does not expose the stage attempt). The write
    is not atomic: a failed job leaves the chunks its tasks appended in the log."""

    def __init__(self, options: Any, overwrite: bool) -> None:
        if overwrite:
            raise InvalidArgument("the rlog sink only appends: use mode('append')")
        self.endpoints = _leader_first(_endpoints_opt(options))
        self.rows = _int_opt(options, "batchSize", DEFAULT_BATCH_SIZE) or DEFAULT_BATCH_SIZE
        self.in_flight = _in_flight_opt(options)
        self.write_id = "write-" + uuid.uuid4().hex
        try:  # where this write starts: a retried task scans for its markers from here
            self.start: int | None = observe(self.endpoints).learned + 1
        except RlogError:
            self.start = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RlogCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        part = context.partitionId() if context else 0
        retry = context is not None and context.attemptNumber() > 0
        done: set[int] = set()
        if retry:
            done = find_markers(
                self.endpoints, self.write_id, 0, part, self.start, DEFAULT_DEDUPE_WINDOW
            )
        return write_chunks(
            self.endpoints, iterator, self.write_id, 0, part, self.rows, done, self.in_flight
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # the rows are in the log already

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # appended entries cannot be taken back (the log is append-only)


class RlogStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("rlog")`: exactly once per (sink id, batch id, partition).

    The sink id is the option `sinkId`, else the streaming query's id (stable across restarts
    of a query with the same checkpoint). Each task appends its rows in chunks, each append
    call ending with the marker (sink, batch, partition, chunk); before appending, the task
    scans the log back from its learned end for the markers of its (sink, batch, partition)
    and skips the chunks already there. The scan stops at the first marker of this sink for an
    earlier batch (micro-batches run one after the other, so everything an earlier attempt of
    this batch appended lies above it; the driver's commit appends a commit marker each batch
    so this stop is normally close to the end), else at the log's begin or after `dedupeWindow`
    positions (default 1,000,000; it bounds the first batch of a brand-new sink on a long log).

    Guarantee: a replayed batch (a task retry, or the batch re-run after a restart or a
    SIGKILL) appends every chunk exactly once, provided that
    - the replayed batch has the same rows in the same partitions (a deterministic query over
      a replayable source, e.g. rlog's or files), since chunks are identified by number;
    - each append call is chosen whole or not at all: true whenever its outcome was known, and
      for an append whose outcome was unknown (a leader failed mid-append) unless a new
      leader's fill split it (then a prefix without its marker may be appended twice; rows are
      never lost, because the marker is the call's last entry);
    - an earlier attempt's append is no longer in flight when the replay scans (a failing
      task waits for all of its appends in flight before it fails; an append outlives its
      60 s client deadline only if the leader is stuck);
    - the earlier attempt's markers are within `dedupeWindow` positions of the end and not
      truncated.
    """

    def __init__(self, options: Any, overwrite: bool) -> None:
        if overwrite:
            raise InvalidArgument("the rlog sink only appends: use outputMode('append')")
        self.endpoints = _leader_first(_endpoints_opt(options))
        self.rows = _int_opt(options, "batchSize", DEFAULT_BATCH_SIZE) or DEFAULT_BATCH_SIZE
        self.in_flight = _in_flight_opt(options)
        self.sink_id = _opt(options, "sinkId")
        self.window = _int_opt(options, "dedupeWindow", DEFAULT_DEDUPE_WINDOW) or 1

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RlogCommitMessage:
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:
            raise RlogError("the rlog stream sink runs in Spark tasks only")
        batch = int(context.getLocalProperty("streaming.sql.batchId") or 0)
        sink = self.sink_id or context.getLocalProperty("sql.streaming.queryId") or "query"
        part = context.partitionId()
        done = find_markers(self.endpoints, sink, batch, part, None, self.window)
        return write_chunks(
            self.endpoints, iterator, sink, batch, part, self.rows, done, self.in_flight
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sinks = {m.sink for m in messages if isinstance(m, RlogCommitMessage)}
        if sinks:  # a stop for the next batch's marker scan
            _client(self.endpoints).append(
                [encode_marker(s, batchId, kind="commit") for s in sinks]
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # a replay of the batch skips what was appended


# ---- the data source ---------------------------------------------------------------------------


class RlogDataSource(DataSource):
    """Format "rlog": batch and streaming source and sink (see the module docstring). Filter
    pushdown of position ranges is on when the option `filterPushdown` is true (the default
    of the class `register` picks when the session enables Python filter pushdown)."""

    pushdown_default = True

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        if _bool_opt(self.options, "filterPushdown", self.pushdown_default):
            return RlogPushdownReader(self.options)
        return RlogReader(self.options)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return RlogStreamReader(self.options)

    def writer(self, schema: StructType, overwrite: bool) -> RlogWriter:
        return RlogWriter(self.options, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> RlogStreamWriter:
        return RlogStreamWriter(self.options, overwrite)


class RlogDataSourceNoPushdown(RlogDataSource):
    """Format "rlog" for sessions without `spark.sql.python.filterPushdown.enabled`."""

    pushdown_default = False


def register(spark: SparkSession) -> None:
    """Register format "rlog" with the session: with filter pushdown of position ranges if
    the session enables Python filter pushdown, else without (Spark refuses a reader that
    pushes filters when the conf is off)."""
    enabled = str(spark.conf.get("spark.sql.python.filterPushdown.enabled", "false"))
    source = RlogDataSource if enabled.lower() == "true" else RlogDataSourceNoPushdown
    spark.dataSource.register(source)


def wait_learned(endpoints: str | Sequence[str], position: int, timeout: float = 30.0) -> None:
    """Wait until every VOTING replica among `endpoints` has learned `position` (tests and
    examples: follower reads then cover everything)."""
    addresses = parse_endpoints(endpoints)
    deadline = time.monotonic() + timeout
    while True:
        statuses = _statuses(addresses)
        if all(
            isinstance(s, pb.StatusResponse) and s.learned >= position for s in statuses.values()
        ):
            return
        if time.monotonic() > deadline:
            seen = {e: s if isinstance(s, RlogError) else s.learned for e, s in statuses.items()}
            raise Timeout(
                f"replicas did not learn position {position} within {timeout:g} s: {seen}"
            )
        time.sleep(0.05)


__all__ = [
    "ARROW_SCHEMA",
    "MARKER_MAGIC",
    "SCHEMA",
    "RlogDataSource",
    "RlogDataSourceNoPushdown",
    "RlogPartition",
    "RlogReader",
    "RlogStreamReader",
    "RlogStreamWriter",
    "RlogWriter",
    "decode_marker",
    "encode_marker",
    "is_marker",
    "plan_partitions",
    "register",
    "split_range",
]
