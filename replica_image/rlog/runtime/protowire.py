"""Pieces of the protobuf wire format that the runtime writes by hand, to put bytes it
already holds into a message without protobuf copying them (Fetch answers, the write
stream's request ids)."""

from __future__ import annotations


def varint(n: int) -> bytes:
    """`n` (>= 0) as a protobuf base-128 varint."""
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
