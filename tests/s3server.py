"""A real S3-compatible server for the archive tests: versitygw, built from the Go module
proxy and started on loopback by e2e/s3/s3.sh (no mocks). Not skipped when it cannot be
built: the tests that need it fail with the script's message."""

from __future__ import annotations

import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "e2e" / "s3" / "s3.sh"
ACCESS_KEY = "rlogtest"
SECRET_KEY = "rlogtestsecret"


@dataclass
class S3Server:
    dir: Path
    endpoint: str
    access_key: str = ACCESS_KEY
    secret_key: str = SECRET_KEY

    @staticmethod
    def start(dir: Path) -> S3Server:
        env = {**os.environ, "RLOG_S3_ACCESS_KEY": ACCESS_KEY, "RLOG_S3_SECRET_KEY": SECRET_KEY}
        done = subprocess.run(
            [str(SCRIPT), "start", str(dir)], env=env, capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            raise RuntimeError(f"e2e/s3/s3.sh start failed: {done.stderr[-2000:]}")
        return S3Server(dir, done.stdout.strip().splitlines()[-1])

    def stop(self) -> None:
        subprocess.run([str(SCRIPT), "stop", str(self.dir)], capture_output=True, timeout=60)

    def env(self) -> dict[str, str]:
        """The environment of an `rlog archive`/`rlog restore` process using this server."""
        return {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "RLOG_ARCHIVE_ENDPOINT": self.endpoint,
        }

    def client(self):  # a MinIO SDK client, for the tests' own checks and setup
        from minio import Minio

        return Minio(
            self.endpoint.removeprefix("http://"),
            access_key=self.access_key,
            secret_key=self.secret_key,
            secure=False,
        )

    def new_bucket(self) -> str:
        name = f"rlog-{uuid.uuid4().hex[:12]}"
        self.client().make_bucket(name)
        return name

    def get(self, bucket: str, key: str) -> bytes | None:
        from minio.error import S3Error

        try:
            answer = self.client().get_object(bucket, key)
        except S3Error as exc:
            if exc.code == "NoSuchKey":
                return None
            raise
        try:
            return bytes(answer.read())
        finally:
            answer.close()
            answer.release_conn()

    def put(self, bucket: str, key: str, body: bytes) -> None:
        import io

        self.client().put_object(bucket, key, io.BytesIO(body), len(body))

    def create_user(self, access_key: str, secret_key: str) -> None:
        """A user with no rights of its own (role user): a bucket policy grants them."""
        binary = subprocess.run(
            [str(SCRIPT), "build"], capture_output=True, text=True, timeout=900, check=True
        ).stdout.strip()
        done = subprocess.run(
            [
                binary, "admin", "--access", self.access_key, "--secret", self.secret_key,
                "--endpoint-url", self.endpoint, "create-user", "--access", access_key,
                "--secret", secret_key, "--role", "user",
            ],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"versitygw admin create-user failed: {done.stderr[-2000:]}")

    def allow(self, bucket: str, rights: dict[str, list[str]]) -> None:
        """Set the bucket's policy: each user (access key) may do these S3 actions on the
        bucket and its objects, nothing else."""
        import json

        statements = [
            {
                "Effect": "Allow",
                "Principal": {"AWS": [user]},
                "Action": actions,
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            }
            for user, actions in rights.items()
        ]
        policy = {"Version": "2012-10-17", "Statement": statements}
        self.client().set_bucket_policy(bucket, json.dumps(policy))

    def keys(self, bucket: str, prefix: str) -> set[str]:
        objects = self.client().list_objects(bucket, prefix=prefix, recursive=True)
        return {str(o.object_name) for o in objects}
