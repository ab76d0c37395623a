"""The exactly-once client's retry rules, against the real `LogService` over a node that
answers from a script: which errors it retries (only once an outcome is unknown), which it
raises at once, and that a retry carries the same session and sequence. Then its coalescing
of concurrent appends into groups (one session sequence each), against real replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from faultproxy import FaultProxy
from log_service import serving

from rlog.client import AsyncClient, Client
from rlog.client.errors import (
    EntryTooLarge,
    OutcomeUnknown,
    OutcomeUnknownTimeout,
    SessionExpired,
    SessionExpiredOutcomeUnknown,
    Timeout,
    Unavailable,
)
from rlog.packed import count_of
from rlog.proto import rlog_pb2 as pb
from rlog.protocol.admission import Conditions
from rlog.runtime.errors import RpcError
from rlog.tools.dev import DevCluster
from rlog.wire import Reason


class _ScriptedNode:
    """Stands in for a `Node`: each append takes the next answer of `script` (an error to
    raise, or positions), and records the conditions it was sent with."""

    def __init__(self, script: list[RpcError | list[int]]) -> None:
        self.script = script
        self.sent: list[Conditions] = []
        self.sessions = 0
        self.appender = self.coordinator_driver = self.reads = self  # drivers the service calls

    async def open_session(self, forwarded: bool) -> pb.OpenSessionResponse:
        self.sessions += 1
        return pb.OpenSessionResponse(session=100 * self.sessions, window=1000)

    async def append(
        self, data: bytes, offsets: bytes, forwarded: bool, conditions: Conditions
    ) -> list[int]:
        self.sent.append(conditions)
        answer = self.script.pop(0)
        if isinstance(answer, RpcError):
            raise answer
        return answer


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, _ScriptedNode]]:
    node = _ScriptedNode([])
    async with serving(node) as address:
        yield address, node


def unknown() -> RpcError:
    return RpcError(Reason.OUTCOME_UNKNOWN, "leadership lost during the append")


async def test_an_unknown_outcome_is_retried_with_the_same_session_and_sequence(scripted):
    endpoint, node = scripted
    node.script = [unknown(), RpcError(Reason.NO_LEADER, "x"), [7]]
    async with AsyncClient(endpoint, append_timeout=30) as client:
        assert await client.append(b"v") == [7]
        assert client.retried_appends == 1
    assert [(c.session, c.sequence) for c in node.sent] == [(100, 1)] * 3


async def test_a_first_try_that_did_nothing_fails_at_once(scripted):
    endpoint, node = scripted
    node.script = [RpcError(Reason.NO_LEADER, "no leader")]
    async with AsyncClient(endpoint, append_timeout=30) as client:
        with pytest.raises(Unavailable) as error:
            await client.append(b"v")
        assert not isinstance(error.value, OutcomeUnknown)
    assert len(node.sent) == 1


async def test_an_expired_session_on_a_retry_is_an_unknown_outcome(scripted):
    endpoint, node = scripted
    expired = RpcError(Reason.SESSION_EXPIRED, "session 100 has expired")
    node.script = [unknown(), expired]
    async with AsyncClient(endpoint, append_timeout=30) as client:
        with pytest.raises(SessionExpiredOutcomeUnknown) as error:
            await client.append(b"v")
    assert isinstance(error.value, OutcomeUnknown)


async def test_an_expired_session_on_a_first_try_opens_a_new_one(scripted):
    endpoint, node = scripted
    expired = RpcError(Reason.SESSION_EXPIRED, "session 100 has expired")
    node.script = [expired, [9], expired]
    async with AsyncClient(endpoint, append_timeout=30) as client:
        assert await client.append(b"v") == [9]
        with pytest.raises(SessionExpired) as error:  # a new session, refused again: raised
            node.script = [expired, expired]
            await client.append(b"w")
        assert not isinstance(error.value, OutcomeUnknown)
    assert [c.session for c in node.sent][:2] == [100, 200]


class _GatedNode:
    """Stands in for a `Node` whose appends all wait for `gate` (a leader that cannot reach
    a quorum), then are placed one after the other."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.sent: list[tuple[int, int]] = []  # (sequence, values) of each append received
        self.next = 1
        self.appender = self.coordinator_driver = self.reads = self  # drivers the service calls

    async def open_session(self, forwarded: bool) -> pb.OpenSessionResponse:
        return pb.OpenSessionResponse(session=100, window=1000)

    async def append(
        self, data: bytes, offsets: bytes, forwarded: bool, conditions: Conditions
    ) -> list[int]:
        count = count_of(offsets)
        self.sent.append((conditions.sequence, count))
        await self.gate.wait()
        first, self.next = self.next, self.next + count
        return list(range(first, self.next))


