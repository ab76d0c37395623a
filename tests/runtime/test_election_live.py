"""Leader stability of a fresh auto-initialized log: real 3-replica clusters, started many
times. Once the log first has a leader, no replica may stand for election again (replicas
that turned VOTING together, or one that turned VOTING a moment later, used to depose the
first leader and fail the client's first append with an unknown outcome). The first leader
of a brand-new log does not step down on its own either."""

from __future__ import annotations

import os
import textwrap
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from live import append_acked, scrape

from rlog.client import Client
from rlog.client.errors import RlogError
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster

pytestmark = pytest.mark.slow

ROUNDS = 20
CONCURRENT = 4  # clusters started at once (the rounds are independent)
ELECTION_TIMEOUT = 0.5
SETTLE = 3.0  # seconds watched after every replica is VOTING (several election timeouts)
DISK_DELAY = 0.05  # seconds added to every durable batch: a network-attached volume

# Loaded by every replica process (PYTHONPATH): each durable batch of the journal takes
# DISK_DELAY longer, so an election and its fill take as long as they do on a cloud volume.
SLOW_DISK = textwrap.dedent(
    f"""
    import time
    import rlog.runtime.journal

    _start = rlog.runtime.journal.Journal.start

    def start(self):
        apply = self.storage.apply

        def slow_apply(batch):
            time.sleep({DISK_DELAY})
            return apply(batch)

        self.storage.apply = slow_apply
        return _start(self)

    rlog.runtime.journal.Journal.start = start
    """
)


@dataclass
class Round:
    first: tuple[str, int] | None = None  # (leader address, proposal) when a leader appeared
    problems: list[str] = field(default_factory=list)


def _one_round(directory: Path) -> Round:
    result = Round()
    site = directory / "site"
    site.mkdir(parents=True)
    (site / "sitecustomize.py").write_text(SLOW_DISK)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), env.get("PYTHONPATH")) if p)
    cluster = DevCluster(
        3,
        directory,
        initialize=False,
        auto_initialize=True,
        distinct_hosts=True,
        election_timeout=ELECTION_TIMEOUT,
        env=env,
    )
    append_error: list[str] = []

    def append_first() -> None:
        try:
            with Client(cluster.endpoints, append_timeout=10) as client:
                client.append([b"first"])
        except RlogError as exc:
            append_error.append(f"{type(exc).__name__}: {exc}")

    try:
        cluster.start(wait=False)
        deadline = time.monotonic() + 60
        while result.first is None:
            if time.monotonic() > deadline:
                result.problems.append("no leader within 60 s")
                return result
            for s in cluster.statuses():
                if s is not None and s.status == pb.VOTING and s.role == "leader":
                    result.first = (s.address, s.proposal)
            time.sleep(0.02)
        leader, proposal = result.first
        writer = threading.Thread(target=append_first)
        writer.start()
        all_voting_at: float | None = None
        while all_voting_at is None or time.monotonic() - all_voting_at < SETTLE:
            if time.monotonic() > deadline:
                result.problems.append("not every replica VOTING within 60 s")
                break
            found = cluster.statuses()
            if all_voting_at is None and all(
                s is not None and s.status == pb.VOTING for s in found
            ):
                all_voting_at = time.monotonic()
            for s in found:
                if s is None:
                    continue
                # Any later election raises some replica's promise above the first leader's
                # proposal (a candidate promises itself first), and a promise never falls.
                if s.promised > proposal:
                    result.problems.append(f"replica {s.id} promised {s.promised} > {proposal}")
                if s.role == "leader" and (s.address, s.proposal) != (leader, proposal):
                    result.problems.append(f"new leader {s.address} at proposal {s.proposal}")
            if result.problems:
                break
            time.sleep(0.05)
        writer.join(timeout=30)
        result.problems.extend(f"first append failed: {e}" for e in append_error)
    finally:
        cluster.stop()
    return result


def test_a_fresh_log_keeps_its_first_leader(tmp_path):
    with ThreadPoolExecutor(CONCURRENT) as pool:
        rounds = list(pool.map(_one_round, [tmp_path / f"round-{i}" for i in range(ROUNDS)]))
    bad = {i: r.problems for i, r in enumerate(rounds) if r.problems}
    assert all(r.first is not None for r in rounds), bad
    # Timers only make a second election unlikely (two replicas may still time out within
    # the same instant): allow one round in twenty.
    assert len(bad) <= ROUNDS // 20, f"{len(bad)} of {ROUNDS} rounds had another election: {bad}"


def test_the_first_leader_of_a_new_log_admits_appends_without_stepping_down(tmp_path):
    """A new leader takes the admission state once its fill is learned here. Its fill of a
    brand-new log ends at position 0, and the wait for it read `core.learned`, which is 0
    when nothing is learned too: the state was taken before position 0 was learned, was
    missing ("no admission state: learned up to -1, the leader needs 0"), and every new
    log's first leader stepped down at once and was elected again. One replica: no rival
    can depose it, so every election past the first is the leader's own doing."""
    with DevCluster(1, tmp_path, metrics=True, election_timeout=ELECTION_TIMEOUT) as cluster:
        cluster.wait_for_leader()
        with cluster.client() as client:
            append_acked(client, [b"first"])
        elections = {
            dict(labels)["result"]: value
            for (name, labels), value in scrape(cluster, 0).items()
            if name == "rlog_elections_total"
        }
        assert elections.get("won") == 1, elections
        assert elections.get("demoted", 0) == 0, elections
        assert "no admission state" not in cluster.log_file(0).read_text()
