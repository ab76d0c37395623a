"""`rlog replica --log-format json`: every line a replica writes is one JSON object with the
time, level, logger and message, a traceback included as a field, never a bare line; and
a format the replica does not know is refused by name before it starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow


def test_a_replica_logs_one_json_object_per_line(tmp_path):
    with DevCluster(3, tmp_path, election_timeout=0.5, replica_args=["--log-format", "json"]) as c:
        leader = c.wait_for_leader()
        c.stop_replica(leader)  # a drain and a stop: more lines, from more loggers
        lines = [
            line
            for line in c.log_file(leader).read_text().splitlines()
            if not line.startswith("---- ")  # the dev cluster's own start marker
        ]
    records = [json.loads(line) for line in lines]  # any bare line fails here
    assert len(records) >= 5
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys(), record
    messages = [r["message"] for r in records]
    assert any("listening on" in m for m in messages)
    assert any(m.startswith("elected with proposal") for m in messages)
    assert {r["logger"] for r in records} >= {"rlog.server", "rlog.node"}


def test_an_unknown_log_format_from_the_environment_is_refused_by_name(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rlog.tools.cli",
            "replica",
            "--id",
            "0",
            "--peers",
            "127.0.0.1:1",
            "--data-dir",
            str(tmp_path),
        ],
        env={"RLOG_LOG_FORMAT": "xml", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "log format 'xml' is not one of text, json" in result.stderr
    assert "Traceback" not in result.stderr
