"""The exactly-once client's retry rules, against the real `LogService` over a node that
answers from a script: which errors it retries (only once an outcome is unknown), which it
raises at once, and that a retry carries the same session and sequence."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from rlog.client import AsyncClient
from rlog.client.errors import (
    OutcomeUnknown,
    SessionExpired,
    SessionExpiredOutcomeUnknown,
    Unavailable,
)
from rlog.client.wire import Reason
from rlog.proto import rlog_pb2 as pb
from rlog.proto import rlog_pb2_grpc as pbg
from rlog.protocol.admission import Conditions
from rlog.runtime.errors import RpcError
from rlog.runtime.server import LogService


class _ScriptedNode:
    """Stands in for a `Node`: each append takes the next answer of `script` (an error to
    raise, or positions), and records the conditions it was sent with."""

    def __init__(self, script: list[RpcError | list[int]]) -> None:
        self.script = script
        self.sent: list[Conditions] = []
        self.sessions = 0

    async def open_session(self, forwarded: bool) -> pb.OpenSessionResponse:
        self.sessions += 1
        return pb.OpenSessionResponse(session=100 * self.sessions, window=1000)

    async def append(
        self, actions: list[pb.Action], forwarded: bool, conditions: Conditions
    ) -> list[int]:
        self.sent.append(conditions)
        answer = self.script.pop(0)
        if isinstance(answer, RpcError):
            raise answer
        return answer


@pytest.fixture
async def scripted() -> AsyncIterator[tuple[str, _ScriptedNode]]:
    node = _ScriptedNode([])
    server = grpc.aio.server()
    pbg.add_LogServicer_to_server(LogService(node), server)  # type: ignore[arg-type]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}", node
    finally:
        await server.stop(grace=None)


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
