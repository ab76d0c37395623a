"""Restores are all or nothing (docs/backup.md, "All or nothing"; docs/faults.md),
against a real S3 server (versitygw, e2e/s3/s3.sh): `rlog restore --if-fresh --starting`
(the operator's init container) SIGKILLed at each point of a restore (the test-only
RLOG_TEST_RESTORE_STOP_AT stops it there first, so the kill never depends on timing), and
cut off from S3 in the middle of a segment object; run again, the data dir holds exactly
the archive, entry for entry. Meanwhile the dir is marked: `rlog replica` and `rlog
initialize` refuse it with one line. `rlog archive verify` on a sound archive, one missing
a segment object and one with a corrupted segment object."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("minio")

from s3server import S3Server

from rlog.archive.restore import STOP_AT_ENV
from rlog.initialize import is_fresh
from rlog.proto import rlog_pb2 as pb
from rlog.storage import open_storage
from rlog.storage.restoring import RESTORING_NAME
from rlog.tools.dev import DevCluster

RLOG = [sys.executable, "-m", "rlog.tools.cli"]
PREFIX = "p"


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server.start(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


def rlog(s3: S3Server, *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [*RLOG, *args], env={**s3.env(), **(env or {})}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip


@pytest.fixture(scope="module")
def archive(s3, tmp_path_factory):
    """A 1-replica log archived in 3 segments (`--once` after each batch): the bucket and
    the log's APPEND entries."""
    bucket = s3.new_bucket()
    with DevCluster(1, tmp_path_factory.mktemp("log")) as cluster:
        with cluster.client() as client:
            for batch in range(3):
                client.append([f"{batch}-{i}-".encode().ljust(300, b"v") for i in range(40)])
                done = rlog(
                    s3, "archive", "run", "--once", "-e", cluster.endpoint, "--bucket", bucket,
                    "--prefix", PREFIX,
                )  # fmt: skip
                assert done.returncode == 0, done.stderr
            entries = [(e.position, e.value) for e in client.read()]
    return bucket, entries


def restore_args(bucket: str, data_dir: Path) -> list[str]:
    return [
        "restore", "--bucket", bucket, "--prefix", PREFIX, "--if-fresh", "--starting",
        "--data-dir", str(data_dir), "--json",
    ]  # fmt: skip


def assert_exactly_the_archive(data_dir: Path, entries: list[tuple[int, bytes]]) -> None:
    assert not (data_dir / RESTORING_NAME).exists()
    storage = open_storage(data_dir)
    try:
        meta = storage.metadata()
        last = entries[-1][0]
        assert (meta.status, meta.learned_below) == (pb.STARTING, last + 1)
        actions = list(storage.scan(0, 2**64 - 1))
        assert [a.position for a in actions] == list(range(meta.begin, last + 1))
        assert all(a.learned for a in actions)
        restored = [(a.position, a.value) for a in actions if a.type == pb.APPEND]
        assert restored == entries  # every position, every value
    finally:
        storage.close()


def assert_refused_while_marked(s3: S3Server, data_dir: Path) -> None:
    """A marked dir is never fresh, never initialized, never served."""
    assert (data_dir / RESTORING_NAME).exists()
    assert not is_fresh(data_dir)
    for args in (
        ["replica", "--id", "0", "--peers", "127.0.0.1:1", "--data-dir", str(data_dir)],
        ["initialize", "--data-dir", str(data_dir)],
    ):
        done = rlog(s3, *args)
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 1 and len(lines) == 1, done.stderr
        assert f"{data_dir / RESTORING_NAME}" in lines[0] and "run the restore again" in lines[0]


