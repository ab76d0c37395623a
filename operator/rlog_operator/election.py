"""Which operator replica acts: a Kubernetes Lease, decided by a pure function.

The chart runs two operator pods. Each stands by until it holds the Lease
(coordination.k8s.io/v1, in the operator's namespace); only the holder runs kopf (the
handlers, the timers, the rolling actions). The holder renews the Lease every
`RENEW_EVERY` seconds and exits if it could not renew for `RENEW_DEADLINE` seconds; a
standby takes the Lease over once it has seen no renewal for `LEASE_SECONDS` by its own
clock (the API server's timestamps are never compared with the local clock, so clock skew
between nodes does not matter). RENEW_DEADLINE < LEASE_SECONDS: a holder that cannot renew
has stopped acting before anyone else may start. A holder that stops cleanly (SIGTERM)
releases the Lease, and a standby takes over at its next poll.

Every write is a create or a replace carrying the resourceVersion read: of two standbys
taking over at once, one gets a conflict (409) and goes on standing by. The operator's own
work is resumable from the ReplicatedLogs' status (the rolling queue, the sticky
`initialized`), so a successor neither repeats nor skips a step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

LEASE_SECONDS = 15
RENEW_EVERY = 2.0
RENEW_DEADLINE = 10.0
POLL_EVERY = 2.0  # a standby's look at the Lease

Decision = Literal["create", "renew", "take", "wait"]


@dataclass(frozen=True)
class LeaseRecord:
    """What a standby or holder reads of the Lease."""

    holder: str  # spec.holderIdentity ("" when unset: released)
    duration: float  # spec.leaseDurationSeconds
    renewed: str  # spec.renewTime as the API server returns it: a version, never compared
    transitions: int  # spec.leaseTransitions
    version: str  # metadata.resourceVersion: the precondition of the next write


@dataclass(frozen=True)
class Sighting:
    """When (local monotonic seconds) this replica first saw the Lease as it is now."""

    holder: str
    renewed: str
    since: float


def seen(previous: Sighting | None, record: LeaseRecord, now: float) -> Sighting:
    """The sighting after reading `record` at `now`: unchanged holder and renewTime keep the
    first time they were seen; any change restarts the count."""
    if previous is not None and (previous.holder, previous.renewed) == (
        record.holder,
        record.renewed,
    ):
        return previous
    return Sighting(record.holder, record.renewed, now)


def decide(me: str, record: LeaseRecord | None, sighting: Sighting | None, now: float) -> Decision:
    """What replica `me` does with the Lease it just read (None: there is none)."""
    if record is None:
        return "create"
    if record.holder == me:
        return "renew"
    if not record.holder:
        return "take"  # released by a holder that stopped cleanly
    if sighting is not None and now - sighting.since >= record.duration:
        return "take"  # no renewal seen for a whole lease duration
    return "wait"


def lease_spec(me: str, record: LeaseRecord | None, now_rfc3339: str) -> dict[str, object]:
    """The Lease spec `me` writes to hold it (creating, renewing or taking it over)."""
    holding = record is not None and record.holder == me
    transitions = record.transitions if record is not None else 0
    spec: dict[str, object] = {
        "holderIdentity": me,
        "leaseDurationSeconds": LEASE_SECONDS,
        "renewTime": now_rfc3339,
        "leaseTransitions": transitions if holding or record is None else transitions + 1,
    }
    if not holding:
        spec["acquireTime"] = now_rfc3339
    return spec


def released_spec(record: LeaseRecord) -> dict[str, object]:
    """The spec a holder writes when it stops cleanly: nobody holds it (no holderIdentity)."""
    return {
        "leaseDurationSeconds": LEASE_SECONDS,
        "leaseTransitions": record.transitions,
    }
