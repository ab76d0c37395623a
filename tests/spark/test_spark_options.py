"""rlog.spark's pure parts, without Spark or replicas: option parsing and its errors, the
sink's markers and the marker search, range splitting."""

from __future__ import annotations

import pytest

from rlog.client.errors import InvalidArgument
from rlog.spark.markers import MarkerSearch, decode_marker, encode_marker, is_marker
from rlog.spark.options import (
    DEFAULT_APPENDS_IN_FLIGHT,
    DEFAULT_BATCH_SIZE,
    DEFAULT_DEDUPE_WINDOW,
    ReadOptions,
    StreamReadOptions,
    WriteOptions,
    filter_pushdown,
)
from rlog.spark.source import split_range

pytestmark = pytest.mark.spark

EP = {"endpoints": "127.0.0.1:7000, 127.0.0.1:7001"}


def test_read_options():
    parsed = ReadOptions.parse({**EP, "from": "5", "to": " 9 ", "skipMarkers": "False"})
    assert parsed == ReadOptions(("127.0.0.1:7000", "127.0.0.1:7001"), 5, 9, None, False)
    assert ReadOptions.parse({"endpoint": "h:1"}) == ReadOptions(("h:1",), None, None, None, True)
    assert ReadOptions.parse({**EP, "to": ""}).last is None  # blank: not given
    for options, message in [
        ({}, "option 'endpoints' is required"),
        ({"endpoints": "no-port"}, "option 'endpoints'"),
        ({**EP, "from": "x"}, "option 'from' must be an integer, not 'x'"),
        ({**EP, "from": "9", "to": "5"}, r"option 'from' \(9\) is after 'to' \(5\)"),
        ({**EP, "partitions": "0"}, "option 'partitions' must be at least 1"),
        ({**EP, "skipMarkers": "maybe"}, "option 'skipMarkers' must be true or false"),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            ReadOptions.parse(options)


def test_stream_read_options():
    parsed = StreamReadOptions.parse(EP)
    assert (parsed.starting, parsed.max_entries, parsed.partitions) == ("earliest", None, None)
    assert StreamReadOptions.parse({**EP, "startingPosition": " Latest"}).starting == "latest"
    assert StreamReadOptions.parse({**EP, "startingPosition": "42"}).starting == 42
    with pytest.raises(InvalidArgument, match="earliest, latest or a position, not '-1'"):
        StreamReadOptions.parse({**EP, "startingPosition": "-1"})
    with pytest.raises(InvalidArgument, match="earliest, latest or a position, not 'first'"):
        StreamReadOptions.parse({**EP, "startingPosition": "first"})
    with pytest.raises(InvalidArgument, match="'maxEntriesPerTrigger' must be at least 1"):
        StreamReadOptions.parse({**EP, "maxEntriesPerTrigger": "0"})


def test_write_options():
    parsed = WriteOptions.parse(EP)
    assert (parsed.batch_size, parsed.in_flight, parsed.sink_id, parsed.dedupe_window) == (
        DEFAULT_BATCH_SIZE,
        DEFAULT_APPENDS_IN_FLIGHT,
        None,
        DEFAULT_DEDUPE_WINDOW,
    )
    parsed = WriteOptions.parse(
        {**EP, "batchSize": "10", "appendsInFlight": "4", "sinkId": "s", "dedupeWindow": "7"}
    )
    assert (parsed.batch_size, parsed.in_flight, parsed.sink_id, parsed.dedupe_window) == (
        10,
        4,
        "s",
        7,
    )
    for key in ("batchSize", "appendsInFlight", "dedupeWindow"):
        with pytest.raises(InvalidArgument, match=f"option '{key}' must be at least 1"):
            WriteOptions.parse({**EP, key: "0"})


def test_filter_pushdown_option():
    assert filter_pushdown({}, True) and not filter_pushdown({}, False)
    assert filter_pushdown({"filterPushdown": "yes"}, False)
    assert not filter_pushdown({"filterPushdown": "0"}, True)


def test_markers_and_the_search():
    data = encode_marker("s", 3, 1, 2, 10)
    assert is_marker(data) and not is_marker(b"plain")
    assert decode_marker(data) == {
        "v": 1,
        "kind": "data",
        "sink": "s",
        "batch": 3,
        "part": 1,
        "chunk": 2,
        "rows": 10,
    }
    commit = decode_marker(encode_marker("s", 3, kind="commit"))
    assert commit == {"v": 1, "kind": "commit", "sink": "s", "batch": 3}
    search = MarkerSearch("s", 3, 1)
    assert not search.look([data, encode_marker("s", 3, 0, 5), encode_marker("t", 1, 1, 7)])
    assert search.found == {2}  # only (s, 3, 1): not another partition, not another sink
    assert search.look([b"row", encode_marker("s", 2, kind="commit"), encode_marker("s", 3, 1, 4)])
    assert search.found == {2, 4}


def test_split_range():
    assert split_range(10, 19, 3) == [(10, 13), (14, 16), (17, 19)]
    assert split_range(5, 6, 4) == [(5, 5), (6, 6)]
    assert split_range(5, 4, 2) == []