@pytest.fixture
async def gated() -> AsyncIterator[tuple[str, _GatedNode]]:
    node = _GatedNode()
    async with serving(node) as address:
        yield address, node


async def appending(client: AsyncClient, value: bytes, seconds: float) -> asyncio.Task[list[int]]:
    """An append started now with its own deadline (the client's append timeout as it is
    when the append starts), in a task; returns once the task ran up to its first wait."""
    client.append_timeout = seconds
    task = asyncio.ensure_future(client.append(value))
    await asyncio.sleep(0)
    return task


async def test_a_caller_of_a_group_in_flight_times_out_as_unknown_and_the_group_goes_on(gated):
    endpoint, node = gated
    async with AsyncClient(endpoint) as client:
        # One group of two callers, the first with the earlier deadline (each takes the
        # append timeout as it is when its task first runs, and both run before the group
        # forms at the end of that loop turn); the group's deadline is the later one.
        client.append_timeout = 0.5
        short = asyncio.ensure_future(client.append(b"short"))
        asyncio.get_running_loop().call_soon(setattr, client, "append_timeout", 30)
        long = asyncio.ensure_future(client.append(b"long"))
        with pytest.raises(OutcomeUnknownTimeout) as error:
            await short
        assert "while its group was still being retried" in str(error.value)
        assert not long.done()
        node.gate.set()
        assert await long == [2]  # the group was placed whole: the short caller's value first
    assert node.sent == [(1, 2)]


async def test_a_caller_still_waiting_to_be_sent_times_out_with_nothing_sent(gated):
    endpoint, node = gated
    async with AsyncClient(endpoint) as client:
        in_flight = [await appending(client, b"%d" % i, 30) for i in range(4)]  # 4 groups
        for _ in range(50):  # until all four reached the node
            if len(node.sent) == 4:
                break
            await asyncio.sleep(0.01)
        queued = await appending(client, b"queued", 0.3)
        with pytest.raises(Timeout) as error:
            await queued
        assert not isinstance(error.value, OutcomeUnknown)
        assert "waiting to be sent: nothing sent" in str(error.value)
        node.gate.set()
        assert [await task for task in in_flight] == [[1], [2], [3], [4]]
    assert node.sent == [(1, 1), (2, 1), (3, 1), (4, 1)]  # the fifth never left the client


async def test_a_lone_caller_gets_its_groups_verdict_at_its_deadline(gated):
    endpoint, node = gated
    async with AsyncClient(endpoint) as client:
        task = await appending(client, b"v", 0.5)
        with pytest.raises(OutcomeUnknown) as error:
            await task
        # The group's deadline is the caller's: the group's own verdict (the call timed out
        # after it was sent), not the caller's bare timeout.
        assert "while its group was still being retried" not in str(error.value)
    assert node.sent[0] == (1, 1)


# ---- coalescing, against real replicas -----------------------------------------------------


def log_of(cluster: DevCluster) -> dict[int, bytes]:
    with Client(cluster.endpoints) as client:
        entries = list(client.read())
    values = [e.value for e in entries]
    assert len(values) == len(set(values)), "a value is in the log twice"
    return {e.position: e.value for e in entries}


