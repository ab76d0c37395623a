"""The client API: `Client` (blocking, in `blocking`) and `AsyncClient` (asyncio, in
`async_client`), the typed errors they raise in `errors`.

    from rlog.client import Client
"""

from rlog.client.async_client import DEFAULT_APPEND_TIMEOUT, DEFAULT_TIMEOUT, AsyncClient
from rlog.client.blocking import Client
from rlog.client.security import Credentials, CredentialsError
from rlog.client.status import status_name, status_to_dict
from rlog.client.values import Entry, Value, batched, encode_value, parse_endpoints

__all__ = [
    "DEFAULT_APPEND_TIMEOUT",
    "DEFAULT_TIMEOUT",
    "AsyncClient",
    "Client",
    "Credentials",
    "CredentialsError",
    "Entry",
    "Value",
    "batched",
    "encode_value",
    "parse_endpoints",
    "status_name",
    "status_to_dict",
]
