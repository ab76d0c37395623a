"""How an append travels: two small pure choices, each with the reason it was made.

- Once per append, its `Route` (`choose_route`): in a group with other callers' appends
  (one session sequence for all), alone in a session sequence of its own, or once with no
  session at all. Which one follows from the client's `exactly_once` setting and the
  append's conditions.
- Once per try of it (a re-send after an unknown outcome is a new try), its `Carrier`
  (`choose_carrier`): the endpoint's `AppendStream`, the replica's append lane, or a unary
  `Append` call. A try chooses afresh because a lane opens in the background and may open,
  or break, between two tries of one append.

The client gathers the facts (`AppendFacts`, `CarrierFacts`) and does what the choice says;
nothing here does I/O.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Route(enum.Enum):
    # Exactly-once, coalesced with the appends of other callers waiting to be sent into a
    # group that takes one (session, sequence) (grouping.AppendGroups).
    GROUP = "group"
    # Exactly-once, alone in a (session, sequence) of its own (sessions.ExactlyOnce).
    SESSION = "session"
    # At most once: no session; never re-sent once it may have reached a server, and an
    # unknown outcome raises `OutcomeUnknown`.
    ONCE = "once"


@dataclass(frozen=True, slots=True)
class AppendFacts:
    """What decides an append's route."""

    exactly_once: bool  # the client's setting (`exactly_once=`)
    if_next: bool  # the append has an `if_next` condition
    epoch: bool  # the append has an `epoch` condition
    session_open: bool  # the client's session is open now


@dataclass(frozen=True, slots=True)
class RouteChoice:
    route: Route
    why: str
    # SESSION: the append may open a session, or renew an aging one (not under `if_next`)
    renew: bool = True


def choose_route(facts: AppendFacts) -> RouteChoice:
    if not facts.exactly_once:
        return RouteChoice(Route.ONCE, "the client was made with exactly_once=False")
    if facts.if_next and not facts.session_open:
        # Opening a session appends a SESSION entry, which would move the next position
        # under the `if_next`.
        return RouteChoice(
            Route.ONCE,
            "an if_next append uses a session only if one is open: opening one now would "
            "move the next position it is conditioned on",
        )
    if facts.if_next or facts.epoch:
        return RouteChoice(
            Route.SESSION,
            "its conditions are its own: alone in a sequence, not in a group"
            + (" (and, under if_next, in the session as it is)" if facts.if_next else ""),
            renew=not facts.if_next,
        )
    return RouteChoice(
        Route.GROUP,
        "exactly-once with no conditions: in a group with the appends waiting beside it, "
        "one request and one sequence for all (not a sequence of its own each)",
    )


class Carrier(enum.Enum):
    # The endpoint's `AppendStream` (append_stream.AppendStreams), shared with the client's
    # other appends in flight.
    STREAM = "stream"
    # The current replica's append lane. A replica that answers that it changed nothing in
    # a way another replica may not (not the leader, no quorum) declines the try, which then
    # goes round the endpoints as UNARY.
    LANE = "lane"
    # One `Append` call, moving to the next endpoint where that is safe (endpoints.Endpoints).
    UNARY = "unary"


@dataclass(frozen=True, slots=True)
class CarrierFacts:
    """What decides a try's carrier."""

    stream: bool  # the client was made with `stream=True`
    lane: bool  # the client appends on lanes (`lane_wanted`; never with `stream=True`)
    lane_open: bool  # the current endpoint's lane is open now (False without `lane`)


@dataclass(frozen=True, slots=True)
class CarrierChoice:
    carrier: Carrier
    why: str


def lane_wanted(lane: bool | None, stream: bool, token: bool) -> bool:
    """Whether a client appends on the append lane (`lane` as given to the client; `token`:
    it authenticates by bearer token). On by default, because it is the same append without
    gRPC's cost per call (a serial append's p50 1.67x etcd's put on gRPC, 1.08x on the lane:
    docs/performance.md) and it falls back to gRPC by itself; where it cannot apply (a stream
    already multiplexes its appends on one call; the lane knows callers by certificate, not
    by token) the default is off and asking for it is an error. Rejected: off unless asked
    for, the choice until December 2026, which kept the fast path from every user who had
    not read the data-path notes."""
    if lane is None:
        return not stream and not token
    if lane and stream:
        raise ValueError("an append lane replaces the unary calls: give lane or stream")
    if lane and token:
        raise ValueError(
            "the append lane authenticates by client certificate: a client with a "
            "bearer token appends on gRPC (lane=False)"
        )
    return lane


def choose_carrier(facts: CarrierFacts) -> CarrierChoice:
    if facts.stream:
        return CarrierChoice(
            Carrier.STREAM,
            "the client was made with stream=True: every append on the endpoint's "
            "AppendStream (a lane is refused beside a stream, and a unary call would leave "
            "the stream)",
        )
    if facts.lane and facts.lane_open:
        return CarrierChoice(
            Carrier.LANE,
            "the current replica's lane is open: a frame on it, without the cost of a unary "
            "gRPC call",
        )
    if facts.lane:
        return CarrierChoice(
            Carrier.UNARY,
            "the current replica's lane is not open (still opening in the background, down, "
            "or not served): a unary call meanwhile",
        )
    return CarrierChoice(
        Carrier.UNARY,
        "the client appends on neither a stream nor a lane (lane=False, or a bearer "
        "token): a unary call",
    )


__all__ = [
    "AppendFacts",
    "Carrier",
    "CarrierChoice",
    "CarrierFacts",
    "Route",
    "RouteChoice",
    "choose_carrier",
    "choose_route",
    "lane_wanted",
]
