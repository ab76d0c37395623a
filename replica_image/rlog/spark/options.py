"""The options of format "rlog", parsed and checked once, on the driver (docs/spark.md).

Spark hands a data source its options as strings in a case-insensitive map; each reader and
writer parses them here into a small frozen record, so that a bad value fails at once with an
`InvalidArgument` naming the option, not later inside a task.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rlog.client.errors import InvalidArgument
from rlog.client.security import Credentials, CredentialsError
from rlog.client.values import parse_endpoints
from rlog.config import ConfigError

DEFAULT_BATCH_SIZE = 8192
DEFAULT_DEDUPE_WINDOW = 1_000_000
# Measured (docs/performance.md, "What each change bought"): since the replicas store a
# call as one run, a call's time is mostly waiting (syncs, round trips), and 2 in flight per
# task wrote 1.2-1.5x the rows/s of 1; 4 were no faster than 2.
DEFAULT_APPENDS_IN_FLIGHT = 2
# As Kafka's source: a stream with minEntriesPerTrigger runs a smaller batch after this long.
DEFAULT_MAX_TRIGGER_DELAY = 15 * 60.0

Options = Mapping[str, Any]

# Every reader and writer takes these (endpoints and credentials).
CONNECTION_KEYS = ("endpoints", "endpoint", "ca", "cert", "key", "token", "tokenFile", "serverName")
# Keys Spark itself puts among a source's or sink's options: `load(path)`/`save(path)` and
# a streaming query's `checkpointLocation` given as an option.
SPARK_KEYS = frozenset({"path", "paths", "checkpointlocation"})
# What users of Kafka's and Delta's sources write out of habit, and rlog's options for it
# (the first one the source or sink has).
HABITS = {
    "maxoffsetspertrigger": ("maxEntriesPerTrigger",),
    "minoffsetspertrigger": ("minEntriesPerTrigger",),
    "maxfilespertrigger": ("maxEntriesPerTrigger",),
    "startingoffsets": ("startingPosition", "from"),
    "startingversion": ("startingPosition", "from"),
    "endingoffsets": ("endingPosition", "to"),
    "kafka.bootstrap.servers": ("endpoints",),
}


def check_known(options: Options, known: Iterable[str], what: str) -> None:
    """An option nobody reads is an error, never ignored: `maxOffsetsPerTrigger` given out
    of habit would otherwise leave micro-batches unbounded without a word. The error names
    the closest known option. Spark matches option names case-insensitively and hands them
    over in lower case, so they are compared in lower case. Rejected: a warning, which a
    streaming job's log buries."""
    by_lower = {name.lower(): name for name in (*CONNECTION_KEYS, *known)}
    for key in options:
        lower = str(key).lower()
        if lower in by_lower or lower in SPARK_KEYS:
            continue
        hint = next(
            (by_lower[h.lower()] for h in HABITS.get(lower, ()) if h.lower() in by_lower), None
        )
        if hint is None:
            close = difflib.get_close_matches(lower, by_lower, n=1, cutoff=0.6)
            hint = by_lower[close[0]] if close else None
        suggestion = f"; did you mean {hint!r}?" if hint else ""
        raise InvalidArgument(
            f"unknown option {key!r} for the rlog {what}{suggestion} "
            f"(its options: {', '.join(sorted(by_lower.values(), key=str.lower))})"
        )


def text(options: Options, key: str) -> str | None:
    """The option's value as a string, None if not given."""
    value = options.get(key)
    return None if value is None else str(value)


def integer(options: Options, key: str, default: int | None = None) -> int | None:
    """An integer option (blank: `default`)."""
    value = text(options, key)
    if value is None or value.strip() == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise InvalidArgument(f"option {key!r} must be an integer, not {value!r}") from None


def at_least_one(options: Options, key: str) -> int | None:
    """A count option: an integer of at least 1, None if not given."""
    value = integer(options, key)
    if value is not None and value < 1:
        raise InvalidArgument(f"option {key!r} must be at least 1")
    return value


def count(options: Options, key: str, default: int) -> int:
    """A count option with a default."""
    value = at_least_one(options, key)
    return default if value is None else value