@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_concurrent_appends_travel_in_groups_and_land_once(tmp_path, stream):
    """Many concurrent single-value appends through one exactly-once client are sent as far
    fewer requests (groups, one session sequence each); every value is in the log once, at
    the position its caller was given."""
    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        cluster.wait_for_leader()
        values = [f"v{i}".encode() for i in range(300)]

        async def run() -> tuple[list[list[int]], int]:
            async with AsyncClient(cluster.endpoints, stream=stream) as client:
                positions = await asyncio.gather(*(client.append(v) for v in values))
                return positions, client.append_requests

        positions, requests = asyncio.run(run())
        assert requests < len(values) // 10
        acknowledged = {p: v for (p,), v in zip(positions, values, strict=True)}
        assert log_of(cluster) == acknowledged


@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "unary"])
def test_writers_answered_together_append_again_as_one_group(tmp_path, stream):
    """64 writers, each appending one value after another through one client: the writers a
    group's answer wakes append again within one loop turn, and the next group waits for the
    end of that turn, so it carries all of them. (Formed at the first caller, it left with one
    value and the other 63 waited a round trip: 12 values per request instead of 64, and a
    third of the throughput, measured with `rlog bench --concurrency 64`.)"""
    writers, rounds = 64, 20
    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        cluster.wait_for_leader()

        async def run() -> tuple[dict[int, bytes], int]:
            acknowledged: dict[int, bytes] = {}
            async with AsyncClient(cluster.endpoints, stream=stream) as client:
                await client.append(b"session")  # the session is open before the writers

                async def writer(i: int) -> None:
                    for n in range(rounds):
                        value = f"w{i}-{n}".encode()
                        (position,) = await client.append(value)
                        acknowledged[position] = value

                before = client.append_requests
                await asyncio.gather(*(writer(i) for i in range(writers)))
                return acknowledged, client.append_requests - before

        acknowledged, requests = asyncio.run(run())
        assert len(acknowledged) == writers * rounds
        assert writers * rounds / requests >= 32, f"{requests} requests for {writers * rounds}"
        logged = log_of(cluster)
        assert {p: v for p, v in logged.items() if v != b"session"} == acknowledged


@pytest.mark.slow
def test_groups_cut_mid_flight_are_retried_whole_and_land_once(tmp_path):
    """Stream clients behind proxies that cut connections at random: a group whose request
    or answer was lost is re-sent whole with its sequence (to whichever endpoint); the log
    holds every acknowledged value once, at the acknowledged position, and nothing else."""
    with DevCluster(3, tmp_path, election_timeout=0.5) as cluster:
        cluster.wait_for_leader()
        proxies = [FaultProxy(a, 0.1, seed=i).start() for i, a in enumerate(cluster.endpoints)]
        try:
            acknowledged: dict[int, bytes] = {}
            retried = appends = requests = 0

            async def writer(i: int) -> None:
                nonlocal retried, appends, requests
                order = [p.address for p in proxies[i % 3 :] + proxies[: i % 3]]
                async with AsyncClient(order, stream=True, append_timeout=60) as client:
                    for n in range(25):
                        values = [f"w{i}-{n}-{k}".encode() for k in range(40)]
                        answers = await asyncio.gather(
                            *(client.append(v) for v in values), return_exceptions=True
                        )
                        for answer, value in zip(answers, values, strict=True):
                            if isinstance(answer, BaseException):
                                # A first try that reached no endpoint (the proxies cut all
                                # three connections) fails at once: certainly not appended,
                                # which the final comparison checks. Anything else fails.
                                if isinstance(answer, OutcomeUnknown) or not isinstance(
                                    answer, Unavailable
                                ):
                                    raise answer
                                continue
                            (position,) = answer
                            assert position not in acknowledged
                            acknowledged[position] = value
                    retried += client.retried_appends
                    appends += 25 * 40
                    requests += client.append_requests

            async def writers() -> None:
                await asyncio.gather(*(writer(i) for i in range(3)))

            asyncio.run(writers())
            assert sum(p.cuts for p in proxies) > 0
            assert retried > 0
            assert requests < appends
        finally:
            for proxy in proxies:
                proxy.stop()
        assert log_of(cluster) == acknowledged


