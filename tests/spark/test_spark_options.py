"""rlog.spark's pure parts, without Spark or replicas: option parsing and its errors, the
sink's markers and the marker search, range splitting."""

from __future__ import annotations

import json

import pytest
from pyspark.sql.datasource import CaseInsensitiveDict

from rlog.client.errors import InvalidArgument
from rlog.spark.markers import (
    MARKER_MAGIC,
    MarkerSearch,
    decode_marker,
    encode_marker,
    is_marker,
    open_key,
    random_key,
    secret_key,
)
from rlog.spark.options import (
    DEFAULT_APPENDS_IN_FLIGHT,
    DEFAULT_BATCH_SIZE,
    DEFAULT_DEDUPE_WINDOW,
    DEFAULT_MAX_TRIGGER_DELAY,
    ReadOptions,
    StreamReadOptions,
    WriteOptions,
    filter_pushdown,
)
from rlog.spark.source import split_range, trigger_end

pytestmark = pytest.mark.spark

KEY = b"k" * 32  # the markers' key here (rlog.spark.markers.marker_key)

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


def test_stream_bounds_and_minimum_options():
    parsed = StreamReadOptions.parse(
        {**EP, "endingPosition": "99", "minEntriesPerTrigger": "10", "maxTriggerDelay": "1.5s"}
    )
    assert (parsed.ending, parsed.min_entries, parsed.max_trigger_delay) == (99, 10, 1.5)
    assert StreamReadOptions.parse(EP).max_trigger_delay == DEFAULT_MAX_TRIGGER_DELAY
    for text, seconds in [("500ms", 0.5), ("30s", 30.0), ("15m", 900.0), (" 1H ", 3600.0)]:
        given = {**EP, "minEntriesPerTrigger": "1", "maxTriggerDelay": text}
        assert StreamReadOptions.parse(given).max_trigger_delay == seconds
    for options, message in [
        ({"maxTriggerDelay": "5", "minEntriesPerTrigger": "1"}, "with its unit .* not '5'"),
        ({"maxTriggerDelay": "0s", "minEntriesPerTrigger": "1"}, "must be above zero"),
        ({"maxTriggerDelay": "5s"}, "bounds the wait of 'minEntriesPerTrigger', which is not"),
        ({"minEntriesPerTrigger": "0"}, "'minEntriesPerTrigger' must be at least 1"),
        (
            {"minEntriesPerTrigger": "11", "maxEntriesPerTrigger": "10"},
            r"'minEntriesPerTrigger' \(11\) is above 'maxEntriesPerTrigger' \(10\)",
        ),
        ({"endingPosition": "-1"}, "'endingPosition' is a position, not -1"),
        ({"endingPosition": "x"}, "'endingPosition' must be an integer"),
        (
            {"startingPosition": "50", "endingPosition": "49"},
            r"'startingPosition' \(50\) is after 'endingPosition' \(49\)",
        ),
    ]:
        with pytest.raises(InvalidArgument, match=message):
            StreamReadOptions.parse({**EP, **options})


def test_where_a_micro_batch_ends():
    # begin, available, max, min, waited, max delay, availableNow
    assert trigger_end(10, 110, None, None, 0.0, 60.0, False) == 110
    assert trigger_end(10, 110, 25, None, 0.0, 60.0, False) == 35
    assert trigger_end(10, 5, None, None, 0.0, 60.0, False) == 10  # nothing new
    # Fewer than the minimum: no batch until the delay has passed, then what there is.
    assert trigger_end(10, 15, None, 6, 59.9, 60.0, False) == 10
    assert trigger_end(10, 15, None, 6, 60.0, 60.0, False) == 15
    assert trigger_end(10, 16, None, 6, 0.0, 60.0, False) == 16  # the minimum is there
    assert trigger_end(10, 100, 20, 6, 0.0, 60.0, False) == 30
    # availableNow never waits for more: nothing more would come.
    assert trigger_end(10, 15, None, 6, 0.0, 60.0, True) == 15


