"""`rlog replica`'s budget arguments (docs/security.md, "Budgets"): how many bytes of
clients' appends the replica holds at once, and what a lane connection may hold."""

from __future__ import annotations

import argparse

from rlog.arg_types import nonnegative, positive_float
from rlog.config import (
    DEFAULT_LANE_FRAME_TIMEOUT,
    DEFAULT_MAX_INFLIGHT_BYTES,
    DEFAULT_MAX_LANE_CONNECTIONS,
    DEFAULT_MAX_STREAM_INFLIGHT_BYTES,
)

# The `ReplicaConfig` fields these arguments set (each the argument's dest).
BUDGET_KEYS = (
    "max_stream_inflight_bytes",
    "max_inflight_bytes",
    "max_lane_connections",
    "lane_frame_timeout",
)


def add_budget_arguments(limits: argparse._ArgumentGroup) -> None:
    limits.add_argument(
        "--max-stream-inflight-bytes",
        type=nonnegative,
        default=DEFAULT_MAX_STREAM_INFLIGHT_BYTES,
        metavar="BYTES",
        help="bytes of appends in flight on one AppendStream or append-lane connection "
        "(default 64 MiB); over it the stream is not read until answers go out",
    )
    limits.add_argument(
        "--max-inflight-bytes",
        type=nonnegative,
        default=DEFAULT_MAX_INFLIGHT_BYTES,
        metavar="BYTES",
        help="bytes of appends in flight on the replica (default 512 MiB); over it streams "
        "are not read, a unary Append waits, at its deadline RESOURCE_EXHAUSTED",
    )
    limits.add_argument(
        "--max-lane-connections",
        type=nonnegative,
        default=DEFAULT_MAX_LANE_CONNECTIONS,
        metavar="N",
        help="connections open on the lane port (default 1024); more are closed at once",
    )
    limits.add_argument(
        "--lane-frame-timeout",
        type=positive_float,
        default=DEFAULT_LANE_FRAME_TIMEOUT,
        metavar="SECONDS",
        help="a lane connection without its hello after this long, or a client's append "
        "not whole this long after its length, is closed (default 10)",
    )
