"""The options of format "rlog", parsed and checked once, on the driver (docs/spark.md).

Spark hands a data source its options as strings in a case-insensitive map; each reader and
writer parses them here into a small frozen record, so that a bad value fails at once with an
`InvalidArgument` naming the option, not later inside a task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rlog.client.clients import parse_endpoints
from rlog.client.errors import InvalidArgument
from rlog.config import ConfigError

DEFAULT_BATCH_SIZE = 8192
DEFAULT_DEDUPE_WINDOW = 1_000_000
# Measured: with 2 or more tasks, more calls in flight were not faster (bench/README.md).
DEFAULT_APPENDS_IN_FLIGHT = 1

Options = Mapping[str, Any]


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

    @classmethod
    def parse(cls, options: Options) -> ReadOptions:
        parsed = cls(
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

    @classmethod
    def parse(cls, options: Options) -> StreamReadOptions:
        return cls(
            endpoints=endpoints(options),
            starting=starting_position(text(options, "startingPosition")),
            max_entries=at_least_one(options, "maxEntriesPerTrigger"),
            partitions=at_least_one(options, "partitions"),
            skip_markers=boolean(options, "skipMarkers", True),
        )


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

    @classmethod
    def parse(cls, options: Options) -> WriteOptions:
        return cls(
            endpoints=endpoints(options),
            batch_size=count(options, "batchSize", DEFAULT_BATCH_SIZE),
            in_flight=count(options, "appendsInFlight", DEFAULT_APPENDS_IN_FLIGHT),
            sink_id=text(options, "sinkId"),
            dedupe_window=count(options, "dedupeWindow", DEFAULT_DEDUPE_WINDOW),
        )
