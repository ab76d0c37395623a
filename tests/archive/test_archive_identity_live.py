"""The archive with no keys, only a workload identity (rlog.archive.credentials): `rlog
archive run` and `rlog restore` get short-lived keys from a container credentials endpoint
(the protocol of EKS Pod Identity and ECS) and sign a real S3 server's requests with them.

The endpoint is this module's own HTTP server on loopback, standing in for the node's
identity agent (which only a cloud runs): it answers only the bearer of the pod's token,
with keys and an expiry, as the agent does. The S3 server (versitygw) is real and checks
every signature, so the keys served are the keys used. Also: a refusing agent, wrong keys
served, half a key pair and a web identity without a role are clear errors."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("minio")

from s3server import S3Server

from rlog.client import Client
from rlog.tools.dev import DevCluster

RLOG = [sys.executable, "-m", "rlog.tools.cli"]
TOKEN = "pod-identity-token-7f3a"


@dataclass
class Agent:
    """Serves `keys` to requests whose Authorization is the pod's token; counts both."""

    keys: tuple[str, str]
    served: int = 0
    refused: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, authorization: str | None) -> tuple[int, dict[str, str]]:
        with self.lock:
            if authorization != TOKEN:
                self.refused += 1
                return 403, {"Code": "AccessDenied", "Message": "not this pod's token"}
            self.served += 1
        expiry = datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)
        return 200, {
            "AccessKeyId": self.keys[0],
            "SecretAccessKey": self.keys[1],
            "Token": "",
            "Expiration": expiry.strftime("%Y-%m-%dT%H:%M:%SZ"),
        }


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    server = S3Server.start(tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture
def agent(s3: S3Server) -> Iterator[tuple[Agent, str]]:
    """The identity agent on a free loopback port: (its state, its credentials URI)."""
    state = Agent((s3.access_key, s3.secret_key))

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = state.answer(self.headers.get("Authorization"))
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_port}/v1/credentials"
    finally:
        server.shutdown()
        server.server_close()


def identity_env(s3: S3Server, uri: str, token_file: Path, **extra: str) -> dict[str, str]:
    """A pod's environment with an identity and no keys (nor ~/.aws)."""
    env = {k: v for k, v in s3.env().items() if not k.startswith("AWS_")}
    token_file.write_text(TOKEN)
    return {
        **env,
        "HOME": str(token_file.parent),
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": uri,
        "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": str(token_file),
        **extra,
    }


def rlog(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*RLOG, *args], env=env, capture_output=True, text=True, timeout=240)


def test_archive_and_restore_with_the_pods_identity(s3, agent, tmp_path):
    state, uri = agent
    env = identity_env(s3, uri, tmp_path / "token")
    bucket = s3.new_bucket()
    values = [b"identity-%d" % i for i in range(200)]
    with DevCluster(1, tmp_path / "log") as cluster:
        with Client(cluster.endpoint) as client:
            positions = client.append(values)
        archived = rlog(env, "archive", "run", "--once", "-e", cluster.endpoint,
                        "--bucket", bucket, "--prefix", "p")  # fmt: skip
        assert archived.returncode == 0, archived.stderr
    served = state.served
    assert served >= 1 and state.refused == 0
    # written for real, under the keys the agent served (the server checks each signature)
    manifest = json.loads(s3.get(bucket, "p/manifest.json") or b"{}")
    assert manifest["archived_through"] >= positions[-1]

    restored = DevCluster(1, tmp_path / "restored", initialize=False, log_id="restored")
    restored.prepare()
    done = rlog(env, "restore", "--bucket", bucket, "--prefix", "p", "--json",
                "--data-dir", str(restored.data_dirs[0]))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["restored"] is True
    assert state.served > served  # a new process asked the agent again
    with restored, Client(restored.endpoint) as client:
        got = {e.position: e.value for e in client.read()}
    assert [got[p] for p in positions] == values


def test_identity_failures_are_clear_errors(s3, agent, tmp_path):
    state, uri = agent
    bucket = s3.new_bucket()
    listing = ["archive", "list", "--bucket", bucket, "--prefix", "p"]

    # the agent refuses a pod whose token is not its own
    env = identity_env(s3, uri, tmp_path / "token")
    (tmp_path / "token").write_text("another-pods-token")
    refused = rlog(env, *listing)
    assert refused.returncode == 1 and state.refused >= 1
    assert "cannot get S3 credentials from the container credentials endpoint" in refused.stderr
    assert "Traceback" not in refused.stderr

    # keys that S3 does not take: the store's own refusal, as for a wrong Secret
    state.keys = (s3.access_key, "not-the-secret")
    env = identity_env(s3, uri, tmp_path / "token")
    wrong = rlog(env, *listing)
    assert wrong.returncode == 1 and "refused the credentials" in wrong.stderr, wrong.stderr

    # an agent that is not there
    env = identity_env(s3, "http://127.0.0.1:9/v1/credentials", tmp_path / "token")
    gone = rlog(env, *listing)
    assert gone.returncode == 1, gone.stderr
    assert "cannot get S3 credentials from the container credentials endpoint" in gone.stderr

    # half a key pair is an error, not a silent fall-through to the identity
    env = identity_env(s3, uri, tmp_path / "token", AWS_ACCESS_KEY_ID=s3.access_key)
    half = rlog(env, *listing)
    assert half.returncode == 1 and "the secret key is missing" in half.stderr, half.stderr

    # a web identity needs the role it is exchanged for
    plain = {k: v for k, v in s3.env().items() if not k.startswith("AWS_")}
    web = rlog({**plain, "AWS_WEB_IDENTITY_TOKEN_FILE": str(tmp_path / "token")}, *listing)
    assert web.returncode == 1 and "AWS_ROLE_ARN is not" in web.stderr, web.stderr

    # nothing at all names both ways
    nothing = rlog({**plain, "HOME": str(tmp_path)}, *listing)
    assert nothing.returncode == 1 and "workload identity" in nothing.stderr, nothing.stderr
    assert os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI") is None  # (tests' own env)