def test_unknown_options_are_errors_naming_the_closest_known_one():
    # Spark hands the options over in lower case (its CaseInsensitiveDict): both spellings.
    for parse, key, hint in [
        (StreamReadOptions.parse, "maxOffsetsPerTrigger", "maxEntriesPerTrigger"),  # Kafka's
        (StreamReadOptions.parse, "maxoffsetspertrigger", "maxEntriesPerTrigger"),
        (StreamReadOptions.parse, "startingOffsets", "startingPosition"),
        (StreamReadOptions.parse, "maxEntriesPerTriger", "maxEntriesPerTrigger"),  # a typo
        (ReadOptions.parse, "endingOffsets", "to"),
        (StreamReadOptions.parse, "endingOffsets", "endingPosition"),
        (StreamReadOptions.parse, "minOffsetsPerTrigger", "minEntriesPerTrigger"),
        (ReadOptions.parse, "startingOffsets", "from"),
        (ReadOptions.parse, "partition", "partitions"),
        (ReadOptions.parse, "kafka.bootstrap.servers", "endpoints"),
        (WriteOptions.parse, "batchsise", "batchSize"),
        (WriteOptions.parse, "dedupWindow", "dedupeWindow"),
    ]:
        with pytest.raises(InvalidArgument) as caught:
            parse({**EP, key: "1"})
        message = str(caught.value)
        assert f"unknown option {key!r}" in message
        assert f"did you mean {hint!r}?" in message
    # Far from every known name: no guess, but the list of what there is.
    with pytest.raises(InvalidArgument) as caught:
        WriteOptions.parse({**EP, "compression": "zstd"})
    assert "did you mean" not in str(caught.value)
    assert "unknown option 'compression' for the rlog sink" in str(caught.value)
    assert "batchSize" in str(caught.value) and "sinkKey" in str(caught.value)
    # Each record has its own: the stream's option is unknown to a batch read, and back.
    with pytest.raises(InvalidArgument, match="for the rlog batch source"):
        ReadOptions.parse({**EP, "maxEntriesPerTrigger": "5"})
    with pytest.raises(InvalidArgument, match="for the rlog streaming source"):
        StreamReadOptions.parse({**EP, "from": "5"})
    # Spark's own keys pass, and known names in any case, as Spark's own map hands them over.
    given = CaseInsensitiveDict({**EP, "path": "/x", "checkpointLocation": "/c", "BATCHSIZE": "7"})
    assert list(given) == ["endpoints", "path", "checkpointlocation", "batchsize"]
    assert WriteOptions.parse(given).batch_size == 7
    read = ReadOptions.parse(CaseInsensitiveDict({**EP, "path": "/x", "SkipMarkers": "false"}))
    assert read.skip_markers is False


def test_filter_pushdown_option():
    assert filter_pushdown({}, True) and not filter_pushdown({}, False)
    assert filter_pushdown({"filterPushdown": "yes"}, False)
    assert not filter_pushdown({"filterPushdown": "0"}, True)


def test_markers_and_the_search():
    data = encode_marker("s", 3, 1, 2, 10, key=KEY)
    assert is_marker(data) and not is_marker(b"plain")
    fields = decode_marker(data)
    assert fields is not None and len(fields.pop("tag")) == 32
    assert fields == {
        "v": 2,
        "kind": "data",
        "sink": "s",
        "batch": 3,
        "part": 1,
        "chunk": 2,
        "rows": 10,
    }
    commit = decode_marker(encode_marker("s", 3, kind="commit", key=KEY))
    assert commit is not None and commit.pop("tag")
    assert commit == {"v": 2, "kind": "commit", "sink": "s", "batch": 3}
    search = MarkerSearch("s", 3, 1, KEY)
    assert not search.look(
        [data, encode_marker("s", 3, 0, 5, key=KEY), encode_marker("t", 1, 1, 7, key=KEY)]
    )
    assert search.found == {2}  # only (s, 3, 1): not another partition, not another sink
    assert search.look(
        [
            b"row",
            encode_marker("s", 2, kind="commit", key=KEY),
            encode_marker("s", 3, 1, 4, key=KEY),
        ]
    )
    assert search.found == {2, 4}


def test_a_marker_another_writer_made_counts_for_nothing():
    """The forgeries another writer can append (the sink id is in the clear): a marker
    signed with its own key, an unsigned one (as sinks before signing made), one whose
    fields were changed under a genuine tag. None of them makes a chunk count as appended,
    nor stops the scan as an earlier batch's marker would."""
    genuine = encode_marker("s", 3, 1, 2, 10, key=KEY)
    unsigned = (
        MARKER_MAGIC
        + json.dumps(
            {"v": 1, "kind": "data", "sink": "s", "batch": 3, "part": 1, "chunk": 0, "rows": 10}
        ).encode()
    )
    fields = decode_marker(genuine)
    assert fields is not None
    tampered = MARKER_MAGIC + json.dumps({**fields, "chunk": 1}).encode()
    forged = [
        encode_marker("s", 3, 1, 5, 10, key=b"x" * 32),
        unsigned,
        tampered,
        encode_marker("s", 2, kind="commit", key=b"x" * 32),  # a fake earlier batch
    ]
    search = MarkerSearch("s", 3, 1, KEY)
    assert not search.look(forged)
    assert search.found == set()
    assert not search.look([genuine]) and search.found == {2}


def test_the_markers_key():
    """From `sinkKey`, else the writer's token, else its client key: the same again (a
    restarted query finds its markers), another for other credentials; None without."""
    assert (
        secret_key("k", None, None) == secret_key("k", "t", b"pem") != secret_key("j", None, None)
    )
    assert (
        secret_key(None, "t", None) == secret_key(None, "t", b"pem") != secret_key(None, "u", None)
    )
    assert secret_key(None, None, b"pem") not in (None, secret_key(None, None, b"other"))
    assert secret_key(None, None, None) is None
    assert random_key() != random_key()
    assert open_key("s") == open_key("s") != open_key("t")
    assert WriteOptions.parse({**EP, "sinkKey": "k"}).sink_key == "k"
    assert WriteOptions.parse(EP).sink_key is None


def test_split_range():
    assert split_range(10, 19, 3) == [(10, 13), (14, 16), (17, 19)]
    assert split_range(5, 6, 4) == [(5, 5), (6, 6)]
    assert split_range(5, 4, 2) == []
