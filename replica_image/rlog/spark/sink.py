"""The rlog sink: a task's rows appended through the leader in large calls, each ending with
a marker, so that a replayed task skips what it already appended; the batch and streaming
writers Spark calls (docs/spark.md: "Sink", "Exactly-once stream sink").
"""

from __future__ import annotations

import bisect
import concurrent.futures
import sys
import uuid
from array import array
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from rlog import packed
from rlog.client import Client, Credentials
from rlog.client.errors import InvalidArgument, PastEnd, RlogError, Truncated
from rlog.spark.connections import client_of, use_credentials
from rlog.spark.markers import MarkerSearch, encode_marker, open_key, random_key, secret_key
from rlog.spark.options import Options, WriteOptions
from rlog.spark.source import observe

MAX_APPEND_BYTES = 4 * 1024 * 1024
SCAN_WINDOW = 8192  # positions read per step of a marker scan


@dataclass
class RlogCommitMessage(WriterCommitMessage):
    sink: str
    partition: int
    rows: int
    chunks: int
    skipped_chunks: int = 0
    positions: list[int] = field(default_factory=list)  # lowest and highest position appended
    in_flight: int = 1  # append calls the task kept in flight


def value_column(batch: pa.RecordBatch) -> pa.Array:
    """The batch's `value` column as an Arrow BINARY array (STRING as its UTF-8 bytes, the
    same buffers); InvalidArgument if it has none, or nulls, or another type."""
    index = batch.schema.get_field_index("value")
    if index < 0:
        raise InvalidArgument("the rlog sink needs a 'value' column (BINARY or STRING)")
    column = batch.column(index)
    if column.null_count:
        raise InvalidArgument("the rlog sink's 'value' column has nulls: a value is required")
    if pa.types.is_binary(column.type):
        return column
    if (
        pa.types.is_string(column.type)
        or pa.types.is_large_string(column.type)
        or pa.types.is_large_binary(column.type)
    ):
        return column.cast(pa.binary())
    raise InvalidArgument(
        f"the rlog sink's 'value' column must be BINARY or STRING, not {column.type}"
    )


def _offsets(column: pa.Array) -> memoryview:
    """A binary array's len+1 int32 offsets (into its data buffer, not re-based)."""
    buffer = column.buffers()[1]
    if buffer is None:  # an empty array may have none
        return memoryview(array("i", [0]))
    return memoryview(buffer).cast("i")[column.offset : column.offset + len(column) + 1]


def chunks(batches: Iterator[pa.RecordBatch], rows: int) -> Iterator[list[pa.Array]]:
    """The values of the input cut into append calls of at most `rows` values and
    MAX_APPEND_BYTES (a single larger value alone), as slices of the input's value columns:
    the cut of `rlog.client.batched`, found with a binary search in the Arrow offsets
    instead of a look at each value. Deterministic for a given input (replays must cut the
    same chunks, whatever the input's record batch boundaries)."""
    pieces: list[pa.Array] = []
    count = size = 0
    for batch in batches:
        column = value_column(batch)
        offsets = _offsets(column)
        total = len(column)
        index = 0
        while index < total:
            # The values index .. end-1 fit: at most `rows - count` of them, within the bytes.
            fit = bisect.bisect_right(offsets, offsets[index] + MAX_APPEND_BYTES - size, index)
            end = min(fit - 1, index + rows - count, total)
            if end == index and not count:
                end = index + 1  # larger than a call: a call of its own
            if end > index:
                pieces.append(column.slice(index, end - index))
                count += end - index
                size += offsets[end] - offsets[index]
                index = end
            if index < total:  # value `index` does not fit this chunk
                yield pieces
                pieces, count, size = [], 0, 0
    if pieces:
        yield pieces


def packed_chunk(pieces: Sequence[pa.Array], marker: bytes) -> tuple[bytes, bytes]:
    """A chunk's values and its marker packed (data, offsets) from the Arrow buffers: Arrow
    concatenates the pieces and re-bases their offsets, no Python object per row."""
    column = pa.concat_arrays([*pieces, pa.array([marker], pa.binary())])
    count = len(column)
    offsets_buffer, data_buffer = column.buffers()[1], column.buffers()[2]
    assert offsets_buffer is not None and data_buffer is not None and column.offset == 0
    end = memoryview(offsets_buffer).cast("i")[count]
    offsets = offsets_buffer.slice(0, 4 * (count + 1)).to_pybytes()
    if sys.byteorder != "little":  # the wire's offsets are little-endian, Arrow's native
        offsets = packed.pack(column.to_pylist())[1]
    return data_buffer.slice(0, end).to_pybytes(), offsets