@pytest.mark.slow
def test_a_bad_value_in_a_group_fails_only_its_own_append(tmp_path):
    """A value over the replicas' entry size limit, coalesced with good ones: the group is
    refused whole (nothing appended), its parts are re-sent alone, and only the bad one
    fails; every good value is in the log once."""
    with DevCluster(3, tmp_path, election_timeout=0.5, max_entry_size=4096) as cluster:
        cluster.wait_for_leader()
        values = [f"v{i}".encode() for i in range(40)]
        values[20] = b"x" * 8192

        async def run() -> tuple[list[list[int] | BaseException], int]:
            async with AsyncClient(cluster.endpoints, stream=True) as client:
                answers = await asyncio.gather(
                    *(client.append(v) for v in values), return_exceptions=True
                )
                return answers, client._groups.groups

        answers, groups = asyncio.run(run())
        assert isinstance(answers[20], EntryTooLarge)
        assert groups < len(values)  # the bad value travelled in a group with others
        acknowledged = {}
        for answer, value in zip(answers, values, strict=True):
            if value != values[20]:
                assert isinstance(answer, list), answer
                acknowledged[answer[0]] = value
        assert log_of(cluster) == acknowledged


async def test_appends_get_their_session_in_the_order_they_ask_across_a_renewal():
    """Four groups of appends ask for the session; the first finds it aging and opens a new
    one, the next two queue behind it, the fourth asks just after the new one is in place.
    Each takes its sequence (and sends) as soon as it has the session, so the sequences must
    follow the order of asking. The fourth used to take the new session at once, ahead of
    the third still waking from the lock: sent out of order. The server's OpenSession is
    held by a gate here, the one way to place the fourth exactly there."""
    from rlog.client.sessions import OpenSession, Session, SessionGrant

    gate = asyncio.Event()

    class Opener:  # the client's side of OpenSession: answers once the gate opens
        async def open_session(self) -> SessionGrant:
            await gate.wait()
            return SessionGrant(1_000, 100, b"secret")

    sessions = Session()
    aging = OpenSession(1, 10)
    aging.highest_position = 100
    assert aging.aging
    sessions._current = aging
    order: list[tuple[str, int, int]] = []
    tasks: list[asyncio.Task[None]] = []

    async def group(name: str) -> None:
        session = await sessions.current(Opener(), None)  # type: ignore[arg-type]
        order.append((name, session.id, session.take_sequence()))
        if name == "first":  # in the very turn the renewal finished
            tasks.append(asyncio.get_running_loop().create_task(group("fourth")))

    tasks.extend(asyncio.get_running_loop().create_task(group(n)) for n in ("first", "second"))
    await asyncio.sleep(0)
    tasks.append(asyncio.get_running_loop().create_task(group("third")))
    for _ in range(3):
        await asyncio.sleep(0)
    gate.set()
    await asyncio.gather(*tasks)  # first, second, third
    await asyncio.gather(*tasks)  # and the fourth, which the first started
    assert order == [
        ("first", 1_000, 1),
        ("second", 1_000, 2),
        ("third", 1_000, 3),
        ("fourth", 1_000, 4),
    ]


async def test_an_expired_session_is_replaced_even_while_others_wait_for_it():
    """`renew` of a session that is not aging (the server said it expired) opens a new one;
    a caller queued only because a renewal was under way keeps the current one."""
    from rlog.client.sessions import OpenSession, Session, SessionGrant

    opened: list[int] = []

    class Opener:
        async def open_session(self) -> SessionGrant:
            opened.append(len(opened))
            await asyncio.sleep(0.01)
            return SessionGrant(2_000 + len(opened), 100, b"secret")

    sessions = Session()
    expired = OpenSession(5, 100)
    sessions._current = expired
    renewed = await sessions.renew(Opener(), expired, None)  # type: ignore[arg-type]
    assert renewed is not expired and renewed.id == 2_001 and opened == [0]
    again = await sessions.current(Opener(), None)  # type: ignore[arg-type]
    assert again is renewed and opened == [0]