def killed_at(s3: S3Server, bucket: str, data_dir: Path, point: str) -> None:
    """Run the init container's restore into `data_dir` and SIGKILL it at `point`."""
    restoring = subprocess.Popen(
        [*RLOG, *restore_args(bucket, data_dir)],
        env={**s3.env(), STOP_AT_ENV: point},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert restoring.stderr is not None
    line = restoring.stderr.readline()  # it stops itself there, then says so
    restoring.send_signal(signal.SIGKILL)
    restoring.wait(timeout=30)
    assert f"stopped at {point}" in line, line + restoring.stderr.read()


@pytest.mark.parametrize("point", ["marked", "segment:1", "segment:2", "written"])
def test_restore_killed_then_run_again_holds_exactly_the_archive(s3, archive, tmp_path, point):
    bucket, entries = archive
    data_dir = tmp_path / "data"
    killed_at(s3, bucket, data_dir, point)
    assert_refused_while_marked(s3, data_dir)
    again = rlog(s3, *restore_args(bucket, data_dir))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["restored"] is True
    assert "holds an unfinished restore" in again.stderr
    assert_exactly_the_archive(data_dir, entries)
    once_more = rlog(s3, *restore_args(bucket, data_dir))  # a restarted pod: nothing to do
    assert json.loads(once_more.stdout)["restored"] is False
    assert_exactly_the_archive(data_dir, entries)


def test_a_running_peer_makes_a_marked_dir_fresh_again(s3, archive, tmp_path):
    """The init container run again when the other replicas already run the log: what the
    interrupted restore wrote is discarded (the dir is fresh, and the replica recovers from
    its peers like any lost volume), never kept."""
    bucket, _ = archive
    data_dir = tmp_path / "data"
    killed_at(s3, bucket, data_dir, "segment:1")
    with DevCluster(1, tmp_path / "running") as running:
        running.wait_for_leader()
        done = rlog(s3, *restore_args(bucket, data_dir), "--unless-peers-voting", running.endpoint)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["restored"] is False
    assert not (data_dir / RESTORING_NAME).exists() and is_fresh(data_dir)


class CutRelay:
    """A TCP relay in front of the S3 server that goes away (both directions cut, the port
    closed) after passing on `keep` bytes of the answer to the `nth` GET of a segment
    object: what a restore sees when the S3 server stops mid-object."""

    def __init__(self, upstream: str, nth: int, keep: int) -> None:
        host, _, port = upstream.removeprefix("http://").partition(":")
        self.upstream = (host, int(port))
        self.nth, self.keep = nth, keep
        self.gets = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.cut = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.cut.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            self.sockets += [client, server]
            budget: list[int | None] = [None]  # bytes of the answer still passed on
            threading.Thread(target=self._requests, args=(client, server, budget)).start()
            threading.Thread(target=self._answers, args=(server, client, budget)).start()

    def _requests(self, src: socket.socket, dst: socket.socket, budget: list[int | None]):
        while chunk := self._recv(src):
            if b"GET " in chunk and f"/{PREFIX}/segments/".encode() in chunk:
                self.gets += 1
                if self.gets == self.nth:
                    budget[0] = self.keep
            dst.sendall(chunk)

    def _answers(self, src: socket.socket, dst: socket.socket, budget: list[int | None]):
        while chunk := self._recv(src):
            if budget[0] is not None:
                chunk = chunk[: budget[0]]
                budget[0] -= len(chunk)
            dst.sendall(chunk)
            if budget[0] == 0:
                self.stop()
                return

    def _recv(self, s: socket.socket) -> bytes:
        try:
            return s.recv(65536)
        except OSError:
            return b""

    def stop(self) -> None:
        self.cut.set()
        self.listener.close()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()


def test_s3_gone_mid_object_fails_clearly_then_run_again_holds_exactly_the_archive(
    s3, archive, tmp_path
):
    bucket, entries = archive
    data_dir = tmp_path / "data"
    relay = CutRelay(s3.endpoint, nth=2, keep=2000)  # headers and part of the 2nd segment
    try:
        cut = rlog(
            s3, *restore_args(bucket, data_dir), env={"RLOG_ARCHIVE_ENDPOINT": relay.endpoint}
        )
    finally:
        relay.stop()
    assert relay.gets == 2
    lines = cut.stderr.strip().splitlines()
    assert cut.returncode == 1 and len(lines) == 1, cut.stderr  # never "nothing restored"
    assert "restore failed" in lines[0] and "/segments/" in lines[0]  # what, which object
    assert f"{data_dir} holds an unfinished restore" in lines[0]
    assert "run the same rlog restore again" in lines[0]  # what to do
    assert "Traceback" not in cut.stderr
    assert_refused_while_marked(s3, data_dir)
    again = rlog(s3, *restore_args(bucket, data_dir))
    assert again.returncode == 0 and json.loads(again.stdout)["restored"] is True, again.stderr
    assert_exactly_the_archive(data_dir, entries)


def copy_of(s3: S3Server, bucket: str) -> str:
    """A new bucket holding the archive's objects."""
    copy = s3.new_bucket()
    for key in s3.keys(bucket, PREFIX):
        s3.put(copy, key, s3.get(bucket, key) or b"")
    return copy


def verify(s3: S3Server, bucket: str) -> subprocess.CompletedProcess[str]:
    return rlog(s3, "archive", "verify", "--bucket", bucket, "--prefix", PREFIX)


def test_archive_verify(s3, archive):
    bucket, entries = archive
    sound = verify(s3, bucket)
    assert sound.returncode == 0, sound.stdout + sound.stderr
    assert ": sound: 3 of 3 segments checked sound" in sound.stdout
    assert f"{len(entries)} entries" in sound.stdout
    as_json = rlog(s3, "archive", "verify", "--bucket", bucket, "--prefix", PREFIX, "--json")
    assert json.loads(as_json.stdout)["sound"] is True

    damaged = copy_of(s3, bucket)
    segments = json.loads(s3.get(damaged, f"{PREFIX}/manifest.json") or b"")["segments"]
    s3.client().remove_object(damaged, f"{PREFIX}/{segments[0]['key']}")
    key = f"{PREFIX}/{segments[2]['key']}"
    raw = bytearray(s3.get(damaged, key) or b"")
    raw[len(raw) // 2] ^= 0x01  # one bit
    s3.put(damaged, key, bytes(raw))
    found = verify(s3, damaged)
    assert found.returncode == 1
    problems = [line for line in found.stdout.splitlines() if line.startswith("problem: ")]
    assert len(problems) == 2, found.stdout
    assert segments[0]["key"] in problems[0] and "missing" in problems[0]
    assert segments[2]["key"] in problems[1] and "fails its checksum" in problems[1]
    assert ": 2 problems: 1 of 3 segments checked sound" in found.stdout


def test_archive_verify_finds_a_gap_in_the_manifest(s3, archive):
    bucket, _ = archive
    gap = copy_of(s3, bucket)
    body = json.loads(s3.get(gap, f"{PREFIX}/manifest.json") or b"")
    del body["segments"][1]
    s3.put(gap, f"{PREFIX}/manifest.json", json.dumps(body).encode())
    found = verify(s3, gap)
    assert found.returncode == 1
    assert "problem: " in found.stdout and "expected one starting at" in found.stdout
    assert "1 unlisted segment objects" in found.stdout
