"""The client commands' security arguments (--ca/--cert/--key/--token-file/--server-name,
or the RLOG_* variables) and the credentials they give (rlog.client.security)."""

from __future__ import annotations

import argparse
import os

from rlog.client.security import ENV_TOKEN, Credentials, CredentialsError
from rlog.config import ConfigError


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    security = parser.add_argument_group(
        "security (docs/security.md; none given: plaintext, as the replicas must then serve)"
    )
    security.add_argument(
        "--ca",
        default=os.environ.get("RLOG_CA"),
        metavar="FILE",
        help="connect with TLS, verifying the replicas against this CA (default $RLOG_CA)",
    )
    security.add_argument(
        "--cert",
        default=os.environ.get("RLOG_CERT"),
        metavar="FILE",
        help="client certificate, for mutual TLS (default $RLOG_CERT)",
    )
    security.add_argument(
        "--key",
        default=os.environ.get("RLOG_KEY"),
        metavar="FILE",
        help="the client certificate's key (default $RLOG_KEY)",
    )
    security.add_argument(
        "--token-file",
        default=os.environ.get("RLOG_TOKEN_FILE"),
        metavar="FILE",
        help="send the bearer token in FILE (default $RLOG_TOKEN_FILE; or set $RLOG_TOKEN "
        "to the token itself: a token never goes on a command line)",
    )
    security.add_argument(
        "--server-name",
        metavar="NAME",
        help="check the replicas' certificates for NAME (a port-forward, an IP address)",
    )


def credentials_of(args: argparse.Namespace) -> Credentials | None:
    """The client credentials the arguments (or RLOG_* variables) give; None: plaintext."""
    token = os.environ.get(ENV_TOKEN) or None
    given = (args.ca, args.cert, args.key, args.token_file, token, args.server_name)
    if not any(given):
        return None
    try:
        return Credentials.from_files(
            args.ca,
            args.cert,
            args.key,
            None if args.token_file else token,
            args.token_file,
            args.server_name,
        )
    except CredentialsError as exc:
        raise ConfigError(str(exc)) from None
