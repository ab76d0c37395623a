"""Hostile input on the lane port (docs/faults.md, "Hostile input"; docs/security.md,
"Budgets"), beside the gRPC port's suite (tests/runtime/test_fuzz_rpcs.py), against 3 real
replicas: garbage bytes, garbage after a hello, frame lengths over the limit (refused
before anything that long is allocated), lengths at the limit whose bodies never come,
truncated frames, slow hellos and more connections than the cap. Throughout: the replica
stays up, every hostile connection ends with a reason in the replica's log, the replica
serves other clients, and at the end its bytes in flight are back to 0 and every
acknowledged entry is in the log.

`RLOG_FUZZ_SCALE` multiplies the examples, as for the gRPC suite.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fuzzlib import examples, raise_fd_limit, rss_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from live import check, scrape, wait_until
from raw_sockets import recv_exactly

from rlog.client import Client
from rlog.lane.framed import KINDS_VERSION, LENGTH, MAX_SMALL, frame, lane_address
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

OFFSET = 1
MIB = 1 << 20
MAX_MESSAGE = 8 * MIB
REPLICA_BUDGET = 32 * MIB
CAP = 64  # lane connections
FRAME_TIMEOUT = 1.0
FUZZ_SETTINGS = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}


class Fuzzed:
    def __init__(self, cluster: DevCluster) -> None:
        self.cluster = cluster
        self.leader = cluster.wait_for_leader()
        self.acknowledged: dict[int, bytes] = {}
        self.honest = 0

    def lane(self, i: int | None = None) -> tuple[str, int]:
        return lane_address(self.cluster.addresses[self.leader if i is None else i], OFFSET)

    def connect(self, i: int | None = None) -> socket.socket:
        return socket.create_connection(self.lane(i), timeout=10)

    def welcomed(self, kind: int = pb.LANE_APPENDS) -> socket.socket:
        sock = self.connect()
        hello = pb.LaneHello(version=KINDS_VERSION, kind=kind, log_id=self.cluster.log_id)
        sock.sendall(frame(hello.SerializeToString()))
        (length,) = LENGTH.unpack(recv_exactly(sock, LENGTH.size))
        assert not pb.LaneWelcome.FromString(recv_exactly(sock, length)).error
        return sock

    def log(self, i: int | None = None) -> str:
        return self.cluster.log_file(self.leader if i is None else i).read_text()

    def serves_others(self) -> None:
        """Another client's append is answered, on the lane and on gRPC."""
        for lane in (True, False):
            with Client(self.cluster.addresses[self.leader], timeout=30, lane=lane) as client:
                self.honest += 1
                value = b"honest-%d" % self.honest
                (position,) = client.append([value])
                self.acknowledged[position] = value

    def all_up(self) -> None:
        for i in range(3):
            assert self.cluster.running(i), f"replica {i} died:\n{self.cluster.log_tail(i)}"

    def metric(self, name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return scrape(self.cluster, self.leader).get((name, labels), 0.0)


def ends(sock: socket.socket, timeout: float = 10.0) -> bool:
    """The replica closed the connection (EOF or a reset) within `timeout`; what it sent
    before (a welcome) is read and dropped."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return False
    finally:
        sock.close()
    return True


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    raise_fd_limit(4096)
    root: Path = tmp_path_factory.mktemp("lane-fuzz")
    args = [
        "--max-message-size",
        str(MAX_MESSAGE),
        "--max-inflight-bytes",
        str(REPLICA_BUDGET),
        "--max-lane-connections",
        str(CAP),
        "--lane-frame-timeout",
        str(FRAME_TIMEOUT),
    ]
    with DevCluster(
        3,
        root,
        metrics=True,
        election_timeout=0.5,
        write_lane_offset=OFFSET,
        replica_args=args,
    ) as cluster:
        state = Fuzzed(cluster)
        state.serves_others()
        yield state


def _hostile(draw: st.DrawFn) -> bytes:
    """Garbage; or a hello (maybe damaged) and garbage frames after it."""
    shape = draw(st.sampled_from(["garbage", "hello", "hello+frames"]))
    if shape == "garbage":
        return draw(st.binary(max_size=2 * MAX_SMALL))
    hello = pb.LaneHello(
        version=draw(st.sampled_from([0, 1, 2, 3, 2**32 - 1])),
        kind=draw(st.sampled_from([pb.LANE_APPENDS, pb.LANE_FETCH, 7])),
        log_id=draw(st.sampled_from(["", "dev", "another", "\u00e9"])),
        replica_id=draw(st.integers(0, 4)),
    ).SerializeToString()
    if draw(st.booleans()):
        hello = bytes(draw(st.permutations(hello)))
    out = frame(hello)
    if shape == "hello+frames":
        for body in draw(st.lists(st.binary(max_size=512), max_size=4)):
            length = draw(st.sampled_from([len(body), len(body) + 1, 2**32 - 1, 0]))
            out += LENGTH.pack(length) + body
    return out


@settings(max_examples=examples(60), **FUZZ_SETTINGS)  # type: ignore[arg-type]
@given(data=st.data())
def test_fuzz_garbage_on_the_lane_port(fuzzed: Fuzzed, data: st.DataObject) -> None:
    sent = data.draw(st.composite(_hostile)())
    sock = fuzzed.connect(data.draw(st.integers(0, 2)))
    try:
        sock.sendall(sent)
        sock.shutdown(socket.SHUT_WR)
    except OSError:
        pass  # already closed by the replica: also an end
    assert ends(sock), f"the lane did not end the connection after {sent[:64]!r}"


def test_replicas_serve_after_the_garbage(fuzzed: Fuzzed) -> None:
    fuzzed.all_up()
    fuzzed.serves_others()


def test_lengths_over_the_limit_are_refused_before_allocating(fuzzed: Fuzzed) -> None:
    pid = fuzzed.cluster.pid(fuzzed.leader) or 0
    before = rss_bytes(pid)
    for _ in range(20):
        for length in (2**32 - 1, MAX_SMALL + 1):  # before the hello: a hello is small
            sock = fuzzed.connect()
            sock.sendall(LENGTH.pack(length))
            assert ends(sock)
        sock = fuzzed.welcomed()
        sock.sendall(LENGTH.pack(MAX_MESSAGE + 1))
        assert ends(sock)
    assert rss_bytes(pid) - before < 64 * MIB  # 40 x 4 GiB and 20 x 8 MiB asked: none taken
    log = fuzzed.log()
    assert f"is over the limit of {MAX_SMALL}" in log
    assert f"a frame of {MAX_MESSAGE + 1} bytes is over the limit of {MAX_MESSAGE}" in log
    fuzzed.serves_others()


def test_lengths_whose_bodies_never_come_hold_no_budget_for_long(fuzzed: Fuzzed) -> None:
    # Appends of the largest size announced, and no body: the first takes its bytes from
    # the replica's budget (announced bytes may hold half of it), the rest wait for them
    # before any buffer grows; each that took its bytes is closed after
    # --lane-frame-timeout, and meanwhile another client's appends go through.
    pid = fuzzed.cluster.pid(fuzzed.leader) or 0
    before = rss_bytes(pid)
    socks = [fuzzed.welcomed() for _ in range(6)]
    for sock in socks:
        sock.sendall(LENGTH.pack(MAX_MESSAGE))
    fuzzed.serves_others()
    for sock in socks:
        assert ends(sock, 60)
    assert rss_bytes(pid) - before < 2 * REPLICA_BUDGET + 32 * MIB
    assert "did not arrive whole within 1 s of its length (--lane-frame-timeout)" in fuzzed.log()
    wait_until(
        lambda: fuzzed.metric("rlog_append_inflight_bytes") == 0, 30, "the budget given back"
    )


def test_truncated_frames_append_nothing_and_give_their_bytes_back(fuzzed: Fuzzed) -> None:
    marker = b"truncated-%d" % time.time_ns()
    encoded = pb.AppendRequest(id=1, values=[marker * 1000]).SerializeToString()
    for cut in (1, 3, LENGTH.size + 1, LENGTH.size + len(encoded) // 2, len(encoded) + 3):
        sock = fuzzed.welcomed()
        sock.sendall((LENGTH.pack(len(encoded)) + encoded)[:cut])
        sock.close()
    fuzzed.serves_others()
    wait_until(
        lambda: fuzzed.metric("rlog_append_inflight_bytes") == 0, 30, "the budget given back"
    )
    with Client(fuzzed.cluster.addresses[fuzzed.leader], timeout=30) as client:
        assert not [e for e in client.read() if marker in e.value]


def test_slow_hellos_time_out(fuzzed: Fuzzed) -> None:
    refused = fuzzed.metric("rlog_lane_connections_refused_total", (("reason", "hello"),))
    silent = fuzzed.connect()
    hello = frame(
        pb.LaneHello(
            version=KINDS_VERSION, kind=pb.LANE_APPENDS, log_id=fuzzed.cluster.log_id
        ).SerializeToString()
    )
    dripping = fuzzed.connect()
    dripping.settimeout(10)
    ended = False
    for byte in hello:  # one byte a quarter second: the hello needs longer than its deadline
        try:
            dripping.sendall(bytes([byte]))
        except OSError:
            ended = True
            break
        time.sleep(0.25)
    assert ended or ends(dripping)
    assert ends(silent)
    assert "no hello within 1 s (--lane-frame-timeout)" in fuzzed.log()
    after = fuzzed.metric("rlog_lane_connections_refused_total", (("reason", "hello"),))
    assert after >= refused + 2
    fuzzed.serves_others()


def test_connections_over_the_cap_are_closed_at_once(fuzzed: Fuzzed) -> None:
    refused = fuzzed.metric("rlog_lane_connections_refused_total", (("reason", "cap"),))
    socks = [fuzzed.connect() for _ in range(CAP + 30)]
    try:
        # The replica's own lanes use some of the cap too: at least the 30 over it are gone.
        wait_until(
            lambda: (
                fuzzed.metric("rlog_lane_connections_refused_total", (("reason", "cap"),))
                >= refused + 30
            ),
            30,
            "the connections over the cap refused",
        )
        fuzzed.all_up()
    finally:
        for sock in socks:
            sock.close()
    assert f"the cap is {CAP} (--max-lane-connections)" in fuzzed.log()
    fuzzed.serves_others()


def test_no_acknowledged_entry_lost_and_nothing_left_in_flight(fuzzed: Fuzzed) -> None:
    fuzzed.all_up()
    assert fuzzed.metric("rlog_append_inflight_bytes") == 0
    check(fuzzed.cluster, fuzzed.acknowledged)
