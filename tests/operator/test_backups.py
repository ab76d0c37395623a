"""The "archive now" decision (rlog_operator.backups): one request from its annotation to
Completed, Waiting without a leader, Refused without spec.backup, repeated flushes while
the archive lags, a new request after a completed one."""

from __future__ import annotations

from rlog_operator import backups as b
from rlog_operator import constants as c

T0, T1 = "2026-01-01T00:00:00.000+00:00", "2026-01-01T00:05:00.000+00:00"


def body(request: str | None = T0, backup: bool = True) -> dict:
    annotations = {c.ANNOTATION_BACKUP: request} if request else {}
    spec: dict = {"replicas": 3}
    if backup:
        spec["backup"] = {"bucket": "logs", "credentialsSecret": "s3"}
    return {"metadata": {"name": "orders", "annotations": annotations}, "spec": spec}


def test_no_request_no_step():
    assert b.backup_step(body(None), 90, 40, None, T0).kind == "none"


def test_a_request_runs_to_completion_through_the_leaders_learned_position():
    first = b.backup_step(body(), 90, 40, None, T0)
    assert (first.kind, first.through) == ("flush", 90)
    assert first.backup == {
        "request": T0, "state": "Running", "through": 90, "startedAt": T0, "message": ""
    }  # fmt: skip
    assert first.event is None
    # the archive lags: ask again (an archiver restarted meanwhile forgot), status unchanged
    again = b.backup_step(body(), 120, 60, first.backup, T0)
    assert (again.kind, again.through, again.backup) == ("flush", 90, None)
    # the leader moved on, but the request stands at 90: completed once the archive has 90
    done = b.backup_step(body(), 150, 90, first.backup, T1)
    assert done.kind == "complete" and done.backup is not None
    assert (done.backup["state"], done.backup["archivedPosition"]) == ("Completed", 90)
    assert done.backup["completedAt"] == T1 and done.backup["startedAt"] == T0
    assert done.event == ("Normal", "BackupCompleted", done.reason)
    assert "through position 90" in done.reason
    # answered: nothing more for this request
    assert b.backup_step(body(), 150, 95, done.backup, T1).kind == "none"
    # a new request (a new annotation value) starts again from the leader's position now
    second = b.backup_step(body(T1), 150, 95, done.backup, T1)
    assert (second.kind, second.through) == ("flush", 150)


def test_unknown_archive_position_keeps_flushing():
    running = b.backup_step(body(), 90, None, None, T0).backup
    assert b.backup_step(body(), 90, None, running, T0).kind == "flush"


def test_without_a_leader_the_request_waits_and_says_why():
    wait = b.backup_step(body(), None, 40, None, T0)
    assert wait.kind == "wait" and wait.backup is not None
    assert wait.backup["state"] == "Waiting" and "leader" in wait.backup["message"]
    assert b.backup_step(body(), None, 40, wait.backup, T0).backup is None  # no rewrite
    assert b.backup_step(body(), 70, 40, wait.backup, T0).through == 70


def test_a_log_without_spec_backup_refuses_once():
    refused = b.backup_step(body(backup=False), 90, None, None, T0)
    assert refused.kind == "refuse" and refused.backup is not None
    assert refused.backup["state"] == "Refused" and "no spec.backup" in refused.backup["message"]
    assert refused.event is not None and refused.event[:2] == ("Warning", "BackupRefused")
    assert b.backup_step(body(backup=False), 90, None, refused.backup, T0).kind == "none"
