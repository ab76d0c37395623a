"""What a client presents to a secured log (docs/security.md): the CA that verifies the
replicas, a client certificate (mutual TLS) and/or a bearer token.

    credentials = Credentials.from_files(ca="ca.pem", cert="me.pem", key="me-key.pem")
    client = Client("rlog-0:7000", credentials=credentials)

The command line and `rlog.spark` read the same from --ca/--cert/--key/--token (or the
environment: RLOG_CA, RLOG_CERT, RLOG_KEY, RLOG_TOKEN, RLOG_TOKEN_FILE).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc

ENV_CA = "RLOG_CA"
ENV_CERT = "RLOG_CERT"
ENV_KEY = "RLOG_KEY"
ENV_TOKEN = "RLOG_TOKEN"
ENV_TOKEN_FILE = "RLOG_TOKEN_FILE"


class CredentialsError(ValueError):
    """The credentials given cannot be used; the message says why, in one line."""


def _read(path: str | Path | None, what: str) -> bytes | None:
    if path is None or path == "":
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CredentialsError(f"{what} {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class Credentials:
    """PEM bytes of the CA, the client certificate and its key, and a bearer token.

    `ca` None with TLS on: the system's trusted roots verify the replicas.
    `server_name`: the name to check the replicas' certificates for, when it differs from
    the host the client dials (a port-forward, an IP address)."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    token: str | None = None
    server_name: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise CredentialsError("a client certificate needs its key: give both or neither")
        if self.token is not None and not self.token.strip():
            raise CredentialsError("the bearer token is empty")

    @classmethod
    def from_files(
        cls,
        ca: str | Path | None = None,
        cert: str | Path | None = None,
        key: str | Path | None = None,
        token: str | None = None,
        token_file: str | Path | None = None,
        server_name: str | None = None,
    ) -> Credentials:
        if token is not None and token_file:
            raise CredentialsError("give a token or a token file, not both")
        if token_file:
            token = (_read(token_file, "token file") or b"").decode().strip()
        return cls(
            _read(ca, "CA file"),
            _read(cert, "certificate file"),
            _read(key, "key file"),
            token or None,
            server_name or None,
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Credentials | None:
        """The credentials the RLOG_* variables name; None if none is set."""
        env = os.environ if environ is None else environ
        if not any(
            env.get(name) for name in (ENV_CA, ENV_CERT, ENV_KEY, ENV_TOKEN, ENV_TOKEN_FILE)
        ):
            return None
        return cls.from_files(
            env.get(ENV_CA),
            env.get(ENV_CERT),
            env.get(ENV_KEY),
            env.get(ENV_TOKEN) or None,
            env.get(ENV_TOKEN_FILE),
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        credentials = grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )
        if self.token is not None:
            credentials = grpc.composite_channel_credentials(
                credentials, grpc.access_token_call_credentials(self.token)
            )
        return credentials

    def channel_options(self) -> list[tuple[str, str]]:
        if self.server_name:
            return [("grpc.ssl_target_name_override", self.server_name)]
        return []


def secure_channel(
    address: str, credentials: Credentials | None, options: list[tuple[str, object]]
) -> grpc.aio.Channel:
    """A grpc.aio channel to `address`: TLS with `credentials`, plaintext without."""
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(
        address, credentials.channel_credentials(), [*options, *credentials.channel_options()]
    )
