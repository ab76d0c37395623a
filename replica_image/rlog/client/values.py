"""What a caller hands the client and gets back: `Value`s to append, `Entry`s read, the
endpoint list (`parse_endpoints`), and the cut of many values into append calls
(`batched`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from rlog.config import ConfigError, parse_address

Value = bytes | bytearray | memoryview | str


@dataclass(frozen=True, slots=True)
class Entry:
    """One APPEND entry of the log."""

    position: int
    value: bytes

    @property
    def text(self) -> str:
        """The value decoded as UTF-8 (undecodable bytes as backslash escapes)."""
        return self.value.decode("utf-8", errors="backslashreplace")


def parse_endpoints(endpoints: str | Iterable[str]) -> list[str]:
    """`H:P`, `H:P,H:P`, or a list of those -> validated `H:P` strings (ConfigError if bad)."""
    items = [endpoints] if isinstance(endpoints, str) else list(endpoints)
    result: list[str] = []
    for item in items:
        for part in item.split(","):
            if part.strip():
                address = parse_address(part, "endpoint")
                if address not in result:
                    result.append(address)
    if not result:
        raise ConfigError("no endpoint given: expected HOST:PORT[,HOST:PORT...]")
    return result


def encode_value(value: Value) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"a value is bytes or str, not {type(value).__name__}")


def batched(values: Iterable[bytes], max_values: int, max_bytes: int) -> Iterator[list[bytes]]:
    """`values` cut, in order, into batches of at most `max_values` values and `max_bytes`
    bytes (a single larger value gets a batch of its own): one append call each.
    Deterministic: the same input is always cut the same way."""
    batch: list[bytes] = []
    size = 0
    for value in values:
        if batch and (len(batch) >= max_values or size + len(value) > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(value)
        size += len(value)
    if batch:
        yield batch


__all__ = ["Entry", "Value", "batched", "encode_value", "parse_endpoints"]
