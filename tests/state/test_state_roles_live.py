"""Replicated state (rlog.state) on a real mutual-TLS log with roles: compaction truncates,
which needs role owner (docs/security.md, "Who needs owner"). A state client with role
append writes its snapshots, is refused the truncation, says so once and loses nothing;
`compact()` and `rlog state compact` fail saying the same; an owner compacts."""

from __future__ import annotations

import logging

import pytest

pytest.importorskip("cryptography")

from rlog.client.errors import PermissionDenied
from rlog.state import State, Variable
from rlog.tools.dev import DevCluster

NEEDS_OWNER = "compaction cannot truncate the log: it needs the owner role"


def test_compaction_needs_the_owner_role_and_loses_nothing_without_it(tmp_path, caplog, capsys):
    from rlog.tools.cli import main

    caplog.set_level(logging.WARNING, logger="rlog.state")
    with DevCluster(3, tmp_path, election_timeout=0.5, tls=True) as cluster:
        cluster.wait_for_leader()
        endpoints = ",".join(cluster.endpoints)
        expected: dict[str, bytes] = {}
        writer = cluster.credentials("writer")  # role append
        with State(endpoints, snapshot_every=10, credentials=writer) as state:
            for i in range(45):
                name = f"worker-{i % 7}"
                value = f"{name}@{i}".encode()
                current = state.fetch(name)
                assert state.store(Variable(name, value, current.version)) is not None
                expected[name] = value
            # Automatic compaction: snapshots written, every truncation refused, one warning.
            assert state.asynchronous.snapshots_written >= 3
            refused = state.asynchronous.truncation_refused
            assert refused is not None and refused.startswith(NEEDS_OWNER)
            assert "role append no longer allows Truncate" in refused
            warnings = [r.getMessage() for r in caplog.records if r.name == "rlog.state"]
            assert len(warnings) == 1 and warnings[0].startswith(NEEDS_OWNER), warnings
            # Explicit compaction: the snapshot is written, then PermissionDenied says why.
            written = state.asynchronous.snapshots_written
            with pytest.raises(PermissionDenied, match=NEEDS_OWNER):
                state.compact()
            assert state.asynchronous.snapshots_written == written + 1
            assert {n: v.value for n, v in state.variables().items()} == expected
        # Every replica answering first: on a loaded machine (parallel tests) one started half
        # a second after the election, and its status was not there to check when asked.
        cluster.wait_for(lambda found: all(s is not None for s in found), 30, "every replica")
        assert all(s is not None and s.begin == 0 for s in cluster.statuses(timeout=5.0))

        tls = cluster.tls_dir
        as_writer = ["--ca", str(tls / "ca.pem"), "--cert", str(tls / "writer.pem")]
        as_writer += ["--key", str(tls / "writer-key.pem")]
        code = main(["state", "compact", "-e", endpoints, *as_writer])
        err = capsys.readouterr().err
        assert code == 1
        assert len(err.splitlines()) == 1 and NEEDS_OWNER in err, err

        # Nothing was lost: a new client recovers every variable (from the newest snapshot).
        with State(endpoints, strict=True, credentials=writer) as recovered:
            assert {n: v.value for n, v in recovered.variables().items()} == expected

        # The owner compacts: the log is truncated below the previous snapshot.
        with State(endpoints, credentials=cluster.credentials("owner")) as owner:
            owner.compact()
            assert owner.asynchronous.truncation_refused is None
        cluster.wait_for(
            lambda found: all(s is not None and s.begin > 0 for s in found),
            what="the owner's compaction truncating the log on every replica",
        )
        with State(endpoints, strict=True, credentials=writer) as recovered:
            assert {n: v.value for n, v in recovered.variables().items()} == expected
