"""Peer messages of another log, refused where they arrive (protocol/log_identity.py has the
contract): counted (`rlog_foreign_messages_total`), logged, answered FAILED_PRECONDITION
with reason LOG_ID_MISMATCH, and never handed to a rule.

`ForeignMessages.deserializer` wraps the request deserializers of the peer protocol's gRPC
service (runtime/server.py registers them through it), so the check is made once per
message, each request of a `WriteStream` included, before any handler runs
(runtime/faults.py ends the call with `Refused`'s error). The lane (lane/server.py) checks
its hello and its frames with the same rule and reports here through `seen`.

The same entry point refuses a peer request of a build older than the replica serves
(`--min-peer-protocol`, protocol/peer_version.py): counted (`rlog_old_peer_messages_total`),
logged, answered FAILED_PRECONDITION with reason PROTOCOL_TOO_OLD. With the default minimum
(every build) the check costs nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from rlog.protocol import peer_version
from rlog.protocol.log_identity import refusal
from rlog.runtime.errors import RpcError
from rlog.runtime.faults import Refused
from rlog.runtime.metrics import ReplicaMetrics
from rlog.wire import Reason

log = logging.getLogger("rlog.server")

LOG_EVERY = 60.0  # seconds between the log lines about one RPC from one foreign log


class ForeignMessages:
    """The log id check of one replica (log `own`), and the protocol version check (peers
    of version `minimum` and up are served), with their metrics and their log lines."""

    def __init__(self, own: str, metrics: ReplicaMetrics, minimum: int = 0) -> None:
        self.own = own
        self.minimum = minimum
        self._metrics = metrics
        self._logged: dict[tuple[str, str], float] = {}  # (rpc, sent log id) -> when

    def seen(self, rpc: str, sent: str, why: str) -> None:
        """Count and (at most every LOG_EVERY seconds per RPC and log) log a refusal."""
        self._metrics.foreign_messages.labels(rpc).inc()
        now = time.monotonic()
        key = (rpc, sent)
        if now - self._logged.get(key, -LOG_EVERY) >= LOG_EVERY:
            self._logged[key] = now
            log.warning(
                "%s of another log refused (LOG_ID_MISMATCH): %s; is this address named in "
                "the --peers of another log?",
                rpc,
                why,
            )

    def check(self, rpc: str, sent: str) -> RpcError | None:
        """The error to refuse a message of log id `sent` with (None: it is this log's)."""
        why = refusal(self.own, sent)
        if not why:
            return None
        self.seen(rpc, sent, why)
        return RpcError(Reason.LOG_ID_MISMATCH, f"{rpc} refused: {why}")

    def old_refusal(self, rpc: str, stated: int) -> str:
        """Why a message stating protocol version `stated` is refused ("": it is served);
        a refusal is counted and (at most every LOG_EVERY seconds per RPC) logged."""
        why = peer_version.refusal(stated, self.minimum)
        if not why:
            return ""
        self._metrics.old_peer_messages.labels(rpc).inc()
        now = time.monotonic()
        key = (rpc, f"protocol {stated}")
        if now - self._logged.get(key, -LOG_EVERY) >= LOG_EVERY:
            self._logged[key] = now
            log.warning("%s of an older build refused (PROTOCOL_TOO_OLD): %s", rpc, why)
        return why

    def too_old(self, rpc: str, stated: int) -> RpcError | None:
        """The error to refuse a message stating protocol version `stated` with (None: it is
        served)."""
        why = self.old_refusal(rpc, stated)
        return RpcError(Reason.PROTOCOL_TOO_OLD, f"{rpc} refused: {why}") if why else None

    def deserializer(self, rpc: str, parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
        """`parse` (a tolerant deserializer of a peer request) followed by the check: a
        message of another log comes out `Refused`."""
        own = self.own
        minimum = self.minimum

        def deserialize(raw: bytes) -> Any:
            request = parse(raw)
            sent = getattr(request, "log_id", None)
            if minimum and sent == own:  # a minimum set (not the default): checked here
                error = self.too_old(rpc, getattr(request, "protocol", 0))
                return request if error is None else Refused(error)
            if sent == own:  # this log's message: the one comparison every message pays
                return request
            if not isinstance(sent, str):
                return request  # Malformed: answered INVALID_ARGUMENT
            error = self.check(rpc, sent)
            return request if error is None else Refused(error)

        return deserialize
