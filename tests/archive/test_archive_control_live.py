"""The archiver's control port and its retention, attacked for real: real replica processes
(`DevCluster`, with TLS where identities matter), a real `rlog archive run` process, a real
S3 server (versitygw). Each forbidden call is made and must change nothing: a flush on the
metrics port, from a caller without a certificate, from the log's other identities, from
another CA; a flush through a huge position must cut once, not on every poll; a wall clock
stepped a year forward must not make retention delete anything."""

from __future__ import annotations

import asyncio
import json
import signal
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("minio")

from s3server import S3Server

from rlog.certs import DevPki, issue, new_ca
from rlog.tools.dev import DevCluster, free_port

RLOG = [sys.executable, "-m", "rlog.tools.cli"]
VALUE = 300


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    server = S3Server.start(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def manifest(s3: S3Server, bucket: str, prefix: str) -> dict[str, Any]:
    raw = s3.get(bucket, f"{prefix}/manifest.json")
    return {} if raw is None else json.loads(raw)


def covered(s3: S3Server, bucket: str, prefix: str) -> int:
    through = manifest(s3, bucket, prefix).get("archived_through")
    return -1 if through is None else int(through)


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        for line in answer.read().decode().splitlines():
            if line.startswith(f"{name} "):
                return float(line.split()[1])
    return -1.0


def metrics_up(port: int) -> bool:
    try:
        return metric(port, "rlog_archive_polls_total") >= 1
    except OSError:
        return False


def post(url: str, context: ssl.SSLContext | None = None) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(url, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10, context=context) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def start_archiver(
    s3: S3Server, endpoint: str, bucket: str, prefix: str, *extra: str, log: Path
) -> subprocess.Popen[bytes]:
    """`rlog archive run` that cuts nothing by itself for an hour (size and interval): only
    a flush makes it cut."""
    return subprocess.Popen(
        [
            *RLOG, "archive", "run", "-e", endpoint, "--bucket", bucket, "--prefix", prefix,
            "--poll-interval", "0.1", "--segment-bytes", str(1 << 30), "--flush-interval",
            "3600", *extra,
        ],
        env=s3.env(),
        stdout=subprocess.DEVNULL,
        stderr=open(log, "ab"),
    )  # fmt: skip


def stop(archive: subprocess.Popen[bytes], log: Path) -> None:
    archive.send_signal(signal.SIGTERM)
    assert archive.wait(timeout=60) == 0, log.read_text()[-3000:]


def append(cluster: DevCluster, n: int, tag: str) -> None:
    with cluster.client() as client:
        client.append([f"{tag}-{i}".encode().ljust(VALUE, b"x") for i in range(n)])


def polls_pass(port: int, n: int) -> None:
    """Wait until the archiver has finished at least `n` more rounds of polling."""
    start = metric(port, "rlog_archive_polls_total")
    wait_for(lambda: metric(port, "rlog_archive_polls_total") >= start + n + 1, 60, "polls")


def tls_context(pki: DevPki, name: str | None, ca: str | None = None) -> ssl.SSLContext:
    """A caller's context: it trusts the log's CA (the archiver's certificate is a dev
    client's, without this host's name), presenting `name`'s certificate (None: none)."""
    context = ssl.create_default_context(cafile=ca or str(pki.ca))
    context.check_hostname = False
    if name is not None:
        context.load_cert_chain(str(pki.cert(name)), str(pki.key(name)))
    return context


def test_only_the_operator_may_flush(s3, tmp_path):
    """A TLS log: the flush is refused on the metrics port, without a certificate (401),
    with the admin's (403) and the client CA's (handshake), with an `rlog-operator`
    certificate of another CA (handshake) and in plain HTTP; after all of them and several
    polls, the archive is as it was. The operator's certificate then flushes (202)."""
    bucket, log = s3.new_bucket(), tmp_path / "archiver.log"
    with DevCluster(1, tmp_path / "one", tls=True) as cluster:
        pki = DevPki(cluster.tls_dir)
        pki.issue_peer("rlog-operator")  # as the operator's own: of the peer CA
        # The archiver's certificate: role read for the log, and its server name (as the
        # operator issues `<log>-tls-archiver` with its Service's names, from the peer CA).
        own = issue(pki.load_peer_ca(), "reader", ["localhost"])
        own.write(tmp_path / "archiver.crt", tmp_path / "archiver.key")
        append(cluster, 40, "t")
        metrics_port, control_port = free_port(), free_port()
        archive = start_archiver(
            s3, cluster.endpoint, bucket, "t", "--ca", str(pki.ca), "--cert",
            str(tmp_path / "archiver.crt"), "--key", str(tmp_path / "archiver.key"),
            "--metrics-port", str(metrics_port), "--control-port", str(control_port), log=log,
        )  # fmt: skip
        try:
            wait_for(lambda: metrics_up(metrics_port), 60, "the archiver's metrics")
            before = manifest(s3, bucket, "t")
            assert before["archived_through"] is None
            url = f"https://127.0.0.1:{control_port}/flush?through=1"

            status, body = post(f"http://127.0.0.1:{metrics_port}/flush?through=1")
            assert status == 403 and "control port" in body["error"], body
            status, body = post(url, tls_context(pki, None))
            assert status == 401 and "client certificate" in body["error"], body
            status, body = post(url, tls_context(pki, "admin"))  # of the peer CA too
            assert status == 403 and repr("admin") in body["error"], body
            for name in ("reader", "writer"):  # the client CA's: refused in the handshake
                with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                    post(url, tls_context(pki, name))
            foreign = tmp_path / "foreign"
            foreign.mkdir()
            other_ca = new_ca("another CA")
            fake = issue(other_ca, "rlog-operator")
            fake.write(foreign / "op.crt", foreign / "op.key")
            context = tls_context(pki, None)
            context.load_cert_chain(str(foreign / "op.crt"), str(foreign / "op.key"))
            with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
                post(url, context)
            with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
                post(f"http://127.0.0.1:{control_port}/flush?through=1")
            assert metric(metrics_port, "rlog_archive_control_refused_total") == 6
            polls_pass(metrics_port, 3)
            assert manifest(s3, bucket, "t") == before  # nothing was cut, nothing written

            # The operator's own call (archive_http.post): its certificate, the archiver's
            # checked against the log's CA and the name dialled.
            from rlog.client import Credentials
            from rlog_operator.archive_http import post as operator_post

            operator = Credentials.from_files(
                pki.ca, pki.cert("rlog-operator"), pki.key("rlog-operator")
            )
            learned = cluster.status(0).learned
            with pytest.raises(urllib.error.URLError) as wrong_name:  # not a name it carries
                operator_post(f"https://127.0.0.1:{control_port}/flush?through=1", operator)
            assert isinstance(wrong_name.value.reason, ssl.SSLCertVerificationError)
            operator_post(f"https://localhost:{control_port}/flush?through={learned}", operator)
            wait_for(lambda: covered(s3, bucket, "t") >= learned, 60, "the operator's flush")
        finally:
            stop(archive, log)


def test_a_huge_flush_cuts_once_and_garbage_is_refused(s3, tmp_path):
    """A plaintext log: the control port listens on 127.0.0.1 only; malformed positions
    get a 400 saying why; `through` far past the log is taken as its learned end: one cut,
    then, under a steady stream of appends and many polls, no other manifest write."""
    bucket, log = s3.new_bucket(), tmp_path / "archiver.log"
    with DevCluster(1, tmp_path / "one") as cluster:
        append(cluster, 40, "h")
        metrics_port, control_port = free_port(), free_port()
        archive = start_archiver(
            s3, cluster.endpoint, bucket, "h", "--metrics-port", str(metrics_port),
            "--control-port", str(control_port), log=log,
        )  # fmt: skip
        base = f"http://127.0.0.1:{control_port}"
        try:
            wait_for(lambda: metrics_up(metrics_port), 60, "the archiver's metrics")
            with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
                post(f"http://127.0.0.2:{control_port}/flush?through=1")  # not loopback's .1
            for query, words in (
                ("", "missing ?through=POSITION"),
                ("?through=abc", "'abc' is not a position"),
                ("?through=-3", "'-3' is not a position"),
                ("?through=1e9", "'1e9' is not a position"),
                ("?through=%D9%A3", "is not a position"),  # an Arabic-Indic digit
                ("?through=" + "9" * 21, "at most 20"),
                ("?through=1&through=2", "once"),
            ):
                status, body = post(f"{base}/flush{query}")
                assert (status, words in body["error"]) == (400, True), (query, body)
            assert covered(s3, bucket, "h") == -1

            done = threading.Event()

            def writer() -> None:
                with cluster.client() as client:
                    while not done.is_set():
                        client.append([b"s".ljust(VALUE, b"x")] * 4)

            thread = threading.Thread(target=writer, daemon=True)
            thread.start()
            try:
                learned = cluster.status(0).learned
                status, body = post(f"{base}/flush?through={10**19}")
                assert status == 202, body
                wait_for(lambda: covered(s3, bucket, "h") >= learned, 60, "the huge flush")
                after = manifest(s3, bucket, "h")
                polls_pass(metrics_port, 5)
                assert manifest(s3, bucket, "h") == after  # written once, not on every poll
                assert metric(metrics_port, "rlog_archive_log_learned_position") > covered(
                    s3, bucket, "h"
                ), "the log moved on while the archiver polled"
                assert len(after["segments"]) == 1
            finally:
                done.set()
                thread.join(timeout=60)
        finally:
            stop(archive, log)


class SteppedClock:
    """A clock the test moves by hand."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __call__(self) -> float:
        return self.value


def test_a_forward_clock_step_deletes_nothing(s3, tmp_path):
    """Retention by age (one hour) with the wall clock stepped a year forward: nothing is
    deleted, in the manifest or the bucket. Once the archive's own clock has seen an hour
    pass, the segments older than that which the log no longer holds (truncated) go, and
    only those; deletes go through the delete credentials (refused ones leave the objects
    unlisted, not the archiver dead)."""
    from rlog.archive.archiver import Archiver, ArchiverConfig, Retention
    from rlog.archive.store import ObjectStore, StoreConfig
    from rlog.client import AsyncClient

    bucket, prefix = s3.new_bucket(), "c"
    wall, monotonic = SteppedClock(1.7e9), SteppedClock(1000.0)

    def store(access: str, secret: str) -> ObjectStore:
        return ObjectStore(
            StoreConfig(bucket, prefix, s3.endpoint, access_key=access, secret_key=secret)
        )

    async def scenario(cluster: DevCluster) -> None:
        writer, deleter = store(s3.access_key, s3.secret_key), store("nobody", "wrong-secret")
        async with AsyncClient(cluster.endpoint) as client:
            archiver = Archiver(
                client,
                writer,
                ArchiverConfig(retention=Retention(max_age=3600)),
                deleter=deleter,
                wall=wall,
                monotonic=monotonic,
            )

            async def cut(tag: str) -> list[str]:
                await client.append([f"{tag}-{i}".encode() for i in range(10)])
                monotonic.value += 60
                m = await archiver.archive_now()
                return [s.key for s in m.segments]

            for i in range(3):
                await cut(f"a{i}")
            first_three = await cut("a3")
            assert len(first_three) == 4
            await client.truncate(archiver.archived_through + 1)  # the log holds none of them

            wall.value += 365 * 86400  # the wall clock jumps a year ahead
            keys = await cut("b")
            assert keys[:4] == first_three and len(keys) == 5
            assert s3.keys(bucket, f"{prefix}/segments/") == {f"{prefix}/{k}" for k in keys}

            monotonic.value += 3600  # the archive has now really run an hour longer
            keys = await cut("c")  # the deleter is refused: listed no more, objects stay
            assert len(keys) == 2 and not set(first_three) & set(keys)
            assert {f"{prefix}/{k}" for k in first_three} <= s3.keys(bucket, f"{prefix}/segments/")

            archiver.deleter = store(s3.access_key, s3.secret_key)
            await archiver.open()  # the next start deletes what is no longer listed
            assert s3.keys(bucket, f"{prefix}/segments/") == {f"{prefix}/{k}" for k in keys}
            writer.close()

    with DevCluster(1, tmp_path / "one") as cluster:
        asyncio.run(scenario(cluster))


def test_the_writing_key_cannot_delete_and_the_delete_key_does(s3, tmp_path):
    """Credentials split for real by a bucket policy: the writing user may put, get and list,
    never delete; the deleting user may delete. Retention with the writing credentials only:
    the manifest drops the old segments, S3 refuses to delete their objects, the archiver
    goes on; with the delete credentials the next start deletes them. Half a pair of delete
    credentials is refused."""
    import uuid

    bucket, tag = s3.new_bucket(), uuid.uuid4().hex[:8]
    writer, deleter = (f"writer{tag}", f"writer{tag}secret"), (f"deleter{tag}", f"del{tag}secret")
    s3.create_user(*writer)
    s3.create_user(*deleter)
    s3.allow(
        bucket,
        {
            writer[0]: ["s3:PutObject", "s3:GetObject", "s3:ListBucket"],
            deleter[0]: ["s3:DeleteObject", "s3:GetObject", "s3:ListBucket"],
        },
    )
    as_writer = {**s3.env(), "AWS_ACCESS_KEY_ID": writer[0], "AWS_SECRET_ACCESS_KEY": writer[1]}
    with_deleter = {
        **as_writer,
        "RLOG_ARCHIVE_DELETE_ACCESS_KEY_ID": deleter[0],
        "RLOG_ARCHIVE_DELETE_SECRET_ACCESS_KEY": deleter[1],
    }

    with DevCluster(1, tmp_path / "one") as cluster:

        def once(env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [*RLOG, "archive", "run", "--once", "-e", cluster.endpoint, "--bucket", bucket,
                 "--prefix", "w", *extra],
                env=env, capture_output=True, text=True, timeout=120,
            )  # fmt: skip

        for i in range(4):
            append(cluster, 10, f"d{i}")
            done = once(as_writer)
            assert done.returncode == 0, done.stderr
        before = [s["key"] for s in manifest(s3, bucket, "w")["segments"]]
        assert len(before) == 4
        keep_from = manifest(s3, bucket, "w")["segments"][2]["first"]

        append(cluster, 10, "e")
        done = once(as_writer, "--retention-keep-from", str(keep_from))
        assert done.returncode == 0, done.stderr
        assert "AccessDenied" in done.stderr and "cannot delete" in done.stderr
        listed = [s["key"] for s in manifest(s3, bucket, "w")["segments"]]
        assert listed[0] == before[2] and len(listed) == 3
        kept = s3.keys(bucket, "w/segments/")
        assert {f"w/{k}" for k in before[:2]} <= kept  # the writing key deleted nothing

        half = {**as_writer, "RLOG_ARCHIVE_DELETE_ACCESS_KEY_ID": deleter[0]}
        done = once(half)
        assert done.returncode != 0 and "need both" in done.stderr

        done = once(with_deleter)  # its start deletes what the manifest no longer lists
        assert done.returncode == 0, done.stderr
        assert s3.keys(bucket, "w/segments/") == {f"w/{k}" for k in listed}
