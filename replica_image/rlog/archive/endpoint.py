"""The archiver's HTTP endpoints (docs/backup.md): its Prometheus metrics, and "archive now".

Two listeners, because reading gauges and making the archiver write are not the same right:

    metrics port (every interface, plain HTTP; Prometheus, the readiness probe, the operator)
      GET  /metrics           the rlog_archive_* metrics
      POST /flush             403: flushes are taken on the control port only

    control port (`ControlPolicy`)
      POST /flush?through=P   cut segments now until the archive covers position P (202);
                              answers at once with the position archived so far (JSON)

The control port's contract:

* A TLS log (the archiver has its certificate, key and the log's CA, as the operator
  mounts them): HTTPS on every interface with the archiver's own certificate. A caller must
  present a client certificate of the log's CA (another CA's is refused in the handshake)
  whose common name is one of `ControlPolicy.subjects` (the operator's identity,
  `rlog-operator`, unless told otherwise). No certificate: 401; another name: 403. Either
  way nothing is asked of the archiver. The files are read again when they change (the
  operator renews them in place).
* A plaintext log: nobody has an identity to check, so the port listens on loopback only
  (127.0.0.1): a flush comes from inside the archiver's pod (`kubectl exec`, `kubectl
  port-forward`), never over the network. The operator then does not post flushes; a backup
  request completes at the archiver's next periodic cut (spec.backup.flushIntervalSeconds).

`through` is a decimal position of at most 20 digits (else 400, saying why). A position
past the log's learned end is taken as "everything learned now": the archiver clamps it
to the learned end it reads next (`Archiver.step`), so a huge value asks for one cut, not
a cut on every poll. A flush is a request, not a promise: an archiver restarted meanwhile
forgets it, and the operator posts it again. The servers are the standard library's WSGI
server in threads (as prometheus_client's own is); a flush crosses to the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import ssl
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from socketserver import ThreadingMixIn
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import REGISTRY, make_wsgi_app

from rlog.archive import metrics as archive_metrics
from rlog.archive.archiver import Archiver

log = logging.getLogger("rlog.archive")

StartResponse = Callable[..., Any]
App = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

OPERATOR_SUBJECT = "rlog-operator"  # the operator's client identity (its certificate's CN)
LOOPBACK = "127.0.0.1"
MAX_POSITION_DIGITS = 20  # 2**64 - 1 has 20 digits: anything longer is not a position
_PEER_SUBJECT = "rlog.peer_subject"  # the environ key of a TLS caller's common name
_POSITION = re.compile(r"[0-9]+")  # ASCII only: str.isdigit would take "²" or "٣"


@dataclass(frozen=True)
class TlsFiles:
    ca: str
    cert: str
    key: str


@dataclass(frozen=True)
class ControlPolicy:
    """Who may flush (module docstring): `tls` None: loopback only, anyone there."""

    tls: TlsFiles | None = None
    subjects: frozenset[str] = field(default_factory=lambda: frozenset({OPERATOR_SUBJECT}))

    @property
    def host(self) -> str:
        return "" if self.tls else LOOPBACK


class _Quiet(WSGIRequestHandler):
    timeout = 10.0  # a caller that stalls mid-request does not hold a thread for ever

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a scrape every few seconds is not news

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        peer = getattr(self.connection, "getpeercert", None)
        environ[_PEER_SUBJECT] = _common_name(peer() if peer else None)
        return environ


def _common_name(cert: dict[str, Any] | None) -> str | None:
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Contexts:
    """The control port's TLS context, built again when a file changes (a renewal)."""

    def __init__(self, files: TlsFiles) -> None:
        self.files = files
        self._lock = threading.Lock()
        self._stamp: tuple[int, ...] = ()
        self._context: ssl.SSLContext | None = None

    def current(self) -> ssl.SSLContext:
        stamp = tuple(
            os.stat(p).st_mtime_ns for p in (self.files.ca, self.files.cert, self.files.key)
        )
        with self._lock:
            if self._context is None or stamp != self._stamp:
                context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
                context.minimum_version = ssl.TLSVersion.TLSv1_2
                context.load_cert_chain(self.files.cert, self.files.key)
                context.load_verify_locations(self.files.ca)
                # Optional in the handshake so that a caller without a certificate gets a
                # clear 401 instead of a bare handshake failure; one of another CA fails.
                context.verify_mode = ssl.CERT_OPTIONAL
                self._context, self._stamp = context, stamp
            return self._context


