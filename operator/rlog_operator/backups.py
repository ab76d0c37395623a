""" "Archive now" (`kubectl rlog backup NAME`, annotation rlog.io/backup): a pure decision
from the request, the leader's learned position and the archive's state, like rolling.py.

The archive is continuous (spec.backup): it lags the log by at most a segment or the
archiver's flush interval. A backup request makes that lag zero once: the operator takes the
leader's learned position P when it first sees the request (every append acknowledged
before the request is at or below P: a leader acknowledges only what it learned), asks the
archiver to cut segments through P (`POST /flush?through=P`, repeated on each tick until
done: an archiver restarted meanwhile forgets it) and reports the request Completed in
`status.archive.backup` once the archive covers P. A request is its annotation's value; a
new value is a new request.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from rlog_operator import constants as c

RUNNING, COMPLETED, REFUSED, WAITING = "Running", "Completed", "Refused", "Waiting"

StepKind = Literal["none", "wait", "refuse", "flush", "complete"]


@dataclass(frozen=True)
class BackupStep:
    kind: StepKind
    through: int = -1  # flush: the position the archive must cover
    backup: Mapping[str, Any] | None = None  # status.archive.backup to store (None: as is)
    reason: str = ""

    @property
    def event(self) -> tuple[str, str, str] | None:
        """(type, reason, message) of the Event this step deserves, if any."""
        if self.kind == "complete" and self.backup is not None:
            return ("Normal", "BackupCompleted", self.reason)
        if self.kind == "refuse":
            return ("Warning", "BackupRefused", self.reason)
        return None


def backup_step(
    body: Mapping[str, Any],
    leader_learned: int | None,
    archived_position: int | None,
    previous: Mapping[str, Any] | None,
    now: str,
) -> BackupStep:
    """The next step of the request in `body`'s rlog.io/backup annotation.

    `leader_learned`: the learned position of the replica that confirmed it leads (None
    without a leader); `archived_position`: the archive's, from the archiver's metrics
    (None if unknown); `previous`: status.archive.backup as stored."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    request = str(annotations.get(c.ANNOTATION_BACKUP) or "")
    if not request:
        return BackupStep("none")
    previous = previous or {}
    same = previous.get("request") == request
    if same and previous.get("state") in (COMPLETED, REFUSED):
        return BackupStep("none")
    if not (body.get("spec") or {}).get("backup"):
        why = "the log has no spec.backup: there is no archive to write"
        return BackupStep(
            "refuse", backup={"request": request, "state": REFUSED, "message": why}, reason=why
        )
    if same and previous.get("state") == RUNNING:
        through = int(previous.get("through", -1))
        if archived_position is not None and archived_position >= through:
            done = {
                **previous,
                "state": COMPLETED,
                "archivedPosition": archived_position,
                "completedAt": now,
                "message": "",
            }
            return BackupStep(
                "complete",
                through=through,
                backup=done,
                reason=f"the archive covers the log through position {archived_position} "
                f"(asked: {through})",
            )
        return BackupStep("flush", through=through, reason=f"archiving through {through}")
    if leader_learned is None:
        why = "waiting for a leader to take the log's learned position from"
        waiting = {"request": request, "state": WAITING, "message": why}
        return BackupStep("wait", backup=None if previous == waiting else waiting, reason=why)
    running = {
        "request": request,
        "state": RUNNING,
        "through": leader_learned,
        "startedAt": now,
        "message": "",
    }
    return BackupStep(
        "flush",
        through=leader_learned,
        backup=running,
        reason=f"archiving through {leader_learned}",
    )