def boolean(options: Options, key: str, default: bool) -> bool:
    value = text(options, key)
    if value is None:
        return default
    if value.strip().lower() in ("true", "1", "yes"):
        return True
    if value.strip().lower() in ("false", "0", "no"):
        return False
    raise InvalidArgument(f"option {key!r} must be true or false, not {value!r}")


def endpoints(options: Options) -> tuple[str, ...]:
    """The option `endpoints` (or `endpoint`): replica addresses, or one client Service."""
    value = text(options, "endpoints") or text(options, "endpoint")
    if not value:
        raise InvalidArgument(
            "option 'endpoints' is required: replica addresses H:P,H:P,... or a client Service"
        )
    try:
        return tuple(parse_endpoints(value))
    except ConfigError as error:
        raise InvalidArgument(f"option 'endpoints': {error}") from None


def _pem(options: Options, key: str) -> bytes | None:
    """A PEM option: the PEM text itself, or the path of a file every executor can read."""
    value = text(options, key)
    if not value:
        return None
    if "-----BEGIN" in value:
        return value.encode()
    try:
        with open(value, "rb") as file:
            return file.read()
    except OSError as exc:
        raise InvalidArgument(f"option '{key}': {value}: {exc.strerror or exc}") from None


def credentials(options: Options) -> Credentials | None:
    """The options `ca`, `cert`, `key` (PEM text or file paths), `token` or `tokenFile`,
    and `serverName` (rlog.client.security); none given: the RLOG_* variables of the
    process, else plaintext."""
    token = text(options, "token")
    token_file = text(options, "tokenFile")
    pems = {key: _pem(options, key) for key in ("ca", "cert", "key")}
    if not any(pems.values()) and not token and not token_file:
        return None
    try:
        if token_file:
            if token:
                raise CredentialsError("give token or tokenFile, not both")
            with open(token_file) as file:
                token = file.read().strip()
        return Credentials(
            pems["ca"], pems["cert"], pems["key"], token or None, text(options, "serverName")
        )
    except (CredentialsError, OSError) as exc:
        raise InvalidArgument(f"the TLS options: {exc}") from None


def filter_pushdown(options: Options, default: bool) -> bool:
    return boolean(options, "filterPushdown", default)


@dataclass(frozen=True)
class ReadOptions:
    """The batch source's options."""

    endpoints: tuple[str, ...]
    first: int | None  # `from`; None: the log's begin
    last: int | None  # `to` (inclusive); None: the learned end at planning time
    partitions: int | None  # None: one per VOTING replica reached
    skip_markers: bool
    credentials: Credentials | None = None

    KEYS = ("from", "to", "partitions", "skipMarkers", "filterPushdown")

    @classmethod
    def parse(cls, options: Options) -> ReadOptions:
        check_known(options, cls.KEYS, "batch source")
        parsed = cls(
            credentials=credentials(options),
            endpoints=endpoints(options),
            first=integer(options, "from"),
            last=integer(options, "to"),
            partitions=at_least_one(options, "partitions"),
            skip_markers=boolean(options, "skipMarkers", True),
        )
        if parsed.first is not None and parsed.last is not None and parsed.first > parsed.last:
            raise InvalidArgument(f"option 'from' ({parsed.first}) is after 'to' ({parsed.last})")
        return parsed


Starting = Literal["earliest", "latest"] | int


