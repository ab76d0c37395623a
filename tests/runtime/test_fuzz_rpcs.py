"""Hostile input against 3 real replicas (docs/faults.md, "Hostile input").

Every RPC of the Log and Admin services gets random and malformed requests (random fields,
edge and out-of-range positions, invalid UTF-8 in string ids, requests cut short, flipped,
with garbage after them, pure garbage); the raw port gets garbage and damaged HTTP/2;
oversized messages; 2,000 idle connections; Tail readers that never read. Throughout:
every replica stays up, every request gets a clear answer (`fuzzlib.clear`), and at the end
every acknowledged entry is still in the log, identical on every replica; replica memory is
measured (RSS) and bounded. The peer service (Replica) is fuzzed last, for clear answers
and liveness only: it trusts its callers for content (keeping strangers out of it is the
transport's job, not the input checks'), so a forged peer message may legitimately change
the log. Its integers are taken modulo 1024 unless RLOG_FUZZ_PEER_FULL=1 (values near
2^64 there are an open problem: docs/faults.md, "Measured", finding 5).

The default run is short (part of `make test`); `RLOG_FUZZ_SCALE=20` runs 20 times the
examples; `RLOG_FUZZ_REPORT=<file>` writes the tally as JSON.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from fuzzlib import (
    EMPTY_SETTINGS,
    PREFACE,
    clear,
    examples,
    frame,
    method,
    payload,
    plausible,
    raise_fd_limit,
    rss_bytes,
    send_raw,
    tally,
    write_report,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live import check

from rlog.client import Client
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster
from rlog.wire import CLIENT_CHANNEL_OPTIONS

pytestmark = pytest.mark.slow

MAX_MESSAGE = 8 << 20
MAX_TAILS = 64
IDLE_CONNECTIONS = 2000
FUZZ_SETTINGS = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


class Fuzzed:
    """The cluster under fuzz, the entries acknowledged before it, and one channel per
    replica."""

    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.acknowledged: dict[int, bytes] = {}
        self.channels = [
            grpc.insecure_channel(e, options=CLIENT_CHANNEL_OPTIONS) for e in cluster.endpoints
        ]
        self.rss: dict[str, list[int]] = {}

    def all_up(self) -> None:
        for i in range(3):
            assert self.cluster.running(i), f"replica {i} died:\n{self.cluster.log_tail(i)}"

    def record_rss(self, when: str) -> list[int]:
        values = [rss_bytes(self.cluster.pid(i) or 0) for i in range(3)]
        self.rss[when] = values
        return values


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    # 2,000 connections need more descriptors than the usual soft limit of 1024, in this
    # process (the client side) and in the replicas (they inherit it).
    raise_fd_limit(IDLE_CONNECTIONS + 2048)
    root: Path = tmp_path_factory.mktemp("fuzz")
    args = ["--max-message-size", str(MAX_MESSAGE), "--max-tail-readers", str(MAX_TAILS)]
    with DevCluster(
        3, root, distinct_hosts=True, election_timeout=0.5, replica_args=args
    ) as cluster:
        state = Fuzzed(cluster)
        with Client(cluster.endpoints) as client:
            for i in range(20):
                values = [b"acked-%d-%d" % (i, j) for j in range(10)]
                for position, value in zip(client.append(values), values, strict=True):
                    state.acknowledged[position] = value
        state.record_rss("start")
        try:
            yield state
        finally:
            for channel in state.channels:
                channel.close()
            write_report({"replica_rss_bytes": state.rss})
            print("\nfuzz tally:", dict(sorted(__import__("fuzzlib").TALLY.items())))
            print("replica RSS (bytes):", state.rss)


# RPCs of the client API and how long to wait for each. Truncate is fuzzed with positions
# that cannot cut acknowledged entries (0, 1, or past the end): a truncation inside the log
# is a legitimate deletion, not hostile input.
LOG_RPCS = [
    ("Log", "Append", 2.0),
    ("Log", "AppendStream", 2.0),
    ("Log", "Read", 2.0),
    ("Log", "Tail", 0.3),
    ("Log", "Truncate", 2.0),
    ("Log", "Status", 2.0),
    ("Log", "TakeEpoch", 2.0),
    ("Log", "OpenSession", 2.0),
    ("Admin", "GrantPermit", 2.0),
    ("Admin", "RevokePermit", 2.0),
    ("Admin", "StepDown", 2.0),
]


def _safe_truncate(raw: bytes) -> bytes:
    try:
        request = pb.TruncateRequest.FromString(raw)
    except Exception:
        return raw  # does not parse: the replica refuses it whole
    if 2 <= request.to < 2**62:
        request.to = 2**64 - 1 - request.to % 1000
        return request.SerializeToString()
    return raw


@given(data=st.data())
@settings(max_examples=examples(150), **FUZZ_SETTINGS)
def test_fuzz_every_client_rpc(fuzzed: Fuzzed, data: st.DataObject) -> None:
    service, name, timeout = data.draw(st.sampled_from(LOG_RPCS), label="rpc")
    m = method(service, name)
    count = data.draw(st.integers(1, 3)) if m.client_streaming else 1
    made = [data.draw(payload(m.input_type), label="request") for _ in range(count)]
    payloads = [raw for _, raw in made]
    if name == "Truncate":
        payloads = [_safe_truncate(raw) for raw in payloads]
    replica = data.draw(st.integers(0, 2), label="replica")
    code, details = __import__("fuzzlib").call(fuzzed.channels[replica], m, payloads, timeout)
    tally(f"{service}.{name} {made[0][0]} -> {code.name}")
    assert clear(code, details), f"{service}.{name} {made[0][0]}: {code.name} {details!r}"


def test_a_request_that_does_not_parse_is_named(fuzzed: Fuzzed) -> None:
    """Bytes that do not parse get INVALID_ARGUMENT naming the request type (gRPC alone
    would answer UNKNOWN); on a stream, the requests before them are answered first."""
    from fuzzlib import call

    garbage = b"\x0a\xff\xff\xff\xff\x0f"  # field 1, length 2**32 - 1: cut short
    code, details = call(fuzzed.channels[0], method("Log", "Append"), [garbage], 5.0)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert "does not parse as rlog.v1.AppendRequest" in details
    good = pb.AppendRequest(values=[b"before-garbage"], id=7).SerializeToString()
    path = "/rlog.v1.Log/AppendStream"
    leader = fuzzed.channels[fuzzed.cluster.wait_for_leader()]
    responses = leader.stream_stream(path)(iter([good, garbage]), timeout=5)
    answered = []
    with pytest.raises(grpc.RpcError) as ended:
        for raw in responses:
            answered.append(pb.AppendResponse.FromString(raw))
    assert ended.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "rlog.v1.AppendRequest" in (ended.value.details() or "")  # type: ignore[attr-defined]
    assert [(r.id, r.code, r.count) for r in answered] == [(7, 0, 1)], answered
    fuzzed.acknowledged[answered[0].first] = b"before-garbage"
    tally("unparsable Append / AppendStream -> INVALID_ARGUMENT naming the type")


def test_fuzz_huge_and_out_of_range_positions(fuzzed: Fuzzed) -> None:
    """Edge positions on every position-taking field of the client API, each answered
    clearly (read past the end: OUT_OF_RANGE; below the beginning: the entries from it)."""
    from fuzzlib import call

    edges = [2**64 - 1, 2**63, 2**63 - 1, 2**32, 10**12, 0]
    for position in edges:
        for replica in range(3):
            channel = fuzzed.channels[replica]
            cases = [
                ("Read", pb.ReadRequest(**{"from": position})),
                ("Read", pb.ReadRequest(**{"from": position, "to": 2**64 - 1})),
                ("Read", pb.ReadRequest(to=position)),
                ("Read", pb.ReadRequest(min_position=position)),
                ("Read", pb.ReadRequest(**{"from": position}, stale=True)),
                ("Tail", pb.TailRequest(**{"from": position})),
                ("Append", pb.AppendRequest(values=[b"edge"], if_next=position)),
                ("Append", pb.AppendRequest(values=[b"edge"], epoch=position)),
                ("Append", pb.AppendRequest(values=[b"edge"], session=position, sequence=1)),
            ]
            if position > 10**6:
                cases.append(("Truncate", pb.TruncateRequest(to=position)))
            for name, request in cases:
                # Tail and a read at an unreached min_position wait for entries that may
                # come: they end at the deadline, kept short.
                waits = name == "Tail" or (name == "Read" and request.HasField("min_position"))
                code, details = call(
                    channel,
                    method("Log", name),
                    [request.SerializeToString()],
                    0.4 if waits else 1.0,
                )
                tally(f"edge Log.{name} -> {code.name}")
                assert clear(code, details), f"{name} {request}: {code.name} {details!r}"
    fuzzed.all_up()


def test_oversized_messages_are_refused_clearly(fuzzed: Fuzzed) -> None:
    from fuzzlib import call

    big = pb.AppendRequest(values=[b"x" * (MAX_MESSAGE + 1)]).SerializeToString()
    code, details = call(fuzzed.channels[0], method("Log", "Append"), [big], 10.0)
    tally(f"oversized Append ({len(big)} bytes) -> {code.name}")
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED, (code, details)
    # Under the message limit but over the entry limit: the replica's own refusal.
    large = pb.AppendRequest(values=[b"y" * (4 << 20 | 1)]).SerializeToString()
    code, details = call(fuzzed.channels[1], method("Log", "Append"), [large], 10.0)
    tally(f"entry over --max-entry-size -> {code.name}")
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "maximum entry size" in details
    # A packed batch whose offsets claim far more than it carries.
    lying = pb.AppendRequest(
        data=b"abc", offsets=(0).to_bytes(4, "little") + (2**31).to_bytes(4, "little")
    )
    code, details = call(
        fuzzed.channels[2], method("Log", "Append"), [lying.SerializeToString()], 5.0
    )
    tally(f"lying offsets -> {code.name}")
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    fuzzed.all_up()


@given(
    kind=st.sampled_from(["garbage", "preface+garbage", "cut preface", "frames", "huge frame"]),
    blob=st.binary(max_size=512),
    replica=st.integers(0, 2),
    frame_kind=st.integers(0, 255),
    flags=st.integers(0, 255),
    stream=st.integers(0, 2**31 - 1),
)
@settings(max_examples=examples(60), **FUZZ_SETTINGS)
def test_fuzz_garbage_on_the_raw_port(
    fuzzed: Fuzzed, kind: str, blob: bytes, replica: int, frame_kind: int, flags: int, stream: int
) -> None:
    address = fuzzed.cluster.endpoints[replica]
    if kind == "garbage":
        chunks = [blob]
    elif kind == "preface+garbage":
        chunks = [PREFACE, blob]
    elif kind == "cut preface":
        chunks = [PREFACE[: len(blob) % len(PREFACE)]]
    elif kind == "frames":
        chunks = [PREFACE, EMPTY_SETTINGS, frame(frame_kind, flags, stream, blob)]
    else:  # a frame header announcing 16 MiB, then too little and a close
        chunks = [PREFACE, EMPTY_SETTINGS, frame(frame_kind, flags, stream, blob, 0xFFFFFF)]
    send_raw(address, chunks)
    tally(f"raw port: {kind}")


def test_replicas_up_after_raw_garbage(fuzzed: Fuzzed) -> None:
    fuzzed.all_up()
    with Client(fuzzed.cluster.endpoints) as client:
        assert client.append([b"after-garbage"])


def test_2000_idle_connections(fuzzed: Fuzzed) -> None:
    """2,000 idle HTTP/2 connections to one replica (the leader): it keeps serving, and its
    memory grows by a bounded amount per connection."""
    cluster = fuzzed.cluster
    leader = cluster.wait_for_leader()
    host, _, port = cluster.endpoints[leader].rpartition(":")
    before = rss_bytes(cluster.pid(leader) or 0)
    sockets: list[socket.socket] = []
    try:
        for _ in range(IDLE_CONNECTIONS):
            sock = socket.create_connection((host, int(port)), timeout=5)
            sock.sendall(PREFACE + EMPTY_SETTINGS)
            sockets.append(sock)
        time.sleep(1.0)
        with Client(cluster.endpoints) as client:
            positions = client.append([b"with-2000-idle"])
            assert positions
            got = [e.value for e in client.read(positions[0], positions[0])]
            assert got == [b"with-2000-idle"]
        during = rss_bytes(cluster.pid(leader) or 0)
        fuzzed.rss[f"leader with {IDLE_CONNECTIONS} idle connections"] = [before, during]
        tally(f"idle connections opened: {len(sockets)}")
        # Bounded: well under 100 KiB per idle connection (measured: docs/faults.md).
        assert during - before < IDLE_CONNECTIONS * 100 * 1024, (before, during)
    finally:
        for sock in sockets:
            sock.close()
    fuzzed.all_up()


def test_tail_readers_that_never_read_and_the_tail_limit(fuzzed: Fuzzed) -> None:
    """MAX_TAILS Tail calls on one replica that never read while 32 MiB are appended: the
    replica's memory stays bounded (each call holds at most one response and its window);
    one more Tail is refused with RESOURCE_EXHAUSTED."""
    cluster = fuzzed.cluster
    target = 0
    channel = grpc.insecure_channel(cluster.endpoints[target], options=CLIENT_CHANNEL_OPTIONS)
    tail = channel.unary_stream("/rlog.v1.Log/Tail")
    request = pb.TailRequest(**{"from": 1}, stale=True).SerializeToString()
    before = rss_bytes(cluster.pid(target) or 0)
    calls = [tail(request) for _ in range(MAX_TAILS)]
    try:
        time.sleep(1.0)
        extra = tail(request, timeout=5)
        with pytest.raises(grpc.RpcError) as refused:
            next(extra)
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
        assert "--max-tail-readers" in (refused.value.details() or "")  # type: ignore[attr-defined]
        tally("Tail over --max-tail-readers -> RESOURCE_EXHAUSTED")
        with Client(cluster.endpoints) as client:
            for i in range(32):
                values = [bytes([i]) * (256 << 10) for _ in range(4)]
                for position, value in zip(client.append(values), values, strict=True):
                    fuzzed.acknowledged[position] = value
        time.sleep(1.0)
        during = rss_bytes(cluster.pid(target) or 0)
        fuzzed.rss[f"replica with {MAX_TAILS} unread tails, 32 MiB appended"] = [before, during]
        # Unbounded buffering would hold 64 x 32 MiB = 2 GiB; bounded is a small multiple of
        # the windows (measured: docs/faults.md).
        assert during - before < 256 << 20, (before, during)
        tally(f"unread Tail calls: {MAX_TAILS}")
    finally:
        for c in calls:
            c.cancel()
        channel.close()
    fuzzed.all_up()


def test_no_acknowledged_entry_lost_after_the_client_fuzz(fuzzed: Fuzzed) -> None:
    fuzzed.all_up()
    fuzzed.record_rss("after client fuzz")
    check(fuzzed.cluster, fuzzed.acknowledged)


PEER_RPCS = ["Promise", "Write", "WriteStream", "Learned", "Recover", "Fetch"]


@given(data=st.data())
@settings(max_examples=examples(60), **FUZZ_SETTINGS)
def test_fuzz_the_peer_rpcs_liveness_only(fuzzed: Fuzzed, data: st.DataObject) -> None:
    from fuzzlib import call

    name = data.draw(st.sampled_from(PEER_RPCS), label="rpc")
    m = method("Replica", name)
    count = data.draw(st.integers(1, 3)) if m.client_streaming else 1
    made = [data.draw(payload(m.input_type), label="request") for _ in range(count)]
    replica = data.draw(st.integers(0, 2), label="replica")
    # Mostly the log's own id: a message of another log is refused before any rule sees it.
    own = data.draw(st.integers(0, 3), label="own log id") > 0
    log_id = fuzzed.cluster.log_id if own else None
    payloads = [plausible(raw, m.input_type, log_id) for _, raw in made]
    code, details = call(fuzzed.channels[replica], m, payloads, 1.0)
    tally(f"Replica.{name} {made[0][0]} -> {code.name}")
    assert clear(code, details), f"Replica.{name}: {code.name} {details!r}"


def test_replicas_up_at_the_end(fuzzed: Fuzzed) -> None:
    fuzzed.all_up()
    fuzzed.record_rss("end")
    for i in range(3):
        assert fuzzed.cluster.status(i, timeout=5).id == i
