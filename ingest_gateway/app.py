"""The gateway application: produce, topic admin, operations (and the consumer API, once mounted)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request, Response

from conf import Settings, load_settings
from delta_log.registry import TopicRegistry
from ingest_gateway.errors import install_error_handlers
from ingest_gateway.metrics import Metrics
from ingest_gateway.routes import ops, records, topics

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the registry (writers, readers) lives for the app's lifespan."""
    settings = settings or load_settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.registry = TopicRegistry(settings, on_flush=metrics.on_flush)
        log.info("topiclake serving root %s", app.state.registry.storage.root)
        try:
            yield
        finally:
            app.state.registry.close()  # flushes queued requests before exit

    app = FastAPI(
        title="topiclake",
        summary="A Kafka-like log whose topics are Delta Lake tables.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics

    @app.middleware("http")
    async def count_requests(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        response: Response = await call_next(request)
        metrics.on_request(request.method, response.status_code)
        return response

    install_error_handlers(app, retry_after=settings.server.retry_after_seconds, on_error=metrics.on_error)
    app.include_router(ops.router)
    app.include_router(topics.router)
    app.include_router(records.router)
    try:  # the consumer API mounts here once it exists (issue 4)
        from consumer_api.router import router as consumer_router
    except ImportError:
        consumer_router = None
    if consumer_router is not None:
        app.include_router(consumer_router)
    return app
