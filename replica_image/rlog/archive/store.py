"""The object store an archive lives in: an S3 bucket and a key prefix, reached with the
MinIO Python SDK (a plain S3 client for any S3-compatible server; boto3 was the first choice,
but its botocore pins python-dateutil below 3 while the operator's kubernetes client needs
3 or later, so the two cannot be installed together).

The SDK blocks, so every call runs in a worker thread (`asyncio.to_thread`): the archiver's
event loop keeps following the log meanwhile. S3 errors become `ArchiveError`s whose
message says what to fix (a wrong bucket, missing or refused credentials, an unreachable
endpoint), never an SDK traceback.
"""

from __future__ import annotations

import asyncio
import io
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlsplit

from rlog.archive.credentials import HOW_TO_GIVE, Credentials, choose, provider
from rlog.archive.format import ArchiveError

if TYPE_CHECKING:
    from minio.credentials.providers import Provider

T = TypeVar("T")

AWS_ENDPOINT = "https://s3.amazonaws.com"
_REFUSED = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "InvalidToken"}


@dataclass(frozen=True)
class StoreConfig:
    bucket: str
    prefix: str = ""
    endpoint: str | None = None  # e.g. http://127.0.0.1:7070; None: AWS
    region: str = "us-east-1"
    # None: $AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY, else the pod's workload identity
    # (rlog.archive.credentials)
    access_key: str | None = None
    secret_key: str | None = None


def _prefix(prefix: str) -> str:
    prefix = prefix.strip("/")
    return f"{prefix}/" if prefix else ""


class _Missing(Exception):
    """No such key (a plain absence, not an error of the store)."""