@dataclass(frozen=True)
class StreamReadOptions:
    """The streaming source's options."""

    endpoints: tuple[str, ...]
    starting: Starting  # `startingPosition`
    max_entries: int | None  # `maxEntriesPerTrigger`, counted in positions
    partitions: int | None
    skip_markers: bool
    credentials: Credentials | None = None
    ending: int | None = None  # `endingPosition`: the last position read (inclusive)
    min_entries: int | None = None  # `minEntriesPerTrigger`, counted in positions
    max_trigger_delay: float = DEFAULT_MAX_TRIGGER_DELAY  # `maxTriggerDelay`, in seconds

    KEYS = (
        "startingPosition",
        "endingPosition",
        "maxEntriesPerTrigger",
        "minEntriesPerTrigger",
        "maxTriggerDelay",
        "partitions",
        "skipMarkers",
    )

    @classmethod
    def parse(cls, options: Options) -> StreamReadOptions:
        check_known(options, cls.KEYS, "streaming source")
        delay = (text(options, "maxTriggerDelay") or "").strip()
        parsed = cls(
            credentials=credentials(options),
            endpoints=endpoints(options),
            starting=starting_position(text(options, "startingPosition")),
            max_entries=at_least_one(options, "maxEntriesPerTrigger"),
            partitions=at_least_one(options, "partitions"),
            skip_markers=boolean(options, "skipMarkers", True),
            ending=integer(options, "endingPosition"),
            min_entries=at_least_one(options, "minEntriesPerTrigger"),
            max_trigger_delay=duration("maxTriggerDelay", delay)
            if delay
            else DEFAULT_MAX_TRIGGER_DELAY,
        )
        if delay and parsed.min_entries is None:
            raise InvalidArgument(
                "option 'maxTriggerDelay' bounds the wait of 'minEntriesPerTrigger', "
                "which is not given"
            )
        if parsed.min_entries is not None and parsed.max_entries is not None:
            if parsed.min_entries > parsed.max_entries:
                raise InvalidArgument(
                    f"option 'minEntriesPerTrigger' ({parsed.min_entries}) is above "
                    f"'maxEntriesPerTrigger' ({parsed.max_entries})"
                )
        if parsed.ending is not None:
            if parsed.ending < 0:
                raise InvalidArgument(f"option 'endingPosition' is a position, not {parsed.ending}")
            if isinstance(parsed.starting, int) and parsed.starting > parsed.ending:
                raise InvalidArgument(
                    f"option 'startingPosition' ({parsed.starting}) is after "
                    f"'endingPosition' ({parsed.ending})"
                )
        return parsed


DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(key: str, value: str) -> float:
    """A duration option with its unit (500ms, 30s, 15m, 1h), in seconds. A bare number is
    refused rather than guessed: Spark's own durations read it as milliseconds, most
    people as seconds."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*", value.lower())
    if match is None:
        raise InvalidArgument(
            f"option {key!r} is a duration with its unit (500ms, 30s, 15m, 1h), not {value!r}"
        )
    seconds = float(match.group(1)) * DURATION_UNITS[match.group(2)]
    if seconds <= 0:
        raise InvalidArgument(f"option {key!r} must be above zero, not {value!r}")
    return seconds


def starting_position(value: str | None) -> Starting:
    word = (value or "earliest").strip().lower()
    if word == "earliest":
        return "earliest"
    if word == "latest":
        return "latest"
    try:
        position = int(word)
    except ValueError:
        position = -1
    if position < 0:
        raise InvalidArgument(
            f"option 'startingPosition' is earliest, latest or a position, not {word!r}"
        )
    return position


@dataclass(frozen=True)
class WriteOptions:
    """The sink's options (batch and stream)."""

    endpoints: tuple[str, ...]
    batch_size: int  # `batchSize`: rows per append call (and at most 4 MiB)
    in_flight: int  # `appendsInFlight`: append calls a task keeps in flight
    sink_id: str | None  # `sinkId` (stream): else the streaming query's id
    dedupe_window: int  # `dedupeWindow` (stream): how far back a replay looks for markers
    credentials: Credentials | None = None
    sink_key: str | None = None  # `sinkKey`: a secret the markers are signed with

    KEYS = ("batchSize", "appendsInFlight", "sinkId", "dedupeWindow", "sinkKey")

    @classmethod
    def parse(cls, options: Options) -> WriteOptions:
        check_known(options, cls.KEYS, "sink")
        return cls(
            credentials=credentials(options),
            endpoints=endpoints(options),
            batch_size=count(options, "batchSize", DEFAULT_BATCH_SIZE),
            in_flight=count(options, "appendsInFlight", DEFAULT_APPENDS_IN_FLIGHT),
            sink_id=text(options, "sinkId"),
            dedupe_window=count(options, "dedupeWindow", DEFAULT_DEDUPE_WINDOW),
            sink_key=text(options, "sinkKey") or None,
        )