def find_markers(
    endpoints: Sequence[str],
    sink: str,
    batch: int,
    part: int,
    low: int | None,
    window: int,
    *,
    key: bytes,
) -> set[int]:
    """The chunk numbers of (sink, batch, part) already in the log, by their markers signed
    with `key` (any other is ignored: rlog.spark.markers). Scans back from the learned end
    in windows, down to `low` if given (exact), else until a marker of `sink` for an earlier
    batch, the log's begin, or `window` positions."""
    client = client_of(endpoints)
    status = client.status()
    search = MarkerSearch(sink, batch, part, key)

    def look(batches: Iterable[list[bytes]]) -> bool:
        """Look at the values; True if the scan may stop here."""
        earlier = False
        for values in batches:
            earlier = search.look(values) or earlier
        return earlier and low is None

    top = status.learned
    if status.role != "leader":
        # What the leader learned past this replica: a consistent read through the same
        # endpoint (forwarded to the leader), never the leader's own address, which may be
        # unreachable from here (a Kubernetes Service or a port-forward given alone).
        try:
            if look(read_values(client, top + 1, None)):
                return search.found
        except (PastEnd, Truncated):
            pass
    floor = max(status.begin, top - window + 1 if low is None else low)
    hi = top
    while hi >= floor:
        lo = max(floor, hi - SCAN_WINDOW + 1)
        try:
            batches = list(read_values(client, lo, hi))
        except Truncated:
            break
        if look(batches):
            break
        hi = lo - 1
    return search.found


def read_values(client: Client, first: int, last: int | None) -> Iterator[list[bytes]]:
    """The values of [first, last] (None: the learned end), a consistent read, in batches."""
    for entries in client.read_batches(first, last):
        yield [e.value for e in entries]


def write_chunks(
    endpoints: Sequence[str],
    batches: Iterator[pa.RecordBatch],
    sink: str,
    batch: int,
    part: int,
    rows: int,
    done: set[int],
    in_flight: int = 1,
    *,
    key: bytes,
) -> RlogCommitMessage:
    """Append each chunk not in `done` with its marker (signed with `key`) as the last entry
    of the same call.

    `in_flight` > 1: keep up to that many append calls in flight, sent in chunk order on one
    AppendStream, provided the endpoint the stream goes to is the leader now (a leader assigns
    positions in the order it receives the calls; a follower would forward each call on its
    own, in no guaranteed order): else one call at a time. If an append fails, the appends
    still in flight are waited for before the error is raised, so a retry's marker scan never
    races an append of the failed attempt."""
    message = RlogCommitMessage(sink, part, 0, 0)

    def appended(count: int, positions: Sequence[int]) -> None:
        message.rows += count
        if not message.positions:
            message.positions = [positions[0], positions[-1]]
        message.positions = [
            min(message.positions[0], positions[0]),
            max(message.positions[1], positions[-1]),
        ]

    def calls() -> Iterator[tuple[int, bytes, bytes]]:
        for number, pieces in enumerate(chunks(batches, rows)):
            message.chunks += 1
            if number in done:
                message.skipped_chunks += 1
                continue
            count = sum(len(piece) for piece in pieces)
            marker = encode_marker(sink, batch, part, number, count, key=key)
            yield count, *packed_chunk(pieces, marker)

    stream: Client | None = None
    if in_flight > 1:
        stream = client_of(endpoints, stream=True)
        try:
            leading = stream.status().role == "leader"  # the stream's own endpoint and channel
        except RlogError:
            leading = False
        if not leading:
            stream = None
    if stream is None:
        client = client_of(endpoints)
        for count, data, offsets in calls():
            appended(count, client.append_packed(data, offsets))
        message.in_flight = 1
        return message

    pending: deque[tuple[int, concurrent.futures.Future[Sequence[int]]]] = deque()
    try:
        for count, data, offsets in calls():
            while len(pending) >= in_flight:
                waiting, future = pending.popleft()
                appended(waiting, future.result())
            pending.append((count, stream.submit_append_packed(data, offsets)))
        while pending:
            waiting, future = pending.popleft()
            appended(waiting, future.result())
    except BaseException:
        concurrent.futures.wait([future for _, future in pending])
        raise
    message.in_flight = in_flight
    return message


