"""Helpers of the hostile-input suite (tests/test_fuzz_*.py): request strategies built from
the proto descriptors, raw calls, raw sockets, and the tally the suite reports.

The run length: `RLOG_FUZZ_SCALE` (default 1) multiplies every example count; the default
run is part of `make test` and stays short, a long run is e.g. `RLOG_FUZZ_SCALE=20`. Set
`RLOG_FUZZ_REPORT=<file>` to get the tally as JSON (docs/faults.md quotes one).
"""

from __future__ import annotations

import json
import os
import resource
import socket
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import descriptor as d
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

from rlog.proto import rlog_pb2 as pb

SCALE = max(1, int(os.environ.get("RLOG_FUZZ_SCALE", "1")))
TALLY: Counter[str] = Counter()

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
EMPTY_SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
INVALID_UTF8 = [b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"a\x80b"]

_EDGE_U64 = [0, 1, 2, 2**31, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


def examples(base: int) -> int:
    return base * SCALE


def tally(key: str) -> None:
    TALLY[key] += 1


def write_report(extra: dict[str, Any]) -> None:
    """The tally (request class -> status code: count) and `extra`, as JSON."""
    target = os.environ.get("RLOG_FUZZ_REPORT")
    if target:
        report = {"scale": SCALE, "peer_full": PEER_FULL, **extra}
        report["tally"] = dict(sorted(TALLY.items()))
        Path(target).write_text(json.dumps(report, indent=1) + "\n")


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit (inherited by the replicas it starts) to at
    least `wanted` if it is lower; the new soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return soft
    new_hard = hard if hard == resource.RLIM_INFINITY or hard >= wanted else wanted
    resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, new_hard))
    return wanted


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


# ---- requests from the descriptors ---------------------------------------------------------

