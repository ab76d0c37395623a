"""The write lane's framing and settings (rlog.lane): frames come out whole however
the bytes are cut, an oversized frame is refused, and the lane is refused where it cannot
be safe (TLS, authorization) or cannot exist (a port past 65535, lanes on other replicas'
ports)."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from rlog.client.errors import RlogError
from rlog.config import ConfigError, ReplicaConfig
from rlog.lane.framed import FrameBuffer, FramedCaller, FrameError, frame, lane_address
from rlog.lane.write import WriteLane
from rlog.proto import rlog_pb2 as pb
from rlog.runtime.write_stream import StreamBroken
from rlog.tools.dev import DevCluster


def messages() -> list[bytes]:
    rng = random.Random(7)
    sizes = [0, 1, 3, 4, 5, 17, 1024, 65536, 300_000, 0, 2]
    return [rng.randbytes(n) for n in sizes]


def receive(frames: FrameBuffer, stream: bytes, reads: list[int]) -> list[bytes]:
    """What the event loop does for a BufferedProtocol: each read fills at most the view
    `buffer()` offers (and at most the next size of `reads`, cycled)."""
    out: list[bytes] = []
    at, turn = 0, 0
    while at < len(stream):
        view = frames.buffer()
        assert len(view) > 0
        n = min(len(view), reads[turn % len(reads)], len(stream) - at)
        view[:n] = stream[at : at + n]
        at, turn = at + n, turn + 1
        out += [bytes(got) for got in frames.received(n)]
    return out


def test_buffered_frames_come_out_whole_however_the_stream_is_cut():
    stream = b"".join(frame(m) for m in messages())
    for cut in [1, 2, 3, 5, 4096, 65537, len(stream)]:
        assert receive(FrameBuffer(1 << 20), stream, [cut]) == messages(), f"reads of {cut}"


def test_buffered_frames_come_out_whole_at_random_cuts():
    stream = b"".join(frame(m) for m in messages()) * 3
    rng = random.Random(13)
    for _ in range(50):
        reads = [rng.choice([1, 2, 7, 100, 5000, 70000, 1 << 20]) for _ in range(20)]
        assert receive(FrameBuffer(1 << 20), stream, reads) == messages() * 3


def test_a_large_frame_is_read_into_place_and_handed_out_there():
    data = os.urandom(3_000_000)
    frames = FrameBuffer(len(data))
    head = frames.buffer()
    head[:4] = frame(data)[:4]
    assert list(frames.received(4)) == []
    # The length is known: the next read is offered room for the whole frame, in the
    # buffer the frame is handed out from (no join, no move).
    view = frames.buffer()
    assert len(view) >= len(data)
    view[: len(data)] = data
    (got,) = frames.received(len(data))
    assert got.obj is view.obj and got == data


def test_a_large_frame_drained_lets_its_buffer_go_before_the_next_read():
    # A connection held back after its frame (its append waits for the budget) is not read
    # again for a while: the buffer grown for that frame must not wait for the next read.
    data = os.urandom(FrameBuffer.KEEP + 1)
    frames = FrameBuffer(len(data))
    assert receive(frames, frame(data), [len(data) + 4]) == [data]
    assert frames.held == FrameBuffer.ROOM
    # a frame within KEEP keeps its buffer for the next ones
    small = os.urandom(FrameBuffer.KEEP // 2)
    assert receive(frames, frame(small), [len(small) + 4]) == [small]
    assert FrameBuffer.KEEP // 2 < frames.held <= FrameBuffer.KEEP


def test_a_frame_that_begins_late_in_the_buffer_is_moved_once():
    first, second = os.urandom(40_000), os.urandom(200_000)
    stream = frame(first) + frame(second)
    frames = FrameBuffer(1 << 20)
    # one read: the first frame and the start of the second
    view = frames.buffer()
    n = len(view)
    view[:n] = stream[:n]
    assert [bytes(f) for f in frames.received(n)] == [first]
    rest = stream[n:]
    assert receive(frames, rest, [len(rest)]) == [second]


def test_a_buffered_frame_over_the_limit_is_refused_before_it_is_read():
    frames = FrameBuffer(100)
    assert receive(frames, frame(b"x" * 100), [1000]) == [b"x" * 100]
    with pytest.raises(FrameError, match="101 bytes is over the limit of 100"):
        receive(frames, frame(b"x" * 101)[:4], [1000])


def test_a_new_limit_counts_for_the_next_frame_in_the_same_read():
    # A hello (small) and a write (large) in one read: the limit is raised after the hello.
    big = os.urandom(10_000)
    stream = frame(b"hello") + frame(big)
    frames = FrameBuffer(4096)
    out = []
    view = frames.buffer()
    view[: len(stream)] = stream
    for got in frames.received(len(stream)):
        out.append(bytes(got))
        frames.max_frame = 1 << 20
    assert out == [b"hello", big]


def test_frames_below_keep_reuse_one_buffer():
    # Growing by doubling must stop at KEEP: a buffer grown past it would be let go at the
    # next drain and grown again for every frame (a new zeroed buffer each time).
    frames = FrameBuffer(FrameBuffer.KEEP)
    buffers, last = 0, None
    for share in (0.6, 0.7) * 10:  # each frame sent alone: its last read drains the buffer
        data = bytes(int(FrameBuffer.KEEP * share))
        if frames.buffer().obj is not last:
            buffers, last = buffers + 1, frames.buffer().obj
        assert receive(frames, frame(data), [262144]) == [data]
    assert buffers <= 3  # ROOM, then grown, then doubled up to KEEP


def test_a_buffer_grown_past_keep_is_let_go_once_drained():
    data = os.urandom(FrameBuffer.KEEP + 1)
    frames = FrameBuffer(len(data))
    assert receive(frames, frame(data), [1 << 30]) == [data]
    assert len(frames.buffer()) == FrameBuffer.ROOM


def test_lane_address_is_the_port_plus_the_offset():
    assert lane_address("10.0.0.5:7000", 1) == ("10.0.0.5", 7001)
    assert lane_address("[::1]:7000", 100) == ("::1", 7100)
    assert lane_address("rlog-0.rlog.ns.svc:7000", 5) == ("rlog-0.rlog.ns.svc", 7005)


def config(tmp_path, **kwargs) -> ReplicaConfig:  # type: ignore[no-untyped-def]
    peers = kwargs.pop("peers", ["127.0.0.1:7000", "127.0.0.1:7010", "127.0.0.1:7020"])
    return ReplicaConfig(id=0, peers=peers, data_dir=tmp_path, **kwargs)


def test_the_lane_needs_mutual_tls_when_the_replica_has_tls(tmp_path):
    for name in ("cert.pem", "key.pem", "ca.pem", "roles.json"):
        (tmp_path / name).write_text("x")
    tls = {"tls_cert": tmp_path / "cert.pem", "tls_key": tmp_path / "key.pem"}
    with pytest.raises(ConfigError, match="needs mutual TLS \\(--tls-client-ca\\)"):
        config(tmp_path, write_lane_offset=1, **tls)
    assert config(tmp_path, write_lane_offset=1, tls_client_ca=tmp_path / "ca.pem", **tls)
    assert config(tmp_path, write_lane_offset=1, auth_config=tmp_path / "roles.json")
    assert config(tmp_path, write_lane_offset=1).write_lane_offset == 1
    assert config(tmp_path, **tls)  # no lane: TLS alone as before


def test_the_lane_port_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="port 65536, out of range"):
        config(tmp_path, write_lane_offset=1, peers=["127.0.0.1:7000", "127.0.0.1:65535", "h:1"])
    with pytest.raises(ConfigError, match="0 \\(off\\) or positive"):
        config(tmp_path, write_lane_offset=-1)


def test_dev_cluster_lanes_never_take_another_replicas_port(tmp_path):
    with pytest.raises(RlogError, match="in use or taken by another replica"):
        DevCluster(3, tmp_path / "a", base_port=21000, write_lane_offset=1).prepare()
    cluster = DevCluster(3, tmp_path / "b", write_lane_offset=1)
    cluster.prepare()
    ports = [int(a.rpartition(":")[2]) for a in cluster.addresses]
    lanes = [p + 1 for p in ports]
    assert len(set(ports + lanes)) == 6
    assert all("--write-lane-offset" in cluster.command(i) for i in range(3))


def test_a_peer_that_stops_reading_costs_the_leader_a_bounded_buffer():
    """A real loopback peer that welcomes the lane, then reads nothing: past `max_unsent`
    bytes the lane is dropped, its writes fail as a broken lane, and it is opened again."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        transports: list[asyncio.Transport] = []

        class Sleeper(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                self.transport = transport
                self.welcomed = False
                transports.append(transport)  # type: ignore[arg-type]

            def data_received(self, data: bytes) -> None:
                if not self.welcomed:
                    self.welcomed = True
                    self.transport.write(frame(b""))  # an empty LaneWelcome: welcome
                    self.transport.pause_reading()  # type: ignore[attr-defined]

        server = await loop.create_server(Sleeper, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        opened = []
        lane = WriteLane("127.0.0.1", port, "log", 1, 5.0, lambda: opened.append(1), 8 << 20)
        assert not lane.usable()  # opening in the background
        for _ in range(100):
            if lane.usable():
                break
            await asyncio.sleep(0.02)
        assert lane.usable() and opened == [1]
        write = pb.WriteRequest(proposal=1, runs=[pb.Run(first=1, data=b"x" * (1 << 20))])
        encoded = write.SerializeToString()
        futures = []
        while lane.usable():
            futures.append(lane.start(encoded, 60.0))
            await asyncio.sleep(0)  # let the loop push what the kernel takes
            assert len(futures) < 1000, "the lane never gave up on a peer that reads nothing"
        await asyncio.sleep(0)
        assert all(f.done() for f in futures)
        errors = [f.exception() for f in futures]
        assert all(isinstance(e, StreamBroken) for e in errors)
        assert "not reading its lane" in str(errors[-1])
        # The kernel's buffers plus at most max_unsent: not every write ever made.
        assert len(futures) * len(encoded) < (8 << 20) + (64 << 20)
        # Opened again in the background on the next use.
        for _ in range(100):
            if lane.usable():
                break
            await asyncio.sleep(0.02)
        assert lane.usable() and opened == [1, 1]
        lane.close()
        for transport in transports:
            transport.close()
        server.close()

    asyncio.run(scenario())


def test_closing_a_lane_waits_for_the_opening_it_cancels():
    """A CLI that closes its client right after a request that never needed the lane (an
    entry over the limit) must not leave the lane's opening pending when its loop closes:
    asyncio printed "Task was destroyed but it is pending!" on stderr, in about 1 of 10
    such runs on a loaded host (a one-line error became three)."""

    async def scenario() -> bool:
        located = asyncio.Event()

        async def locate():  # the replica's Status call, still under way
            located.set()
            await asyncio.sleep(3600)

        caller = FramedCaller(locate, parse=bytes, connect_timeout=5.0)
        assert not caller.usable()  # starts opening in the background
        opening = caller._opening
        await located.wait()
        await caller.aclose()
        return opening is not None and opening.done()  # before the loop's own clean-up

    assert asyncio.run(scenario())