def _secret_key(options: WriteOptions) -> bytes | None:
    """`secret_key` of the writer's options and credentials (the options', else the
    environment's, as `client_of`)."""
    credentials = options.credentials or Credentials.from_env()
    if credentials is None:
        return secret_key(options.sink_key, None, None)
    return secret_key(options.sink_key, credentials.token, credentials.key)


def leader_first(endpoints: tuple[str, ...]) -> tuple[str, ...]:
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

    def __init__(self, options: Options, overwrite: bool) -> None:
        if overwrite:
            raise InvalidArgument("the rlog sink only appends: use mode('append')")
        self.options = WriteOptions.parse(options)
        use_credentials(self.options.credentials)
        self.endpoints = leader_first(self.options.endpoints)
        self.write_id = "write-" + uuid.uuid4().hex
        # Signs the markers (rlog.spark.markers): made here, carried to the tasks.
        self.key = _secret_key(self.options) or random_key()
        try:  # where this write starts: a retried task scans for its markers from here
            self.start: int | None = observe(self.endpoints).learned + 1
        except RlogError:
            self.start = None

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RlogCommitMessage:
        from pyspark import TaskContext

        use_credentials(self.options.credentials)  # in the task's process
        context = TaskContext.get()
        part = context.partitionId() if context else 0
        retry = context is not None and context.attemptNumber() > 0
        done: set[int] = set()
        if retry:
            done = find_markers(
                self.endpoints,
                self.write_id,
                0,
                part,
                self.start,
                self.options.dedupe_window,
                key=self.key,
            )
        return write_chunks(
            self.endpoints,
            iterator,
            self.write_id,
            0,
            part,
            self.options.batch_size,
            done,
            self.options.in_flight,
            key=self.key,
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # the rows are in the log already

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass  # appended entries cannot be taken back (the log is append-only)


class RlogStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("rlog")`: exactly once per (sink id, batch id, partition), under
    the conditions docs/spark.md ("Exactly-once stream sink") lists.

    The sink id is the option `sinkId`, else the streaming query's id (stable across restarts
    of a query with the same checkpoint). Before appending, a task scans the log back from its
    learned end for the markers of its (sink, batch, partition) and skips the chunks already
    there. The scan stops at the first marker of this sink for an earlier batch (the driver's
    commit appends one each batch, so this is normally close to the end), else at the log's
    begin or after `dedupeWindow` positions."""

    def __init__(self, options: Options, overwrite: bool) -> None:
        if overwrite:
            raise InvalidArgument("the rlog sink only appends: use outputMode('append')")
        self.options = WriteOptions.parse(options)
        use_credentials(self.options.credentials)
        self.endpoints = leader_first(self.options.endpoints)
        # Signs the markers (rlog.spark.markers); None: the open key of the sink id.
        self.key = _secret_key(self.options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> RlogCommitMessage:
        from pyspark import TaskContext

        use_credentials(self.options.credentials)  # in the task's process
        context = TaskContext.get()
        if context is None:
            raise RlogError("the rlog stream sink runs in Spark tasks only")
        batch = int(context.getLocalProperty("streaming.sql.batchId") or 0)
        sink = self.options.sink_id or context.getLocalProperty("sql.streaming.queryId")
        sink = sink or "query"
        part = context.partitionId()
        key = self.key or open_key(sink)
        done = find_markers(
            self.endpoints, sink, batch, part, None, self.options.dedupe_window, key=key
        )
        return write_chunks(
            self.endpoints,
            iterator,
            sink,
            batch,
            part,
            self.options.batch_size,
            done,
            self.options.in_flight,
            key=key,
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        sinks = {m.sink for m in messages if isinstance(m, RlogCommitMessage)}
        if sinks:  # a stop for the next batch's marker scan
            client_of(self.endpoints).append(
                [
                    encode_marker(s, batchId, kind="commit", key=self.key or open_key(s))
                    for s in sinks
                ]
            )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass  # a replay of the batch skips what was appended
