"""The object store an archive lives in: an S3 bucket and a key prefix, reached with boto3.

boto3 blocks, so every call runs in a worker thread (`asyncio.to_thread`): the archiver's
event loop keeps following the log meanwhile. S3 errors become `ArchiveError`s whose
message says what to fix (a wrong bucket, missing or refused credentials, an unreachable
endpoint), never a botocore traceback.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from typing import Any

from rlog.archive.format import ArchiveError


@dataclass(frozen=True)
class StoreConfig:
    bucket: str
    prefix: str = ""
    endpoint: str | None = None  # e.g. http://127.0.0.1:7070; None: AWS
    region: str = "us-east-1"
    access_key: str | None = None  # None: the environment ($AWS_ACCESS_KEY_ID, ...)
    secret_key: str | None = None

    @property
    def where(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def _prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


class ObjectStore:
    """Whole-object get, put, list and delete under `config.prefix`."""

    def __init__(self, config: StoreConfig) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise ArchiveError("archiving needs boto3: pip install 'rlog[archive]'") from None
        # Credentials come from the usual AWS variables (or a profile); never from the EC2
        # instance metadata service, whose lookups stall for seconds off EC2.
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
        self.config = config
        self.prefix = _prefix(config.prefix)
        session = boto3.session.Session(
            aws_access_key_id=config.access_key,
            aws_secret_access_key=config.secret_key,
            region_name=config.region,
        )
        self._client = session.client(
            "s3",
            endpoint_url=config.endpoint,
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 3, "mode": "standard"},
                connect_timeout=5,
                read_timeout=60,
                # Payload checksums are the archive's own (sha256 in the manifest); the
                # newer default CRC32 trailers are not understood by every S3 server.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    def where(self, key: str = "") -> str:
        return f"s3://{self.config.bucket}/{self.prefix}{key}"

    async def _call(self, what: str, key: str, method: str, **kwargs: Any) -> Any:
        call = getattr(self._client, method)
        try:
            return await asyncio.to_thread(call, Bucket=self.config.bucket, **kwargs)
        except Exception as exc:
            raise self._explain(exc, what, key) from None

    def _explain(self, exc: Exception, what: str, key: str) -> Exception:
        from botocore.exceptions import (
            ClientError,
            EndpointConnectionError,
            NoCredentialsError,
            PartialCredentialsError,
        )

        target = self.where(key)
        if isinstance(exc, NoCredentialsError | PartialCredentialsError):
            return ArchiveError(
                f"no S3 credentials to {what} {target}: set AWS_ACCESS_KEY_ID and "
                "AWS_SECRET_ACCESS_KEY (or --access-key-file/--secret-key-file)"
            )
        if isinstance(exc, EndpointConnectionError):
            return ArchiveError(
                f"cannot reach the S3 endpoint {self.config.endpoint or 'AWS'} to {what} "
                f"{target}: {exc}"
            )
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            code = str(error.get("Code", ""))
            if code == "NoSuchBucket":
                return ArchiveError(
                    f"the bucket {self.config.bucket!r} does not exist at "
                    f"{self.config.endpoint or 'AWS'} (create it, or fix --bucket)"
                )
            if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403"):
                return ArchiveError(
                    f"S3 refused the credentials to {what} {target} ({code}): check the "
                    "access key and secret"
                )
            if code in ("NoSuchKey", "404"):
                return KeyError(key)
            return ArchiveError(f"S3 failed to {what} {target}: {code}: {error.get('Message')}")
        if isinstance(exc, ArchiveError):
            return exc
        return ArchiveError(f"S3 failed to {what} {target}: {type(exc).__name__}: {exc}")

    async def get(self, key: str) -> bytes | None:
        """The object's bytes, or None if there is no such object."""
        try:
            answer = await self._call("read", key, "get_object", Key=self.prefix + key)
        except KeyError:
            return None
        return await asyncio.to_thread(answer["Body"].read)

    async def put(self, key: str, body: bytes, sha256_hex: str | None = None) -> None:
        metadata = {"sha256": sha256_hex} if sha256_hex else {}
        await self._call(
            "write", key, "put_object", Key=self.prefix + key, Body=body, Metadata=metadata
        )

    async def delete(self, key: str) -> None:
        await self._call("delete", key, "delete_object", Key=self.prefix + key)

    async def list(self, under: str) -> list[str]:
        """Every key under `under` (relative to the prefix)."""
        keys: list[str] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"Prefix": self.prefix + under}
            if token:
                kwargs["ContinuationToken"] = token
            answer = await self._call("list", under, "list_objects_v2", **kwargs)
            keys += [item["Key"][len(self.prefix) :] for item in answer.get("Contents", [])]
            if not answer.get("IsTruncated"):
                return keys
            token = answer.get("NextContinuationToken")

    async def check_bucket(self) -> None:
        """Raise a clear ArchiveError unless the bucket exists and the credentials work."""
        try:
            await self._call("open", "", "head_bucket")
        except KeyError:
            raise ArchiveError(
                f"the bucket {self.config.bucket!r} does not exist at "
                f"{self.config.endpoint or 'AWS'} (create it, or fix --bucket)"
            ) from None

    async def create_bucket(self) -> None:
        """Create the bucket if it does not exist (tests and local setups)."""
        try:
            await self._call("open", "", "head_bucket")
        except KeyError:
            await self._call("create", "", "create_bucket")

    def close(self) -> None:
        self._client.close()
