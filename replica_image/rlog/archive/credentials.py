"""Where the archive's S3 credentials come from, decided once from the given keys and the
environment (a pure function, `choose`), in this order:

1. **Keys**: `--access-key-file`/`--secret-key-file`, else $AWS_ACCESS_KEY_ID and
   $AWS_SECRET_ACCESS_KEY (a Kubernetes Secret: `spec.backup.credentialsSecret`). Half a
   pair is an error, never a fall-through to another source.
2. **The pod's workload identity**, when its environment names one, for short-lived keys
   the SDK renews before they expire:
   - a web identity token exchanged at STS (EKS's IAM roles for service accounts, or any
     OIDC federation into AWS): $AWS_WEB_IDENTITY_TOKEN_FILE with $AWS_ROLE_ARN, and
     $AWS_ENDPOINT_URL_STS for an STS other than AWS's;
   - a container credentials endpoint (EKS Pod Identity, ECS):
     $AWS_CONTAINER_CREDENTIALS_FULL_URI (with $AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE or
     $AWS_CONTAINER_AUTHORIZATION_TOKEN) or $AWS_CONTAINER_CREDENTIALS_RELATIVE_URI.

Rejected: the node's instance metadata service as a last resort, as the AWS SDKs have it.
Every pod on the node would then write to the archive with the node's rights, and where no
metadata service answers each call would first wait out its timeouts and retries. A node
role stays possible by naming it: a credentials endpoint that serves it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from rlog.archive.format import ArchiveError

if TYPE_CHECKING:
    from minio.credentials.providers import Provider
    from urllib3 import PoolManager

WEB_IDENTITY_TOKEN_FILE = "AWS_WEB_IDENTITY_TOKEN_FILE"
ROLE_ARN = "AWS_ROLE_ARN"
STS_ENDPOINT = "AWS_ENDPOINT_URL_STS"
CONTAINER_FULL_URI = "AWS_CONTAINER_CREDENTIALS_FULL_URI"
CONTAINER_RELATIVE_URI = "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"

HOW_TO_GIVE = (
    "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or --access-key-file/--secret-key-file), "
    f"or run with a workload identity (${WEB_IDENTITY_TOKEN_FILE} with ${ROLE_ARN}, or "
    f"${CONTAINER_FULL_URI})"
)


@dataclass(frozen=True)
class Credentials:
    """What `choose` found: `source` says which; `access_key`/`secret_key` for keys,
    `sts_endpoint` for a web identity whose STS is not AWS's."""

    source: Literal["keys", "web-identity", "container", "none"]
    access_key: str | None = None
    secret_key: str | None = None
    sts_endpoint: str | None = None

    def describe(self) -> str:
        return {
            "keys": "access keys",
            "web-identity": f"the web identity token in ${WEB_IDENTITY_TOKEN_FILE}",
            "container": "the container credentials endpoint",
            "none": "no credentials",
        }[self.source]


def choose(
    access_key: str | None, secret_key: str | None, environ: Mapping[str, str]
) -> Credentials:
    """The credentials the store signs with; `access_key`/`secret_key`: the files' (None:
    not given). Raises ArchiveError for half a pair or a web identity without a role."""
    access = access_key or environ.get("AWS_ACCESS_KEY_ID") or None
    secret = secret_key or environ.get("AWS_SECRET_ACCESS_KEY") or None
    if access and secret:
        return Credentials("keys", access_key=access, secret_key=secret)
    if access or secret:
        missing = "secret key" if access else "access key"
        raise ArchiveError(
            f"an S3 access key needs its secret and a secret its access key: the {missing} "
            "is missing (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or --access-key-file "
            "and --secret-key-file)"
        )
    if environ.get(WEB_IDENTITY_TOKEN_FILE):
        if not environ.get(ROLE_ARN):
            raise ArchiveError(
                f"${WEB_IDENTITY_TOKEN_FILE} is set but ${ROLE_ARN} is not: a web identity "
                "is exchanged at STS for the role it names"
            )
        return Credentials("web-identity", sts_endpoint=environ.get(STS_ENDPOINT) or None)
    if environ.get(CONTAINER_FULL_URI) or environ.get(CONTAINER_RELATIVE_URI):
        return Credentials("container")
    return Credentials("none")


def provider(credentials: Credentials, http_client: PoolManager) -> Provider | None:
    """The MinIO SDK's provider of a workload identity's keys (None for keys or none). It
    reads the same variables `choose` looked at, caches the keys and fetches new ones when
    they expire; `http_client` bounds its calls (the SDK's own has no timeout)."""
    if credentials.source not in ("web-identity", "container"):
        return None
    from minio.credentials.providers import IamAwsProvider

    return IamAwsProvider(custom_endpoint=credentials.sts_endpoint, http_client=http_client)
