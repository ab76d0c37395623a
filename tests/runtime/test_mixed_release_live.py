"""A log of two builds: the previous release and this tree, replaced one replica at a time
under a writer (docs/upgrades.md, "Mixed versions" and "Versions").

The release's replica code is taken from its git tag or commit
(`rlog.version.PREVIOUS_RELEASE` and `PREVIOUS_RELEASE_COMMIT`, by
e2e/cluster/release_source.sh) and run by `DevCluster(builds=...)` with that tree alone on
the replica's PYTHONPATH. Three replicas, one data dir each, kept across every restart:

    start                     release  head     head
    replica 1 -> the release  release  release  head      (a replica of the release leads)
    replica 0 -> the head     head     release  head
    replica 1 -> the head     head     head     head

A replacement stops one replica (SIGTERM, as a rolling upgrade does) and starts it with the
other build on its own data dir. Each started replica names its build's version (`rlog
--version` in its environment, and its start-up log line), and is VOTING with every
acknowledged entry before the next replacement. In every phase the writer has appends
acknowledged and linearizable reads answered with the values acknowledged, and every
replica, of either build, learns them (a quorum of one build leaving the other's replica
behind fails). At the end every acknowledged entry is read back at its position from every
replica.

A clone that cannot have the release (a shallow one with no remote to fetch its commit
from) skips, naming the tag and the command that fetches it: the test never passes without
the release.

The release runs on this tree's Python and third-party packages (only its `rlog` comes from
the tag): a release whose dependencies this tree no longer satisfies needs its own venv here.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from live import Writers, check, wait_all_voting

from rlog import __version__
from rlog.client import AsyncClient
from rlog.client.errors import RlogError
from rlog.proto import rlog_pb2 as pb
from rlog.tools.dev import DevCluster
from rlog.version import PREVIOUS_RELEASE

ROOT = Path(__file__).resolve().parents[2]
RELEASE_VERSION = PREVIOUS_RELEASE.removeprefix("v")
HEAD, RELEASE = "head", "release"
# (replica, the build it is restarted with), in order, from release/head/head
REPLACEMENTS = [(1, RELEASE), (0, HEAD), (1, HEAD)]
PER_PHASE = 60  # appends acknowledged and ...
READS_PER_PHASE = 5  # ... linearizable reads answered, in every phase
PHASE_TIMEOUT = 60.0  # the bound of a phase's waits, not a goal (a goal would be a bench)


@pytest.fixture(scope="module")
def release_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's `replica_image`, from its git tag or commit
    (e2e/cluster/release_source.sh, which also tells a clone that cannot have it)."""
    archive = subprocess.run(
        ["bash", str(ROOT / "e2e" / "cluster" / "release_source.sh"), "archive", "replica_image"],
        capture_output=True,
    )
    if archive.returncode == 3:
        pytest.skip(archive.stderr.decode().strip())
    assert archive.returncode == 0, archive.stderr.decode()
    dest = tmp_path_factory.mktemp("release")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest / "replica_image"


@pytest.fixture
def cluster(tmp_path: Path, release_tree: Path) -> Iterator[DevCluster]:
    c = DevCluster(3, tmp_path / "log", log_id="mixed", builds={0: release_tree})
    try:
        c.start()
        yield c
    finally:
        c.stop()


