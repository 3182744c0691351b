"""The HTTP face's application: its middleware (authentication, body limits, same-origin, group
forwarding, metrics) and routes (produce, topics, operations, the registry, jobs, the consumer
API, the console, the docs). It builds only the face; topiclake.gateway assembles the process
around it."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager

from fastapi import FastAPI
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from conf import AuthSettings, Settings, load_settings
from console.app import install_console, is_console_file
from consumer_api.router import router as consumer_router
from delta_log.core.acl import authenticate
from delta_log.errors import AuthenticationError, RequestTooLargeError
from ingest_gateway.api_docs import install_docs, is_docs_asset
from ingest_gateway.browser_guard import SameOriginMiddleware
from ingest_gateway.kit.errors import error_response, install_error_handlers
from ingest_gateway.kit.forwarding import GroupForwardingMiddleware
from ingest_gateway.metrics import Metrics
from ingest_gateway.openapi import install_openapi
from ingest_gateway.routes import jobs as jobs_routes
from ingest_gateway.routes import ops, records, topics, transactions
from ingest_gateway.routes import registry as registry_routes

log = logging.getLogger(__name__)


class RequestMetricsMiddleware:
    """Counts responses by method and status (pure ASGI: BaseHTTPMiddleware costs far more per request)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.on_request(scope["method"], message["status"])
            await send(message)

        await self.app(scope, receive, counting_send)


#: Answered without a key whatever the configuration: liveness and readiness probes.
OPEN_PATHS = frozenset({"/healthz", "/readyz"})
DOCS_PATHS = frozenset({"/openapi.json", "/docs", "/redoc"})


class AuthenticationMiddleware:
    """With keys configured, every HTTP request but the health checks needs a valid key, whatever
    route it reaches (one gate for the whole app: routes added later, the docs pages and 404s
    included). Authorization of each operation on each resource stays with the routes."""

    def __init__(self, app: ASGIApp, auth: AuthSettings, retry_after: int, *, console: bool = False) -> None:
        self.app = app
        self.auth = auth
        self.retry_after = retry_after
        self.console = console  # the console's own files (no data in them) load without a key
        self.open = (
            OPEN_PATHS
            | (DOCS_PATHS if auth.open_docs else frozenset())
            | (frozenset({"/metrics"}) if auth.open_metrics else frozenset())
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or not self.auth.enabled
            or scope["path"] in self.open
            or (self.auth.open_docs and is_docs_asset(scope["path"]))
            or (self.console and is_console_file(scope["method"], scope["path"]))
        ):
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("authorization")
        try:
            principal = authenticate(self.auth, header)
        except AuthenticationError as exc:
            await error_response(exc, retry_after=self.retry_after, path=scope["path"])(scope, receive, send)
            return
        scope.setdefault("state", {})["principal"] = principal  # the routes' PrincipalDep reads it
        await self.app(scope, receive, send)


#: The produce route reads its body itself, to its own (larger) limit, while reading.
PRODUCE_PATH = re.compile(r"^/topics/[^/]+/records$")


class BodyLimitMiddleware:
    """Every route but produce gets at most `limit` body bytes, counted while they arrive: a
    declared Content-Length over it is refused before reading, and a body that grows past it
    (chunked, or lying about its length) is answered 413 at that point and not read further."""

    def __init__(self, app: ASGIApp, limit: int, retry_after: int) -> None:
        self.app = app
        self.limit = limit
        self.retry_after = retry_after

    def _too_large(self) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"The body is over this route's {self.limit}-byte limit (server.max_body_bytes).", limit=self.limit
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or (scope["method"] == "POST" and PRODUCE_PATH.match(scope["path"])):
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            await error_response(self._too_large(), retry_after=self.retry_after, path=scope["path"])(
                scope, receive, send
            )
            return
        received = 0
        answered = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, answered
            if answered:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    answered = True
                    if not started:  # a response under way (a stream) just ends: the client sent too much
                        await error_response(self._too_large(), retry_after=self.retry_after, path=scope["path"])(
                            scope, receive, send
                        )
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if not answered:  # after a 413, whatever the route still says is dropped
                started = True
                await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not answered:
                raise


def create_app(
    settings: Settings | None = None,
    *,
    metrics: Metrics | None = None,
    lifespan: Callable[[FastAPI], AbstractAsyncContextManager[None]] | None = None,
) -> FastAPI:
    """The HTTP face: its middleware, routes, console and docs. What the routes use (registry,
    services, coordinator, cluster, ...) is put on `app.state` by the composition root
    (topiclake.gateway), whose `lifespan` starts and stops it; without one, only what needs no
    storage answers (/healthz)."""
    settings = settings or load_settings()
    metrics = metrics or Metrics()

    app = FastAPI(
        title="topiclake",
        summary="A Kafka-like log whose topics are Delta Lake tables.",
        version="0.1.0",
        lifespan=lifespan,
        docs_url=None,  # served by install_docs, from this gateway (no CDN)
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.metrics = metrics

    app.state.cluster = None
    app.add_middleware(GroupForwardingMiddleware, app_state=app.state, respond=error_response)
    app.add_middleware(
        BodyLimitMiddleware, limit=settings.server.max_body_bytes, retry_after=settings.server.retry_after_seconds
    )
    app.add_middleware(
        AuthenticationMiddleware,
        auth=settings.auth,
        retry_after=settings.server.retry_after_seconds,
        console=settings.server.console,
    )
    app.add_middleware(SameOriginMiddleware, retry_after=settings.server.retry_after_seconds)
    app.add_middleware(RequestMetricsMiddleware, metrics=metrics)

    install_error_handlers(app, retry_after=settings.server.retry_after_seconds, on_error=metrics.on_error)
    app.include_router(ops.router)
    app.include_router(topics.router)
    app.include_router(records.router)
    app.include_router(transactions.router)
    records.QuerylessProduceRoute.install(app.router.routes)
    app.include_router(consumer_router)
    app.include_router(registry_routes.router)
    app.include_router(registry_routes.summary_router)
    app.include_router(jobs_routes.router)
    if settings.server.console:
        install_console(app)
    install_openapi(app, settings)
    install_docs(app)
    return app
