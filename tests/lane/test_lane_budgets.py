"""The append lane's budgets on a real lane port in this process (rlog/lane/server.py,
rlog/lane/append.py, rlog/runtime/budgets.py): a frame's bytes are taken from the budgets
as soon as its length is read, also when the length arrives behind a frame that waits for
room (the connection is held, so its buffer never grows to an unreserved frame), and a
connection that goes away gives back everything it held.

The replica is a stand-in whose appends wait for the test's word; everything else (the
lane server, its framing, the budgets, the sockets) is the real thing."""

from __future__ import annotations

import asyncio

from rlog.lane.framed import KINDS_VERSION, LENGTH, frame
from rlog.lane.server import LaneLimits, LaneReplica, LaneServer
from rlog.packed import pack
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import Conditions
from rlog.runtime.budgets import ANSWER_COST, ReplicaBudget
from rlog.storage.base import CorruptRecord

KIB = 1024
HELD = 1536 * KIB  # the first client's append, held until the test lets it go


class Replica:
    """Appends at positions from 1; an append of `HELD` bytes or more waits for `go`."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.appended: list[int] = []  # sizes, in the order appended

    async def append(
        self, data: bytes, offsets: bytes, forwarded: bool, conditions: Conditions
    ) -> list[int]:
        if len(data) >= HELD:
            await self.go.wait()
        self.appended.append(len(data))
        return [len(self.appended)]

    def storage_fault_seen(self, exc: CorruptRecord) -> None:
        pass


def append_frame(size: int) -> bytes:
    data, offsets = pack([b"v" * size])
    return frame(pb.AppendRequest(id=size, data=data, offsets=offsets).SerializeToString())


async def welcomed(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    hello = pb.LaneHello(version=KINDS_VERSION, kind=pb.LANE_APPENDS, log_id="t")
    writer.write(frame(hello.SerializeToString()))
    (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    assert not pb.LaneWelcome.FromString(await reader.readexactly(length)).error
    return reader, writer


async def until(condition, what: str) -> None:  # type: ignore[no-untyped-def]
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_length_behind_a_waiting_frame_is_reserved_before_its_buffer_grows() -> None:
    replica = Replica()
    # Room for the held append and not for a 50 KiB one more.
    budget = ReplicaBudget(0, HELD + 2 * ANSWER_COST + 40 * KIB, 64 << 20)
    limits = LaneLimits(16, 30.0, budget)
    lane = LaneReplica(lambda r: (pb.WriteResponse(), None), lambda r: [], replica)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: LaneServer(lane, "t", 0, 8 << 20, lambda: None, lambda: None, limits),
        "127.0.0.1",
        0,
    )
    port = server.sockets[0].getsockname()[1]
    try:
        _, first = await welcomed(port)
        first.write(append_frame(HELD))
        await until(lambda: budget.budget.in_flight >= HELD, "the held append admitted")

        # A small append that must wait, and in the same read the length of a large one
        # whose body is never sent.
        _, second = await welcomed(port)
        big = 1 << 20
        second.write(append_frame(50 * KIB) + LENGTH.pack(big))
        await until(lambda: budget.budget.waiting, "the small append waiting for room")
        assert budget.budget.in_flight < HELD + big  # nothing of the large one admitted

        replica.go.set()  # the held append is answered: the small one goes, then the large
        # one's bytes are taken, before any of its body came
        await until(lambda: 50 * KIB in replica.appended, "the small append")
        await until(
            lambda: budget.budget.in_flight == big + ANSWER_COST, "the large append reserved"
        )

        for writer in (first, second):
            writer.close()
        await until(
            lambda: budget.budget.in_flight == 0 and budget.announced.in_flight == 0,
            "every byte given back",
        )
        await until(lambda: limits.open == 0, "the connections counted out")
    finally:
        server.close()
