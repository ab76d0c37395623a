"""Who gets the initialization permit, and when: a pure decision over `facts.Facts`.

A replica turns an all-EMPTY log into a new, empty log (EMPTY -> STARTING -> VOTING) only
while it holds an initialization permit. Granting one to a replica of a log that holds data
could start a second, empty history, so the operator grants permits only when a new log is
wanted:

* The log was never initialized (no replica has ever been VOTING; status.initialized is
  sticky) and either spec.autoInitialize is true, or the user set the annotation
  `rlog.io/initialize=<metadata.uid>` on the ReplicatedLog. The value must be the CR's own
  uid, so an annotation copied along with a manifest never initializes another log.
* A total data loss is suspected (an initialized log whose every replica answers EMPTY: the
  DataLoss hold) and the user acknowledged it with `rlog.io/reinitialize=<metadata.uid>`.
  Without that acknowledgement nothing is granted, not even to a STARTING replica. The
  status module removes the annotation once the log serves again, so each loss needs its
  own acknowledgement.

While the log may be initialized, every answering EMPTY or STARTING replica should hold the
permit. One exception to "initialized means no permit": a replica found STARTING in an
initialized log (no data loss) keeps, or gets, its permit. STARTING means it passed phase one
of an initialization that other replicas completed; revoking would leave it STARTING forever
(STARTING -> VOTING needs the permit, and a minority of VOTING replicas cannot recover it).
A permit never turns an EMPTY replica into anything in an initialized log: an EMPTY replica
of a serving log recovers from the VOTING replicas instead. Every other holder loses its
permit.

While a spec.replicas change is refused (facts.refused), grants are withheld: the pods the
operator sees may not be the log the user now describes. Revocations still go out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import NamedTuple

from rlog_operator import constants as c
from rlog_operator.facts import Facts
from rlog_operator.observed import status_name


class Policy(NamedTuple):
    """Whether the log may be (re)initialized now, and why (or why not)."""

    allowed: bool
    reason: str


def may_initialize(
    *,
    initialized: bool,
    data_loss: bool,
    auto_initialize: bool,
    annotations: Mapping[str, str],
    uid: str,
) -> Policy:
    """Whether the log may be (re)initialized now, and why (or why not)."""
    if data_loss:
        if uid and annotations.get(c.ANNOTATION_REINITIALIZE) == uid:
            return Policy(True, f"re-initialization acknowledged by {c.ANNOTATION_REINITIALIZE}")
        return Policy(
            False,
            "every replica is EMPTY in a log that was initialized: suspected data loss; "
            f"set the annotation {c.ANNOTATION_REINITIALIZE}={uid} to start an empty log",
        )
    if initialized:
        return Policy(False, "the log is initialized")
    if auto_initialize:
        return Policy(True, "a new log (spec.autoInitialize)")
    if uid and annotations.get(c.ANNOTATION_INITIALIZE) == uid:
        return Policy(True, f"a new log (annotation {c.ANNOTATION_INITIALIZE})")
    return Policy(
        False,
        f"spec.autoInitialize is false: set the annotation {c.ANNOTATION_INITIALIZE}={uid} "
        "to initialize the log",
    )


def policy(facts: Facts) -> Policy:
    """`may_initialize` for one observation."""
    return may_initialize(
        initialized=facts.initialized,
        data_loss=facts.data_loss,
        auto_initialize=facts.auto_initialize,
        annotations=facts.annotations,
        uid=facts.uid,
    )


def should_hold(facts: Facts, allowed: bool, state: str) -> bool:
    """Whether an answering replica in `state` should hold the permit."""
    finishing = facts.initialized and not facts.data_loss and state == c.STARTING
    return (allowed and state in (c.EMPTY, c.STARTING)) or finishing


@dataclass(frozen=True)
class PermitDecision:
    """To whom the operator grants the permit now and from whom it revokes it."""

    allowed: bool  # the log may be initialized (or re-initialized) now
    policy: str  # why it may, or may not
    grant: tuple[str, ...] = ()  # pod names to grant the permit to
    revoke: tuple[str, ...] = ()  # pod names to revoke it from
    withheld: tuple[str, ...] = ()  # would be granted, but a replicas change is refused
    refusal: str = ""  # that refusal
    holding: tuple[str, ...] = ()  # should hold the permit and do
    answering: int = 0  # replicas that answered

    def reason(self) -> str:
        """Why nobody is granted or revoked a permit now; "" when somebody is."""
        if self.grant or self.revoke:
            return ""
        if self.withheld:
            return f"not granting {', '.join(self.withheld)}: {self.refusal}"
        if self.holding:
            return f"{', '.join(self.holding)} already hold the permit"
        if not self.allowed:
            return self.policy
        if not self.answering:
            return "no replica answers"
        return "no answering replica is EMPTY or STARTING"


def decide(facts: Facts) -> PermitDecision:
    """The grants and revocations of one observation (see the module docs for the rules)."""
    allowed, why = policy(facts)
    grant: list[str] = []
    revoke: list[str] = []
    holding: list[str] = []
    for name, replica in sorted(facts.replicas.items()):
        if replica is None:
            continue  # an unreachable replica can be neither granted nor revoked
        should = should_hold(facts, allowed, status_name(replica))
        holds = bool(replica.get("permit"))
        if should and not holds:
            grant.append(name)
        elif holds and not should:
            revoke.append(name)
        elif should:
            holding.append(name)
    withheld: tuple[str, ...] = ()
    if facts.refused:
        withheld, grant = tuple(grant), []
    return PermitDecision(
        allowed=allowed,
        policy=why,
        grant=tuple(grant),
        revoke=tuple(revoke),
        withheld=withheld,
        refusal=facts.refused if withheld else "",
        holding=tuple(holding),
        answering=len(facts.reached),
    )