class _TlsServer(_ThreadingServer):
    contexts: _Contexts

    def finish_request(self, request: Any, client_address: Any) -> None:
        # In the request's own thread: a slow handshake does not hold the accept loop.
        request.settimeout(_Quiet.timeout)
        try:
            tls = self.contexts.current().wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:
            archive_metrics.CONTROL_REFUSED.inc()
            log.info("control port: refused a connection from %s: %s", client_address[0], exc)
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)  # type: ignore[arg-type]
        finally:
            tls.close()


def _json(start: StartResponse, status: str, body: dict[str, Any]) -> list[bytes]:
    data = json.dumps(body).encode()
    start(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
    return [data]


def flush_position(query: str) -> int:
    """The `through` parameter of a flush: a position (ValueError with the reason)."""
    values = parse_qs(query, keep_blank_values=True).get("through")
    if not values:
        raise ValueError("missing ?through=POSITION")
    if len(values) > 1:
        raise ValueError("give ?through=POSITION once")
    text = values[0]
    if not _POSITION.fullmatch(text):
        raise ValueError(f"through={text[:40]!r} is not a position (0, 1, 2, ...)")
    if len(text) > MAX_POSITION_DIGITS:
        raise ValueError(
            f"through= has {len(text)} digits: a position has at most {MAX_POSITION_DIGITS}"
        )
    return int(text)


def refusal(policy: ControlPolicy, environ: dict[str, Any]) -> tuple[str, str] | None:
    """Why the control port refuses this caller (HTTP status, message), or None."""
    if policy.tls is None:
        return None  # loopback only: the listener's address is the policy
    subject = environ.get(_PEER_SUBJECT)
    if subject is None:
        return "401 Unauthorized", "a client certificate of the log's CA is required"
    if subject not in policy.subjects:
        allowed = ", ".join(sorted(policy.subjects))
        return "403 Forbidden", f"{subject!r} may not flush the archive (only {allowed})"
    return None


def metrics_application() -> App:
    metrics = make_wsgi_app(REGISTRY)

    def app(environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "") == "/flush":
            return _json(
                start,
                "403 Forbidden",
                {"error": "POST /flush on the archiver's control port (docs/backup.md)"},
            )
        result: Iterable[bytes] = metrics(environ, start)
        return result

    return app


def control_application(
    archiver: Archiver,
    loop: asyncio.AbstractEventLoop,
    policy: ControlPolicy,
    timeout: float = 5.0,
) -> App:
    async def request(through: int) -> int:
        return archiver.request_flush(through)

    def app(environ: dict[str, Any], start: StartResponse) -> Iterable[bytes]:
        path, method = environ.get("PATH_INFO", ""), environ.get("REQUEST_METHOD", "GET")
        refused = refusal(policy, environ)
        if refused is not None:
            archive_metrics.CONTROL_REFUSED.inc()
            log.warning(
                "control port: %s %s from %s: %s",
                method,
                path,
                environ.get("REMOTE_ADDR"),
                refused[1],
            )
            return _json(start, refused[0], {"error": refused[1]})
        if path != "/flush":
            return _json(start, "404 Not Found", {"error": "the control port serves POST /flush"})
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

    return app


def _start(server: Any, name: str) -> Any:
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server


def serve_metrics(port: int, host: str = "") -> Any:
    """Serve the metrics on `port` in a daemon thread; returns the server (`shutdown()`)."""
    server = make_server(
        host, port, metrics_application(), server_class=_ThreadingServer, handler_class=_Quiet
    )
    return _start(server, "archive-metrics")


def serve_control(
    archiver: Archiver, loop: asyncio.AbstractEventLoop, port: int, policy: ControlPolicy
) -> Any:
    """Serve the control port (`ControlPolicy`) in a daemon thread; returns the server."""
    app = control_application(archiver, loop, policy)
    if policy.tls is None:
        server = make_server(
            policy.host, port, app, server_class=_ThreadingServer, handler_class=_Quiet
        )
    else:
        contexts = _Contexts(policy.tls)
        contexts.current()  # fail at start on unreadable files, not at the first caller
        server = make_server(policy.host, port, app, server_class=_TlsServer, handler_class=_Quiet)
        server.contexts = contexts
    return _start(server, "archive-control")
