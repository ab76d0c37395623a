"""The operator's gRPC calls to the replicas: Status on every tick, over one kept client per
replica, and the permit and step-down calls (a client each, closed after the call).

Every call presents the operator's credentials (rlog_operator.pki_secrets): on a TLS log, the
default, a call without them fails its handshake."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from rlog_operator import specs
from rlog_operator.observed import ReplicaStatus

STATUS_TIMEOUT = 2.0  # seconds per replica Status call
ACTION_TIMEOUT = 5.0  # seconds for a permit or step-down call


def endpoint(body: Mapping[str, Any], pod: str, config: specs.OperatorConfig) -> str:
    """The replica `pod`'s address through the headless Service's DNS name."""
    ordinal = specs.ordinal_of(pod)
    return f"{specs.peer_host(body, ordinal or 0, config)}:{config.grpc_port}"


# One client (one gRPC channel) per replica endpoint and credentials, kept between ticks:
# asking Status every second must not cost a DNS lookup, a new connection and a TLS
# handshake every second. A client that failed is dropped and made again on the next tick
# (the pod may have a new address); renewed credentials make a new one (the old is closed).
_STATUS_CLIENTS: dict[str, tuple[Any, Any]] = {}  # endpoint -> (credentials, client)


async def status_client(endpoint: str, credentials: Any) -> Any:
    from rlog.client import AsyncClient

    kept = _STATUS_CLIENTS.get(endpoint)
    if kept is not None and kept[0] == credentials:
        return kept[1]
    if kept is not None:
        await kept[1].close()
    # A probe reports what it sees now (the next tick asks again): no waiting for a
    # replica that cannot be connected to.
    client = AsyncClient(endpoint, timeout=STATUS_TIMEOUT, credentials=credentials, connect_wait=0)
    _STATUS_CLIENTS[endpoint] = (credentials, client)
    return client


async def replica_status(endpoint: str, credentials: Any = None) -> ReplicaStatus | None:
    from rlog.client import status_to_dict

    client = await status_client(endpoint, credentials)
    try:
        response = await asyncio.wait_for(client.status(endpoint), STATUS_TIMEOUT + 1)
        return status_to_dict(response)
    except Exception:  # unreachable, refusing, timing out: all mean "no answer"
        _STATUS_CLIENTS.pop(endpoint, None)
        await client.close()
        return None


async def ask_statuses(
    body: Mapping[str, Any], names: list[str], credentials: Any, config: specs.OperatorConfig
) -> dict[str, ReplicaStatus | None]:
    """Every replica's Status by pod name, asked concurrently (None: no answer)."""
    answers = await asyncio.gather(
        *(replica_status(endpoint(body, n, config), credentials) for n in names)
    )
    return dict(zip(names, answers, strict=True))


async def forget_status_clients(endpoints: list[str]) -> None:
    """Close the kept clients of a deleted log."""
    for endpoint in endpoints:
        kept = _STATUS_CLIENTS.pop(endpoint, None)
        if kept is not None:
            await kept[1].close()


async def replica_call(endpoint: str, what: str, log_id: str = "", credentials: Any = None) -> None:
    """`what`: "grant" or "revoke" (the initialization permit of log `log_id`), else a
    step-down."""
    from rlog.client import AsyncClient

    client = AsyncClient(endpoint, timeout=ACTION_TIMEOUT, credentials=credentials)
    try:
        if what == "grant":
            await client.grant_permit(log_id, endpoint=endpoint)
        elif what == "revoke":
            await client.revoke_permit(log_id, endpoint=endpoint)
        else:
            await client.step_down(endpoint=endpoint)
    finally:
        await client.close()
