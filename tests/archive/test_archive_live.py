"""Archive and restore against real replica processes (`DevCluster`) and a real S3 server
(versitygw, started by e2e/s3/s3.sh): archiving under write load, an archiver SIGKILLed
mid-segment and resumed, every data dir deleted and the log restored into a new one (every
entry compared), a point-in-time restore to a middle position, a corrupted segment refused,
clear errors for a wrong bucket and bad credentials."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("minio")

import itertools

from s3server import S3Server

from rlog.proto import rlog_pb2 as pb
from rlog.storage import open_storage
from rlog.tools.dev import DevCluster, free_port

RLOG = [sys.executable, "-m", "rlog.tools.cli"]
VALUE = 700  # bytes per value


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server.start(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


def rlog(s3: S3Server, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*RLOG, *args], env=s3.env(), capture_output=True, text=True, timeout=240)
    if check:
        assert done.returncode == 0, done.stderr
    return done


def manifest(s3: S3Server, bucket: str, prefix: str) -> dict | None:
    raw = s3.get(bucket, f"{prefix}/manifest.json")
    return None if raw is None else json.loads(raw)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)


class Writer:
    """Appends batches of values from a thread until stopped; remembers every acknowledged
    (position, value)."""

    def __init__(self, cluster: DevCluster, tag: str) -> None:
        self.client = cluster.client()
        self.tag = tag
        self.acked: dict[int, bytes] = {}
        self.stopped = threading.Event()
        self.count = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stopped.is_set():
            self.append(8)

    def append(self, n: int) -> None:
        values = [f"{self.tag}-{self.count + i}-".encode().ljust(VALUE, b"x") for i in range(n)]
        positions = self.client.append(values)
        self.count += n
        self.acked.update(zip(positions, values, strict=True))

    def start(self) -> Writer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive()


def archiver(s3: S3Server, cluster: DevCluster, bucket: str, prefix: str, *extra: str, log: Path):
    return subprocess.Popen(
        [
            *RLOG,
            "archive",
            "run",
            "-e",
            cluster.endpoint,
            "--bucket",
            bucket,
            "--prefix",
            prefix,
            "--poll-interval",
            "0.1",
            *extra,
        ],
        env=s3.env(),
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),
    )


def every_entry(cluster: DevCluster) -> list[tuple[int, bytes]]:
    with cluster.client() as client:
        return [(e.position, e.value) for e in client.read()]


def restored_cluster(s3, bucket, prefix, dir: Path, *extra: str) -> DevCluster:
    cluster = DevCluster(3, dir, initialize=False, election_timeout=0.5, log_id="restored")
    cluster.prepare()
    args = [a for d in cluster.data_dirs for a in ("--data-dir", str(d))]
    out = rlog(s3, "restore", "--bucket", bucket, "--prefix", prefix, "--json", *args, *extra)
    assert json.loads(out.stdout)["restored"] is True
    return cluster  # started by `with`


@pytest.fixture(scope="module")
def archived(s3, tmp_path_factory):
    """A 3-replica log written under load while an archiver (SIGKILLed once mid-segment,
    then resumed) archives it; the whole log is archived at the end. Yields the archive's
    (bucket, prefix), the log's entries as read before it was destroyed, and the writers'
    acknowledged entries. The log's data dirs are deleted before the tests run."""
    bucket, prefix = s3.new_bucket(), "logs/one"
    root = tmp_path_factory.mktemp("archived")
    log = root / "archiver.log"
    with DevCluster(3, root / "cluster", election_timeout=0.5) as cluster:
        writer = Writer(cluster, "a").start()
        # First archiver: big segments, no time-based cut, so what it read since its last
        # segment stays pending in memory until it is killed.
        first = archiver(
            s3,
            cluster,
            bucket,
            prefix,
            "--segment-bytes",
            str(200_000),
            "--flush-interval",
            "600",
            log=log,
        )
        wait_for(
            lambda: len((manifest(s3, bucket, prefix) or {}).get("segments", [])) >= 2,
            120,
            "two segments archived under load",
        )
        writer.stop()
        # A few more entries, less than a segment, so they stay pending: one at a time
        # until the archive is behind the log (a cut due just then could take them all).
        extra = Writer(cluster, "b")
        for _ in range(10):
            extra.append(1)
            time.sleep(1.0)
            learned = cluster.status(cluster.wait_for_leader()).learned
            if (manifest(s3, bucket, prefix) or {})["archived_through"] < learned:
                break
        first.send_signal(signal.SIGKILL)
        first.wait()
        before = manifest(s3, bucket, prefix)
        learned = cluster.status(cluster.wait_for_leader()).learned
        assert before is not None and before["archived_through"] < learned, (
            "the killed archiver had learned entries it had not archived"
        )
        # A segment uploaded but never listed (what a kill between the upload and the
        # manifest's update leaves): the next archiver must delete it, never list it.
        orphan = f"segments/{before['archived_through'] + 1:020d}-{learned:020d}.seg"
        s3.put(bucket, f"{prefix}/{orphan}", b"half a segment")

        second = archiver(
            s3,
            cluster,
            bucket,
            prefix,
            "--segment-bytes",
            str(64_000),
            "--flush-interval",
            "0.3",
            log=log,
        )
        writer2 = Writer(cluster, "c").start()
        time.sleep(3.0)
        writer2.stop()
        final = cluster.status(cluster.wait_for_leader()).learned
        wait_for(
            lambda: (manifest(s3, bucket, prefix) or {}).get("archived_through", -1) >= final,
            120,
            f"the archive to reach position {final}",
        )
        second.send_signal(signal.SIGTERM)
        assert second.wait(timeout=60) == 0, log.read_text()[-3000:]
        keys = s3.keys(bucket, prefix)
        assert f"{prefix}/{orphan}" not in keys
        entries = every_entry(cluster)
        acked = {**writer.acked, **extra.acked, **writer2.acked}
        for c in (writer, extra, writer2):
            c.client.close()
        data_dirs = cluster.data_dirs
    for d in data_dirs:  # every replica's data is gone
        shutil.rmtree(d)
    return bucket, prefix, entries, acked, final