_SCALARS: dict[int, st.SearchStrategy[Any]] = {
    d.FieldDescriptor.TYPE_UINT64: st.one_of(st.sampled_from(_EDGE_U64), st.integers(0, 2**64 - 1)),
    d.FieldDescriptor.TYPE_FIXED64: st.integers(0, 2**64 - 1),
    d.FieldDescriptor.TYPE_UINT32: st.one_of(
        st.sampled_from([0, 1, 2**32 - 1]), st.integers(0, 2**32 - 1)
    ),
    d.FieldDescriptor.TYPE_FIXED32: st.integers(0, 2**32 - 1),
    d.FieldDescriptor.TYPE_INT64: st.integers(-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_SINT64: st.integers(-(2**63), 2**63 - 1),
    d.FieldDescriptor.TYPE_INT32: st.integers(-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_SINT32: st.integers(-(2**31), 2**31 - 1),
    d.FieldDescriptor.TYPE_BOOL: st.booleans(),
    d.FieldDescriptor.TYPE_ENUM: st.integers(-3, 12),  # open enums: unknown values too
    d.FieldDescriptor.TYPE_STRING: st.text(max_size=40),
    d.FieldDescriptor.TYPE_BYTES: st.one_of(
        st.binary(max_size=200), st.sampled_from([b"", b"\x00" * 4, b"\xff" * 9])
    ),
    d.FieldDescriptor.TYPE_DOUBLE: st.floats(allow_nan=True),
    d.FieldDescriptor.TYPE_FLOAT: st.floats(width=32, allow_nan=True),
}


def message(desc: d.Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of type `desc` with any subset of fields set to random or edge values."""
    cls = GetMessageClass(desc)
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for field in desc.fields:
        if field.type == d.FieldDescriptor.TYPE_MESSAGE:
            if depth >= 2:
                continue
            one: st.SearchStrategy[Any] = st.deferred(
                lambda f=field: message(f.message_type, depth + 1)
            )
        else:
            one = _SCALARS[field.type]
        if field.is_repeated:
            parts[field.name] = st.lists(one, max_size=4)
        else:
            parts[field.name] = st.one_of(st.none(), one)

    def build(values: dict[str, Any]) -> Message:
        msg = cls()
        for name, value in values.items():
            if value is None or value == []:
                continue
            field = desc.fields_by_name[name]
            if field.is_repeated:
                if field.type == d.FieldDescriptor.TYPE_MESSAGE:
                    getattr(msg, name).extend(value)
                else:
                    getattr(msg, name).extend(value)
            elif field.type == d.FieldDescriptor.TYPE_MESSAGE:
                getattr(msg, name).CopyFrom(value)
            else:
                setattr(msg, name, value)
        return msg

    return st.fixed_dictionaries(parts).map(build)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def string_fields(desc: d.Descriptor) -> list[int]:
    return [f.number for f in desc.fields if f.type == d.FieldDescriptor.TYPE_STRING]


@st.composite
def payload(draw: st.DrawFn, desc: d.Descriptor) -> tuple[str, bytes]:
    """A request's bytes and how it was made: a random valid message, one with invalid
    UTF-8 in a string field, or a valid one damaged (cut short, a byte flipped, garbage
    after it, pure garbage)."""
    valid = draw(message(desc)).SerializeToString()
    kind = draw(st.sampled_from(["valid", "valid", "utf8", "cut", "flip", "tail", "garbage"]))
    if kind == "utf8":
        numbers = string_fields(desc)
        if not numbers:
            kind = "valid"
        else:
            number = draw(st.sampled_from(numbers))
            bad = draw(st.sampled_from(INVALID_UTF8))
            return kind, valid + _varint(number << 3 | 2) + _varint(len(bad)) + bad
    if kind == "cut" and valid:
        return kind, valid[: draw(st.integers(0, len(valid) - 1))]
    if kind == "flip" and valid:
        at = draw(st.integers(0, len(valid) - 1))
        return kind, valid[:at] + bytes([valid[at] ^ draw(st.integers(1, 255))]) + valid[at + 1 :]
    if kind == "tail":
        return kind, valid + draw(st.binary(min_size=1, max_size=64))
    if kind == "garbage":
        return kind, draw(st.binary(max_size=256))
    return "valid", valid


# A peer message may carry any position or proposal (the peer service trusts its callers);
# values near 2^64 are a known open problem there (docs/faults.md, "Measured"), so the peer
# fuzz brings every integer below this unless RLOG_FUZZ_PEER_FULL=1.
PEER_FULL = os.environ.get("RLOG_FUZZ_PEER_FULL") == "1"
PLAUSIBLE = 1024


def plausible(raw: bytes, desc: d.Descriptor, log_id: str | None = None) -> bytes:
    """`raw` with every integer field (nested ones too) taken modulo PLAUSIBLE, and with
    `log_id` as its log id if given (a peer message of the log, not refused at the door), if
    it parses; unchanged if it does not (the replica refuses it whole) or under
    RLOG_FUZZ_PEER_FULL (integers only: the log id is still set)."""
    if PEER_FULL and log_id is None:
        return raw
    msg = GetMessageClass(desc)()
    try:
        msg.ParseFromString(raw)
    except Exception:
        return raw
    if not PEER_FULL:
        _clamp(msg)
    if log_id is not None and "log_id" in desc.fields_by_name:
        msg.log_id = log_id  # type: ignore[attr-defined]
    return msg.SerializeToString()


def _clamp(msg: Message) -> None:
    for field, value in msg.ListFields():
        if field.type == d.FieldDescriptor.TYPE_MESSAGE:
            for sub in value if field.is_repeated else [value]:
                _clamp(sub)
        elif field.type in (d.FieldDescriptor.TYPE_ENUM, d.FieldDescriptor.TYPE_BOOL):
            continue
        elif field.is_repeated and value and isinstance(value[0], int):
            value[:] = [v % PLAUSIBLE for v in value]
        elif isinstance(value, int):
            setattr(msg, field.name, value % PLAUSIBLE)


# ---- raw calls ---------------------------------------------------------------------------------


def method(service: str, name: str) -> d.MethodDescriptor:
    return pb.DESCRIPTOR.services_by_name[service].methods_by_name[name]


def call(
    channel: grpc.Channel,
    m: d.MethodDescriptor,
    payloads: list[bytes],
    timeout: float,
    max_responses: int = 20,
) -> tuple[grpc.StatusCode, str]:
    """Send raw request bytes on the method; its status code and details (OK if answered)."""
    path = f"/{m.containing_service.full_name}/{m.name}"
    try:
        if m.client_streaming:
            responses = channel.stream_stream(path)(iter(payloads), timeout=timeout)
            _drain(responses, max_responses)
        elif m.server_streaming:
            responses = channel.unary_stream(path)(payloads[0], timeout=timeout)
            _drain(responses, max_responses)
        else:
            channel.unary_unary(path)(payloads[0], timeout=timeout)
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""  # type: ignore[attr-defined]
    return grpc.StatusCode.OK, ""


def _drain(responses: Any, limit: int) -> None:
    for i, _ in enumerate(responses):
        if i + 1 >= limit:
            responses.cancel()
            return


def clear(code: grpc.StatusCode, details: str) -> bool:
    """Whether an answer is a clear one: OK, or any status with a message but UNKNOWN (an
    exception escaping a handler) and INTERNAL (gRPC's answer to a request that does not
    parse, which the replica's tolerant deserializers turn into INVALID_ARGUMENT)."""
    if code in (grpc.StatusCode.UNKNOWN, grpc.StatusCode.INTERNAL):
        return False
    return code == grpc.StatusCode.OK or bool(details)


# ---- raw sockets -------------------------------------------------------------------------------


def frame(kind: int, flags: int, stream: int, body: bytes, length: int | None = None) -> bytes:
    n = len(body) if length is None else length
    return (
        n.to_bytes(3, "big")
        + bytes([kind, flags])
        + (stream & 0x7FFFFFFF).to_bytes(4, "big")
        + body
    )


def send_raw(address: str, chunks: Iterable[bytes], read: bool = True) -> None:
    host, _, port = address.rpartition(":")
    with socket.create_connection((host.strip("[]"), int(port)), timeout=2) as sock:
        try:
            for chunk in chunks:
                sock.sendall(chunk)
            if read:
                sock.settimeout(0.2)
                try:
                    sock.recv(65536)
                except (TimeoutError, OSError):
                    pass
        except OSError:
            pass  # the server may close the connection as soon as it sees garbage


def status_ok(channel_factory: Callable[[], grpc.Channel]) -> pb.StatusResponse:
    with channel_factory() as channel:
        raw = channel.unary_unary("/rlog.v1.Log/Status")(
            pb.StatusRequest(local=True).SerializeToString(), timeout=5
        )
    return pb.StatusResponse.FromString(raw)
