"""The archiver's HTTP endpoint (docs/backup.md): its Prometheus metrics, and "archive now".

    GET  /metrics             the rlog_archive_* metrics (what the operator and Prometheus read)
    POST /flush?through=P     cut segments now until the archive covers position P (202);
                              answers at once with the position archived so far (JSON)

The operator posts /flush for `kubectl rlog backup` (annotation rlog.io/backup) with the
leader's learned position, then watches `rlog_archive_archived_position` reach it. A flush
is a request, not a promise: an archiver restarted meanwhile forgets it, and the operator
posts it again. The server is the standard library's WSGI server in a thread (as
prometheus_client's own is); a flush crosses to the archiver's event loop.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app

from rlog.archive.archiver import Archiver

StartResponse = Callable[..., Any]


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not news


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


def _json(start: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def flush_position(query: str) -> int:
    """The `through` parameter of a flush: a position (ValueError with the reason)."""
    values = parse_qs(query, keep_blank_values=True).get("through")
    if not values:
        raise ValueError("missing ?through=POSITION")
    text = values[-1]
    if not text.isdigit():
        raise ValueError(f"through={text!r} is not a position (0, 1, 2, ...)")
    return int(text)


def application(
    archiver: Archiver, loop: asyncio.AbstractEventLoop, timeout: float = 5.0
) -> Callable[[dict[str, Any], StartResponse], Iterable[bytes]]:
    metrics = make_wsgi_app(REGISTRY)

    async def request(through: int) -> int:
        return archiver.request_flush(through)

    def app(environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        if path == "/flush":
            if method != "POST":
                return _json(start, "405 Method Not Allowed", {"error": "POST /flush"})
            try:
                through = flush_position(environ.get("QUERY_STRING", ""))
            except ValueError as e:
                return _json(start, "400 Bad Request", {"error": str(e)})
            try:
                archived = asyncio.run_coroutine_threadsafe(request(through), loop).result(timeout)
            except Exception as e:  # the loop is gone or stuck: the caller retries
                return _json(start, "503 Service Unavailable", {"error": f"{type(e).__name__}"})
            return _json(start, "202 Accepted", {"through": through, "archivedPosition": archived})
        result: Iterable[bytes] = metrics(environ, start)
        return result

    return app


def serve(archiver: Archiver, loop: asyncio.AbstractEventLoop, port: int, host: str = "") -> Any:
    """Serve the endpoint on `port` in a daemon thread; returns the server (`shutdown()`)."""
    server = make_server(
        host,
        port,
        application(archiver, loop),
        server_class=_ThreadingServer,
        handler_class=_Quiet,
    )
    threading.Thread(target=server.serve_forever, name="archive-http", daemon=True).start()
    return server
