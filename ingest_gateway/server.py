"""Run the app under uvicorn with the limits a public service needs.

- The open-files soft limit is raised to the hard limit at start (each connection is a file).
- Connections are bounded in total and per client address; one over a bound is answered
  `503 TOO_MANY_CONNECTIONS` (with Retry-After) and closed before any request is read.
- A connection must finish each request's headers within `server.header_timeout_s` of its first
  byte (or of the connection), or it is closed: half-open connections cannot pile up.
  Between requests, uvicorn's keep-alive timeout closes idle connections.
- TLS: a certificate and key; optionally a CA to verify client certificates.
- Host names: bound to a loopback address, it answers only to loopback names (DNS rebinding;
  ingest_gateway.browser_guard).

The guard wraps uvicorn's HTTP protocol class (httptools when installed, else h11), so it sees
every connection before a request exists, which no ASGI middleware can.
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from broker.connections import ConnectionGuard
from conf import ServerSettings, Settings
from ingest_gateway.browser_guard import HostGuardMiddleware, allowed_hosts

log = logging.getLogger(__name__)

#: files kept for everything but client connections (Delta tables, parquet readers: the readers'
#: `reader.open_files` and the Kafka face's 128, logs)
RESERVED_FILES = 640


def raise_open_files_limit() -> tuple[int, int]:
    """Soft limit := hard limit (never lowered); returns (soft, hard) as they are now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:  # e.g. a container that forbids it: keep what we have
            log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def _refusal(reason: str, retry_after: int) -> bytes:
    body = json.dumps(
        {
            "error": {
                "code": "TOO_MANY_CONNECTIONS",
                "message": f"{reason}; close idle connections or retry after {retry_after} s.",
            }
        }
    ).encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        f"retry-after: {retry_after}\r\ncontent-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


def guarded_protocol(base: type[asyncio.Protocol], guard: ConnectionGuard, retry_after: int) -> type[asyncio.Protocol]:
    """`base` (a uvicorn HTTP protocol class) with the connection limits and the header timeout."""

    class GuardedProtocol(base):  # type: ignore[valid-type,misc]
        _guard_client: str | None = None
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            client = str(peer[0]) if peer else "unknown"
            reason = guard.admit(client)
            if reason is not None:
                guard.refused += 1
                transport.write(_refusal(reason, retry_after))
                transport.close()
                return
            self._guard_client = client
            self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            loop = asyncio.get_running_loop()
            self._header_timer = loop.call_later(guard.header_timeout_s, self._header_timeout)

        def _cancel_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _awaiting_headers(self) -> bool:
            cycle = self.cycle
            return cycle is None or cycle.response_complete

        def _header_timeout(self) -> None:
            self._header_timer = None
            if self._awaiting_headers() and not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._awaiting_headers():
                self._cancel_header_timer()  # a request is in flight: its headers are complete
            elif self._header_timer is None and not self.transport.is_closing():
                self._arm_header_timer()  # the first bytes of the next request on a kept-alive connection

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel_header_timer()
            if self._guard_client is not None:
                guard.release(self._guard_client)
                self._guard_client = None
            super().connection_lost(exc)

    return GuardedProtocol


def _http_protocol_base() -> type[asyncio.Protocol]:
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        return HttpToolsProtocol
    except ImportError:  # pragma: no cover - httptools is a dependency
        from uvicorn.protocols.http.h11_impl import H11Protocol

        return H11Protocol


_CLIENT_CERTS = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


def worker_sockets(host: str, port: int) -> tuple[socket.socket, socket.socket]:
    """A worker of `serve --workers N`: the shared port, bound with SO_REUSEPORT beside its
    sibling workers (the kernel spreads new connections over them), and a private port on the
    same host that only this worker answers: the URL it advertises to the cluster, so a request
    forwarded to it reaches it and not a sibling."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    shared = socket.socket(family, socket.SOCK_STREAM)
    shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    shared.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    shared.bind((host, port))
    private = socket.socket(family, socket.SOCK_STREAM)
    private.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    private.bind((host, 0))
    for s in (shared, private):
        s.listen(2048)
        s.set_inheritable(True)
    return shared, private


def server_tls(server: ServerSettings) -> ssl.SSLContext | None:
    """The TLS context of the HTTP settings (`ssl_certfile`, `ssl_keyfile`, `ssl_ca_certs`,
    `ssl_client_auth`), for listeners other than uvicorn's (the Kafka port); None without TLS."""
    if not server.ssl_certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(server.ssl_certfile, server.ssl_keyfile)
    if server.ssl_ca_certs:
        context.load_verify_locations(server.ssl_ca_certs)
        context.verify_mode = _CLIENT_CERTS[server.ssl_client_auth]
    return context


def run(
    app: FastAPI,
    settings: Settings,
    *,
    host: str,
    port: int,
    log_config: dict[str, Any],
    sockets: list[socket.socket] | None = None,
) -> None:
    """Serve `app` until stopped (on `sockets` when given: a worker of `serve --workers N`)."""
    server = settings.server
    soft, _ = raise_open_files_limit()
    guard = ConnectionGuard(
        max_connections=max(1, min(server.max_connections, soft - RESERVED_FILES)),
        max_per_client=server.max_connections_per_client,
        header_timeout_s=server.header_timeout_s,
    )
    app.state.connection_guard = guard
    tls: dict[str, Any] = {}
    if server.ssl_certfile:
        tls = {"ssl_certfile": server.ssl_certfile, "ssl_keyfile": server.ssl_keyfile}
        if server.ssl_ca_certs:
            tls["ssl_ca_certs"] = server.ssl_ca_certs
            tls["ssl_cert_reqs"] = _CLIENT_CERTS[server.ssl_client_auth]
    served: ASGIApp = app
    allowed = allowed_hosts(host, server.allowed_hosts, [urlsplit(settings.cluster.advertise_url or "").netloc])
    if allowed is not None:
        served = HostGuardMiddleware(app, allowed)
    config = uvicorn.Config(
        served,
        host=host,
        port=port,
        log_config=log_config,
        http=guarded_protocol(_http_protocol_base(), guard, server.retry_after_seconds),
        timeout_keep_alive=server.keep_alive_timeout_s,
        timeout_graceful_shutdown=10,
        **tls,
    )
    uvicorn.Server(config).run(sockets=sockets)