def version_of(cluster: DevCluster, i: int) -> str:
    """`rlog --version` in replica i's environment (its build's PYTHONPATH)."""
    out = subprocess.run(
        [cluster.python, "-m", "rlog.tools.cli", "--version"],
        env=cluster.replica_env(i),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


def started_as(cluster: DevCluster, i: int, version: str) -> bool:
    """Replica i's start-up line since its last start names `version`."""
    text = cluster.log_file(i).read_text(errors="replace")
    since = text.rpartition(f"starting replica {i}\n")[2]
    return f"listening on {cluster.endpoints[i]}" in since and f"rlog {version}," in since


def expect_build(cluster: DevCluster, i: int, build: str) -> None:
    version = RELEASE_VERSION if build == RELEASE else __version__
    assert version_of(cluster, i).startswith(f"rlog {version} "), (i, build)
    cluster.wait_for(
        lambda _: started_as(cluster, i, version),
        PHASE_TIMEOUT,
        f"replica {i} to start as rlog {version}",
    )


class Reader:
    """Linearizable reads of acknowledged positions through every replica; a read that
    answers another value than the one acknowledged there is recorded, never retried."""

    def __init__(self, endpoints: list[str], acknowledged: dict[int, bytes]) -> None:
        self.endpoints = endpoints
        self.acknowledged = acknowledged
        self.answered = 0
        self.wrong: list[str] = []
        self._stop = asyncio.Event()

    async def run(self) -> None:
        rng = random.Random(7)
        async with AsyncClient(self.endpoints, timeout=5) as client:
            while not self._stop.is_set():
                if not self.acknowledged:
                    await asyncio.sleep(0.05)
                    continue
                position = rng.choice(list(self.acknowledged))
                try:
                    got = [e async for e in client.read(position, position)]
                except RlogError:  # a replica gone, an election, a read index not confirmed
                    await asyncio.sleep(0.1)
                    continue
                values = [e.value for e in got]
                if values != [self.acknowledged[position]]:
                    self.wrong.append(f"read {position}: {values!r}")
                self.answered += 1
                await asyncio.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()


def caught_up(replicas: list[int], target: int):  # type: ignore[no-untyped-def]
    """Each of `replicas` is VOTING and has learned `target`."""

    def check(found: list[pb.StatusResponse | None]) -> bool:
        return all(
            (status := found[i]) is not None
            and status.status == pb.VOTING
            and status.learned >= target
            for i in replicas
        )

    return check


def test_a_rolling_replacement_between_the_release_and_the_head_keeps_every_entry(
    cluster: DevCluster, release_tree: Path
) -> None:
    builds = [RELEASE, HEAD, HEAD]
    for i, build in enumerate(builds):
        expect_build(cluster, i, build)
    writers = Writers(cluster.endpoints, clients=3, per_call=3)
    reader = Reader(cluster.endpoints, writers.acknowledged)

    async def progress() -> None:
        """The log moves with these builds, and every replica follows it: a quorum that
        leaves one build's replica behind (e.g. refusing the other's messages) fails."""
        what = f"appends and reads with {builds}"
        acked, answered = len(writers.acknowledged), reader.answered

        def moved() -> bool:
            return (
                len(writers.acknowledged) >= acked + PER_PHASE
                and reader.answered >= answered + READS_PER_PHASE
            )

        await asyncio.to_thread(cluster.wait_for, lambda _: moved(), PHASE_TIMEOUT, what)
        target = max(writers.acknowledged)
        await asyncio.to_thread(
            cluster.wait_for,
            caught_up([0, 1, 2], target),
            PHASE_TIMEOUT,
            f"every replica of {builds} VOTING with position {target}",
        )

    async def replace(i: int, build: str) -> None:
        cluster.stop_replica(i)  # SIGTERM, as a rolling upgrade stops a replica
        cluster.builds.pop(i, None)
        if build == RELEASE:
            cluster.builds[i] = release_tree
        cluster.start_replica(i)
        builds[i] = build
        await asyncio.to_thread(expect_build, cluster, i, build)
        target = max(writers.acknowledged, default=0)
        await asyncio.to_thread(
            cluster.wait_for,
            caught_up([i], target),
            PHASE_TIMEOUT,
            f"replica {i} ({build}) VOTING with position {target}",
        )

    async def lead_with(build: str) -> None:
        """Step leaders of the other build down until a replica of `build` leads. A step-down
        gives the others a chance (the leader waits 2T before it stands again); it is no
        hand-over, and the same replica may win the next election (a loaded host delays the
        others' candidacies), so one step-down and a wait for another leader is not enough."""
        deadline = time.monotonic() + PHASE_TIMEOUT
        step_downs = 0
        while True:
            leader = await asyncio.to_thread(cluster.wait_for_leader, PHASE_TIMEOUT)
            if builds[leader] == build:
                return
            assert time.monotonic() < deadline, (
                f"no replica of the {build} led within {PHASE_TIMEOUT:g} s: "
                f"{step_downs} step-downs of {builds}"
            )
            async with AsyncClient([cluster.endpoints[leader]]) as client:
                await client.step_down(cluster.endpoints[leader])
            step_downs += 1

    async def scenario() -> None:
        tasks = [asyncio.create_task(writers.run()), asyncio.create_task(reader.run())]
        try:
            await progress()
            for i, build in REPLACEMENTS:
                await replace(i, build)
                if builds.count(RELEASE) == 2:
                    await lead_with(RELEASE)
                await progress()
        finally:
            writers.stop()
            reader.stop()
            await asyncio.gather(*tasks)

    asyncio.run(scenario())
    assert builds == [HEAD, HEAD, HEAD]
    assert not reader.wrong, reader.wrong[:5]
    wait_all_voting(cluster)
    report = check(cluster, writers.acknowledged)  # read back from every replica
    assert len(report.replicas) == 3 and all(r.status == pb.VOTING for r in report.replicas)
    print(
        f"{len(writers.acknowledged)} appends acknowledged, {reader.answered} reads, "
        f"{writers.unknown} unknown outcomes",
        file=sys.stderr,
    )