def test_restore_after_losing_every_data_dir(s3, archived, tmp_path):
    bucket, prefix, entries, acked, final = archived
    assert len(entries) > 300
    with restored_cluster(s3, bucket, prefix, tmp_path / "restored") as cluster:
        restored = every_entry(cluster)
        assert restored == entries  # every position, every value
        positions = dict(restored)
        assert all(positions.get(p) == v for p, v in acked.items())
        leader = cluster.wait_for_leader()
        assert cluster.status(leader).learned >= final
        with cluster.client() as client:  # the restored log takes appends after the archive
            (position,) = client.append([b"after the restore"])
        assert position > final


def test_point_in_time_restore_to_a_middle_position(s3, archived, tmp_path):
    bucket, prefix, entries, _, _ = archived
    middle = entries[len(entries) // 2][0] + 0  # an APPEND position inside some segment
    with restored_cluster(
        s3, bucket, prefix, tmp_path / "pitr", "--to-position", str(middle)
    ) as cluster:
        assert every_entry(cluster) == [(p, v) for p, v in entries if p <= middle]
        with cluster.client(exactly_once=False) as client:  # no SESSION entry first
            (position,) = client.append([b"a new history"])
        assert position == middle + 1  # the log goes on right after the restore point


def test_archive_status_and_list(s3, archived):
    bucket, prefix, entries, _, final = archived
    status = json.loads(
        rlog(s3, "archive", "status", "--bucket", bucket, "--prefix", prefix, "--json").stdout
    )
    assert status["archived_through"] >= final
    assert status["entries"] == len(entries)
    listed = json.loads(
        rlog(s3, "archive", "list", "--bucket", bucket, "--prefix", prefix, "--json").stdout
    )["list"]
    assert listed[0]["first"] == status["begin"]
    assert all(a["last"] + 1 == b["first"] for a, b in itertools.pairwise(listed))
    assert sum(s["entries"] for s in listed) == len(entries)
    verified = json.loads(
        rlog(
            s3, "restore", "--bucket", bucket, "--prefix", prefix, "--verify-only", "--json"
        ).stdout
    )
    assert verified["entries"] == len(entries)


@pytest.fixture()
def small_archive(s3, tmp_path):
    """A 1-replica log with a few segments archived (`--once` per batch)."""
    bucket = s3.new_bucket()
    with DevCluster(1, tmp_path / "one") as cluster:
        writer = Writer(cluster, "s")
        for _ in range(3):
            for _ in range(5):
                writer.append(10)
            rlog(
                s3,
                "archive",
                "run",
                "--once",
                "-e",
                cluster.endpoint,
                "--bucket",
                bucket,
                "--prefix",
                "p",
            )
        writer.client.close()
        entries = every_entry(cluster)
    return bucket, entries


def test_corrupted_segment_is_refused(s3, small_archive, tmp_path):
    bucket, _ = small_archive
    body = manifest(s3, bucket, "p")
    assert body is not None and len(body["segments"]) == 3
    key = f"p/{body['segments'][1]['key']}"
    raw = bytearray(s3.get(bucket, key) or b"")
    raw[len(raw) // 2] ^= 0x01  # one bit
    s3.put(bucket, key, bytes(raw))
    data_dir = tmp_path / "new"
    done = rlog(
        s3, "restore", "--bucket", bucket, "--prefix", "p", "--data-dir", str(data_dir), check=False
    )
    assert done.returncode == 1
    assert "fails its checksum" in done.stderr and body["segments"][1]["key"] in done.stderr
    assert "Traceback" not in done.stderr
    storage = open_storage(data_dir)  # whichever engine the restore wrote with
    try:
        assert storage.metadata().status != pb.VOTING  # never a usable log
    finally:
        storage.close()
    verify = rlog(s3, "restore", "--bucket", bucket, "--prefix", "p", "--verify-only", check=False)
    assert verify.returncode == 1 and "fails its checksum" in verify.stderr


def test_clear_errors(s3, small_archive, tmp_path):
    bucket, _ = small_archive
    wrong = rlog(s3, "archive", "status", "--bucket", "no-such-bucket", check=False)
    assert wrong.returncode == 1
    assert "bucket 'no-such-bucket' does not exist" in wrong.stderr
    env = {k: v for k, v in s3.env().items() if not k.startswith("AWS_")}
    env["HOME"] = str(tmp_path)  # no ~/.aws either
    missing = subprocess.run(
        [*RLOG, "archive", "list", "--bucket", bucket, "--prefix", "p"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert missing.returncode == 1 and "no S3 credentials" in missing.stderr
    bad = subprocess.run(
        [*RLOG, "archive", "list", "--bucket", bucket, "--prefix", "p"],
        env={**s3.env(), "AWS_SECRET_ACCESS_KEY": "wrong"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 1 and "refused the credentials" in bad.stderr
    nothing = rlog(
        s3,
        "restore",
        "--bucket",
        bucket,
        "--prefix",
        "nothing-here",
        "--data-dir",
        str(tmp_path / "d"),
        check=False,
    )
    assert nothing.returncode == 1 and "no archive at" in nothing.stderr
    past = rlog(
        s3,
        "restore",
        "--bucket",
        bucket,
        "--prefix",
        "p",
        "--to-position",
        "999999",
        "--data-dir",
        str(tmp_path / "d2"),
        check=False,
    )
    assert past.returncode == 1 and "the archive ends at" in past.stderr


def test_retention_drops_old_segments_and_restore_begins_after_them(s3, tmp_path):
    bucket = s3.new_bucket()
    with DevCluster(1, tmp_path / "one") as cluster:
        writer = Writer(cluster, "r")
        for _ in range(4):
            writer.append(30)
            rlog(
                s3,
                "archive",
                "run",
                "--once",
                "-e",
                cluster.endpoint,
                "--bucket",
                bucket,
                "--prefix",
                "r",
            )
        before = manifest(s3, bucket, "r")
        assert before is not None and len(before["segments"]) == 4
        keep_from = before["segments"][2]["first"]
        writer.append(30)
        rlog(
            s3,
            "archive",
            "run",
            "--once",
            "-e",
            cluster.endpoint,
            "--bucket",
            bucket,
            "--prefix",
            "r",
            "--retention-keep-from",
            str(keep_from),
        )
        writer.client.close()
        entries = every_entry(cluster)
    after = manifest(s3, bucket, "r")
    assert after is not None
    assert next(s["first"] for s in after["segments"]) == keep_from and after["begin"] == keep_from
    keys = s3.keys(bucket, "r/segments/")
    assert keys == {f"r/{s['key']}" for s in after["segments"]}
    with restored_cluster(s3, bucket, "r", tmp_path / "restored") as restored:
        assert every_entry(restored) == [(p, v) for p, v in entries if p >= keep_from]
        with restored.client() as client:
            assert client.status().begin == keep_from


def _post(url: str) -> tuple[int, dict]:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def covered(s3: S3Server, bucket: str, prefix: str) -> int:
    """The last position the archive covers (-1: none)."""
    through = (manifest(s3, bucket, prefix) or {}).get("archived_through")
    return -1 if through is None else int(through)


def test_flush_archives_now_without_waiting_for_a_segment(s3, tmp_path):
    """`POST /flush?through=P` on the archiver's endpoint (kubectl rlog backup): with a
    segment size and flush interval that would cut nothing for an hour, the archive covers
    P at once; bad requests get a clear 4xx and change nothing."""
    import urllib.request

    port, control = free_port(), free_port()
    bucket = s3.new_bucket()
    with DevCluster(1, tmp_path / "one") as cluster:
        writer = Writer(cluster, "f")
        writer.append(40)
        archive = archiver(
            s3, cluster, bucket, "f", "--segment-bytes", str(1 << 30), "--flush-interval",
            "3600", "--metrics-port", str(port), "--control-port", str(control),
            log=tmp_path / "archiver.log",
        )  # fmt: skip
        base = f"http://127.0.0.1:{control}"  # a plaintext log: the control port on loopback
        try:
            wait_for(lambda: manifest(s3, bucket, "f") is not None, 60, "the manifest")

            def metrics() -> str:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    return str(r.read().decode())

            wait_for(lambda: "rlog_archive_archived_position" in metrics(), 30, "metrics")
            assert covered(s3, bucket, "f") == -1
            for query, code, words in (
                ("", 400, "missing ?through=POSITION"),
                ("?through=abc", 400, "'abc' is not a position"),
                ("?through=-3", 400, "'-3' is not a position"),
            ):
                status, body = _post(f"{base}/flush{query}")
                assert (status, words in body["error"]) == (code, True), body
            with pytest.raises(urllib.error.HTTPError) as got:
                urllib.request.urlopen(f"{base}/flush?through=1", timeout=5)  # a GET
            assert got.value.code == 405
            assert covered(s3, bucket, "f") == -1

            for _ in range(2):  # a second request after more appends works the same
                learned = cluster.status(cluster.wait_for_leader()).learned
                status, body = _post(f"{base}/flush?through={learned}")
                assert status == 202 and body["through"] == learned, body
                wait_for(
                    lambda learned=learned: covered(s3, bucket, "f") >= learned,
                    60,
                    f"the flush to archive through {learned}",
                )
                writer.append(25)
            entries = dict(every_entry(cluster))
            archived = manifest(s3, bucket, "f") or {}
            assert len(archived["segments"]) == 2  # one segment per flush, nothing else
            # every APPEND entry through the last flush's position, in the two segments
            assert sum(seg["entries"] for seg in archived["segments"]) == len(
                [p for p in entries if p <= learned]
            )
        finally:
            archive.send_signal(signal.SIGTERM)
            assert archive.wait(timeout=60) == 0, (tmp_path / "archiver.log").read_text()[-3000:]
            writer.client.close()