class ObjectStore:
    """Whole-object get, put, list and delete under `config.prefix`."""

    def __init__(self, config: StoreConfig) -> None:
        try:
            import urllib3
            from minio import Minio
        except ImportError:
            raise ArchiveError(
                "archiving needs the minio package: pip install 'rlog-paxos[archive]'"
            ) from None
        self.config = config
        self.prefix = _prefix(config.prefix)
        self.endpoint = config.endpoint or AWS_ENDPOINT
        url = urlsplit(self.endpoint if "://" in self.endpoint else f"https://{self.endpoint}")
        if url.scheme not in ("http", "https") or not url.netloc:
            raise ArchiveError(f"the S3 endpoint {self.endpoint!r} is not an http(s) URL")
        try:
            self._credentials: Credentials | None = choose(
                config.access_key, config.secret_key, os.environ
            )
            self._credential_error = ""
        except ArchiveError as exc:  # raised at the first call, as for no credentials at all
            self._credentials, self._credential_error = None, str(exc)
        timeout = urllib3.Timeout(connect=5.0, read=60.0)
        self._http = urllib3.PoolManager(
            timeout=timeout,
            retries=urllib3.Retry(
                total=3, backoff_factor=0.2, status_forcelist=[500, 502, 503, 504]
            ),
            maxsize=8,
        )
        keys = self._credentials if self._credentials else Credentials("none")
        self._identity = provider(
            keys, urllib3.PoolManager(timeout=timeout, retries=urllib3.Retry(total=2))
        )
        self._client = Minio(
            url.netloc,
            access_key=keys.access_key,
            secret_key=keys.secret_key,
            credentials=self._identity,
            secure=url.scheme == "https",
            region=config.region,
            http_client=self._http,
        )

    def where(self, key: str = "") -> str:
        return f"s3://{self.config.bucket}/{self.prefix}{key}"

    async def _call(self, what: str, key: str, fn: Callable[[], T]) -> T:
        if self._credentials is None:
            raise ArchiveError(f"cannot {what} {self.where(key)}: {self._credential_error}")
        if self._credentials.source == "none":
            raise ArchiveError(f"no S3 credentials to {what} {self.where(key)}: {HOW_TO_GIVE}")
        if self._identity is not None:
            await self._identity_keys(what, key, self._identity)
        try:
            return await asyncio.to_thread(fn)
        except _Missing:
            raise
        except Exception as exc:
            raise self._explain(exc, what, key) from None

    async def _identity_keys(self, what: str, key: str, identity: Provider) -> None:
        """The workload identity's keys (cached by the provider until they expire), fetched
        first so that a failure names the identity, not the S3 endpoint."""
        assert self._credentials is not None
        try:
            await asyncio.to_thread(identity.retrieve)
        except Exception as exc:
            raise ArchiveError(
                f"cannot get S3 credentials from {self._credentials.describe()} to {what} "
                f"{self.where(key)}: {type(exc).__name__}: {exc}"
            ) from None

    def _explain(self, exc: Exception, what: str, key: str) -> Exception:
        from minio.error import S3Error
        from urllib3.exceptions import HTTPError

        target = self.where(key)
        if isinstance(exc, S3Error):
            if exc.code == "NoSuchKey":
                return _Missing(key)
            if exc.code == "NoSuchBucket":
                return self._no_bucket()
            if exc.code in _REFUSED:
                return ArchiveError(
                    f"S3 refused the credentials to {what} {target} ({exc.code}): check the "
                    "access key and secret"
                )
            return ArchiveError(f"S3 failed to {what} {target}: {exc.code}: {exc.message}")
        if isinstance(exc, HTTPError | OSError):
            return ArchiveError(
                f"cannot reach the S3 endpoint {self.endpoint} to {what} {target}: {exc}"
            )
        if isinstance(exc, ArchiveError):
            return exc
        if isinstance(exc, ValueError):  # the SDK's own checks, e.g. of the bucket's name
            return ArchiveError(f"cannot {what} {target}: {exc}")
        return ArchiveError(f"S3 failed to {what} {target}: {type(exc).__name__}: {exc}")

    def _no_bucket(self) -> ArchiveError:
        return ArchiveError(
            f"the bucket {self.config.bucket!r} does not exist at {self.endpoint} (create it, "
            "or fix --bucket)"
        )

    async def get(self, key: str) -> bytes | None:
        """The object's bytes, or None if there is no such object."""

        def read() -> bytes:
            answer = self._client.get_object(self.config.bucket, self.prefix + key)
            try:
                return bytes(answer.read())
            finally:
                answer.close()
                answer.release_conn()

        try:
            return await self._call("read", key, read)
        except _Missing:
            return None

    async def put(self, key: str, body: bytes, sha256_hex: str | None = None) -> None:
        metadata: dict[str, Any] = {"sha256": sha256_hex} if sha256_hex else {}
        await self._call(
            "write",
            key,
            lambda: self._client.put_object(
                self.config.bucket, self.prefix + key, io.BytesIO(body), len(body),
                metadata=metadata,
            ),
        )  # fmt: skip

    async def delete(self, key: str) -> None:
        await self._call(
            "delete", key, lambda: self._client.remove_object(self.config.bucket, self.prefix + key)
        )

    async def list(self, under: str) -> list[str]:
        """Every key under `under` (relative to the prefix)."""

        def names() -> list[str]:
            found = self._client.list_objects(
                self.config.bucket, prefix=self.prefix + under, recursive=True
            )
            return [str(o.object_name)[len(self.prefix) :] for o in found]

        return await self._call("list", under, names)

    async def check_bucket(self) -> None:
        """Raise a clear ArchiveError unless the bucket exists and the credentials work."""
        if not await self._call("open", "", lambda: self._client.bucket_exists(self.config.bucket)):
            raise self._no_bucket()

    async def create_bucket(self) -> None:
        """Create the bucket if it does not exist (tests and local setups)."""
        if not await self._call("open", "", lambda: self._client.bucket_exists(self.config.bucket)):
            await self._call("create", "", lambda: self._client.make_bucket(self.config.bucket))

    def close(self) -> None:
        self._http.clear()
