"""Disk trouble of a ReplicatedLog's replicas, as the operator reports it (pure functions of
`facts.Facts`, no I/O; docs/operator.md, "Storage trouble").

Each replica's `facts.ReplicaHealth` says what it last reported of its storage (its
`storage_condition`, `storage_fault` and `corrupt_records`), whether its pod's restore init
container failed, and how its container last ended while it crash-loops. From these:

* `degraded` is the StorageDegraded condition: True while some replica has a storage
  condition or a failed restore, with the most severe kind as its reason and every such
  replica in its message;
* `changes` are the Events of what changed since the previous status: a Warning when a
  replica's storage condition turns into one of the kinds below (one per change, not per
  observation), a Normal StorageHealthy when it clears, CorruptRecordRepaired when its
  corrupt-record count rises, ReplicaCrashLooping when its container starts crash-looping.
"""

from __future__ import annotations

from typing import NamedTuple

from rlog_operator.facts import RESTORE_FAILED, STORAGE_FAULT, Facts, ReplicaHealth


class Kind(NamedTuple):
    reason: str  # the condition's and the Event's CamelCase reason
    meaning: str  # what it says of the replica, after its name


# the storage kinds, most severe first (the condition's reason is the first one present)
KINDS: dict[str, Kind] = {
    "refusing": Kind(
        "StorageRefused",
        "refuses to vote on its storage (damaged with no quorum to vouch for it, or the data "
        "dir of another log or replica)",
    ),
    RESTORE_FAILED: Kind("RestoreFailed", "could not be restored from the archive"),
    "disk-failing": Kind("DiskFailing", "fails to write its disk (EIO/EROFS): it left the quorum"),
    "storage-lost": Kind(
        "StorageLost",
        "found its storage lost or damaged: it set the files aside, rejoined EMPTY and "
        "recovers from its peers",
    ),
    "disk-full": Kind("DiskFull", "is out of disk space: appends are refused"),
    "corrupt-repaired": Kind(
        "CorruptRecordRepaired", "found a corrupt record: dropped and repaired from its peers"
    ),
    STORAGE_FAULT: Kind("StorageFault", "reports a storage fault"),
}
HEALTHY = "AllHealthy"


class Change(NamedTuple):
    """An Event to post: type (Normal or Warning), reason, message."""

    type: str
    reason: str
    message: str


def kind(storage: str) -> Kind:
    """The Kind of a storage condition (one this operator does not know is a fault)."""
    return KINDS.get(storage) or KINDS[STORAGE_FAULT]


def describe(name: str, health: ReplicaHealth) -> str:
    """One replica's storage trouble, e.g. "orders-1 found its storage lost ... (reason)"."""
    text = f"{name} {kind(health.storage).meaning}"
    return f"{text}: {health.detail}" if health.detail else text


def degraded(facts: Facts) -> tuple[bool, str, str]:
    """The StorageDegraded condition: (value, reason, message)."""
    troubled = [name for name in facts.names if facts.health[name].storage]
    if not troubled:
        return False, HEALTHY, "every replica reports healthy storage"
    order = list(KINDS)
    worst = min(
        (facts.health[name].storage for name in troubled),
        key=lambda k: order.index(k) if k in order else len(order),
    )
    return True, kind(worst).reason, "; ".join(describe(n, facts.health[n]) for n in troubled)


def changes(facts: Facts) -> list[Change]:
    """The Events of the replicas' health since the previous status."""
    result: list[Change] = []
    for name in facts.names:
        before, now = facts.was_health[name], facts.health[name]
        rose = _corrupt_records_found(before, now)
        if now.storage and now.storage != before.storage:
            if not (now.storage == "corrupt-repaired" and rose):  # said once, below
                result.append(Change("Warning", kind(now.storage).reason, describe(name, now)))
        elif before.storage and not now.storage:
            result.append(
                Change(
                    "Normal",
                    "StorageHealthy",
                    f"{name} reports healthy storage again (was: {kind(before.storage).reason})",
                )
            )
        if rose:
            records = "a corrupt record" if rose == 1 else f"{rose} corrupt records"
            detail = f": {now.detail}" if now.detail else ""
            result.append(
                Change(
                    "Warning",
                    "CorruptRecordRepaired",
                    f"{name} found {records} (dropped, repaired from its peers; "
                    f"{now.corrupt_records} since it started){detail}",
                )
            )
        if now.crash_loop and not before.crash_loop:
            result.append(
                Change("Warning", "ReplicaCrashLooping", f"{name} crash-loops: {now.crash_loop}")
            )
    return result


def _corrupt_records_found(before: ReplicaHealth, now: ReplicaHealth) -> int:
    """How many corrupt records a replica found since the previous status. The count starts
    at 0 when the replica starts: a lower count than before means it restarted, and all of
    its count is new."""
    if now.corrupt_records >= before.corrupt_records:
        return now.corrupt_records - before.corrupt_records
    return now.corrupt_records
