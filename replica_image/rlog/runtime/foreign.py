"""Peer messages of another log, refused where they arrive (protocol/log_identity.py has the
contract): counted (`rlog_foreign_messages_total`), logged, answered FAILED_PRECONDITION
with reason LOG_ID_MISMATCH, and never handed to a rule.

`ForeignMessages.deserializer` wraps the request deserializers of the peer protocol's gRPC
service (runtime/server.py registers them through it), so the check is made once per
message, each request of a `WriteStream` included, before any handler runs
(runtime/faults.py ends the call with `Refused`'s error). The lane (lane/server.py) checks
its hello and its frames with the same rule and reports here through `seen`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from rlog.protocol.log_identity import refusal
from rlog.runtime.errors import RpcError
from rlog.runtime.faults import Refused
from rlog.runtime.metrics import ReplicaMetrics
from rlog.wire import Reason

log = logging.getLogger("rlog.server")

LOG_EVERY = 60.0  # seconds between the log lines about one RPC from one foreign log


class ForeignMessages:
    """The log id check of one replica (log `own`), with its metric and its log lines."""

    def __init__(self, own: str, metrics: ReplicaMetrics) -> None:
        self.own = own
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

    def deserializer(self, rpc: str, parse: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
        """`parse` (a tolerant deserializer of a peer request) followed by the check: a
        message of another log comes out `Refused`."""
        own = self.own

        def deserialize(raw: bytes) -> Any:
            request = parse(raw)
            sent = getattr(request, "log_id", None)
            if sent == own:  # this log's message: the one comparison every message pays
                return request
            if not isinstance(sent, str):
                return request  # Malformed: answered INVALID_ARGUMENT
            error = self.check(rpc, sent)
            return request if error is None else Refused(error)

        return deserialize
