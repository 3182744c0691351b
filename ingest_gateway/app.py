"""The gateway application: produce, topic admin, operations (and the consumer API, once mounted)."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import ssl
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import httpx
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from broker.cluster import Cluster
from broker.coordinator import GroupCoordinator, group_config_bounds
from broker.notifier import CommitNotifier
from broker.services import Services
from conf import AuthSettings, Settings, load_settings
from console.app import install_console, is_console_file
from consumer_api.forwarding import GroupForwardingMiddleware
from consumer_api.router import router as consumer_router
from delta_log.core.acl import authenticate
from delta_log.core.ownership import group_resource
from delta_log.errors import AuthenticationError, RequestTooLargeError, TopiclakeError
from delta_log.maintenance.replication import refuse_unpromoted_replica
from delta_log.registry import TopicRegistry
from delta_log.system.gateways import GatewayDirectory
from delta_log.system.groups import GroupStore
from delta_log.table.storage import StorageRoot
from ingest_gateway.api_docs import install_docs, is_docs_asset
from ingest_gateway.browser_guard import SameOriginMiddleware
from ingest_gateway.errors import error_response, install_error_handlers
from ingest_gateway.metrics import Metrics
from ingest_gateway.openapi import install_openapi
from ingest_gateway.routes import jobs as jobs_routes
from ingest_gateway.routes import ops, records, topics
from ingest_gateway.routes import registry as registry_routes
from ingest_gateway.server import server_tls
from kafka_gateway.listener import KafkaListener

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


def _peer_tls(settings: Settings) -> ssl.SSLContext | bool:
    """How this gateway connects to the others: trust `cluster.ca_file`, and present
    `cluster.client_cert` where the others verify client certificates."""
    c = settings.cluster
    if not (c.ca_file or c.client_cert):
        return True
    context = ssl.create_default_context(cafile=c.ca_file)
    if c.client_cert:
        context.load_cert_chain(c.client_cert, c.client_key)
    return context


async def _release_idle_topics(registry: TopicRegistry, settings: Settings) -> None:
    """Every quarter of `server.topic_idle_s`, give back the handles of idle topics."""
    every = max(settings.server.topic_idle_s / 4, 0.05)
    while True:
        await asyncio.sleep(every)
        try:
            await run_in_threadpool(
                registry.release_idle, settings.server.topic_idle_s, settings.server.max_open_topics
            )
        except Exception:
            log.exception("releasing idle topics failed; will retry")


async def _refresh_schemas(registry: TopicRegistry, settings: Settings) -> None:
    """Keep the schema registry's snapshot at most `server.schema_refresh_s` old (produce reads it
    without I/O)."""
    every = max(settings.server.schema_refresh_s, 0.05)
    while True:
        await asyncio.sleep(every)
        try:
            await run_in_threadpool(registry.schemas.state, max_age_s=every)
        except Exception:
            log.exception("reading the schema registry failed; will retry")


async def _replay_write_ahead(
    registry: TopicRegistry,
    live: Callable[[str], bool],
    wake: asyncio.Event,
    settings: Settings,
    *,
    once: bool = False,
) -> dict[str, int]:
    """Replay the write-ahead logs of gateways that are gone into their tables, whenever woken (a
    start, a gateway leaving); `once`: one pass, returning the records it wrote per topic. A
    gateway known to have died (its process ended: a restart, a worker started again) is replayed
    at once; one merely silent, once its leases end (within `writer.wal_lease_ms`): until then
    its partitions answer PARTITION_RECOVERING and its producers are told to retry."""
    retry_s = settings.writer.wal_lease_margin_ms / 1000
    while True:
        await wake.wait()
        wake.clear()
        while True:
            try:
                written, complete = await run_in_threadpool(lambda: registry.replay_write_ahead(live=live))
            except TopiclakeError as exc:
                log.warning("replaying write-ahead logs failed (%s); retrying", exc)
                written, complete = {}, False
            if written:
                log.info("write-ahead records of gone gateways written into their tables: %s", written)
            if once:
                if not complete:
                    wake.set()  # the background task goes on with it
                return written
            if complete:
                break
            await asyncio.sleep(retry_s)  # the dead gateway's leases end by then, or soon after


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the app; the registry (writers, readers) lives for the app's lifespan."""
    settings = settings or load_settings()
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(refuse_unpromoted_replica, StorageRoot(settings.root, settings.storage_options))
        registry = TopicRegistry(settings, on_flush=metrics.on_flush)
        app.state.registry = registry
        notifier = CommitNotifier(
            asyncio.get_running_loop(), reader=registry.reader, watch_interval_s=settings.reader.watch_interval_s
        )
        registry.add_commit_listener(notifier.on_commit)
        app.state.notifier = notifier
        store = await run_in_threadpool(GroupStore, registry.storage)
        await run_in_threadpool(lambda: registry.offsets)  # open (or create) the offsets table off the loop
        await run_in_threadpool(lambda: registry.schemas)  # and the schema registry's
        listener = None
        if settings.kafka.enabled:  # bound first: the cluster record carries its address
            listener = KafkaListener(
                None, settings.kafka, host=settings.kafka.host or settings.server.host, tls=server_tls(settings.server)
            )
            await listener.start()
        cluster = None
        if settings.cluster.advertise_url:  # `topiclake serve` sets it: a member of the root's cluster
            cluster = Cluster(
                GatewayDirectory(registry.storage),
                settings.cluster,
                url=settings.cluster.advertise_url,
                kafka=listener.advertised if listener else "",
                node_id=listener.node_id if listener else -1,
                auth=settings.auth.enabled,
            )
            await cluster.start()
            if settings.cluster.route_produce:  # each partition's owner appends to it and keeps it compact
                me = cluster.me.gateway_id
                registry.set_rollup_scope(
                    lambda topic, n: [p for p, owner in enumerate(cluster.partition_owners(topic, n)) if owner == me]
                )
            app.state.forwarder = httpx.AsyncClient(
                # joins wait for their rebalance: no pool limit, so they never starve heartbeats
                limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
                timeout=httpx.Timeout(settings.cluster.forward_timeout_s, connect=5.0, pool=5.0),
                verify=_peer_tls(settings),
            )
        app.state.cluster = cluster
        # `log` topics' records acked by a gateway that died before its table flush: written now,
        # before this gateway serves (the txn high watermarks make a replay write nothing twice)
        if cluster is not None:
            registry.wal_owner = cluster.me.gateway_id
            registry.gone_wal_owners = lambda: cluster.gone  # their leases bind no one: taken over at once
        live = (lambda gid: cluster.member(gid) is not None) if cluster is not None else (lambda gid: False)
        orphans = asyncio.Event()  # a start, or a gateway left: its log may hold acks its table lacks
        orphans.set()
        started = time.perf_counter()
        replayed = await _replay_write_ahead(registry, live, orphans, settings, once=True)
        app.state.recovery = {"seconds": round(time.perf_counter() - started, 3), "records": sum(replayed.values())}
        log.info("recovered %d acked records into their tables in %.3f s", *app.state.recovery.values())
        if cluster is not None:
            cluster.on_change(orphans.set)
        recovery = asyncio.create_task(
            _replay_write_ahead(registry, live, orphans, settings), name="write-ahead-replay"
        )
        coordinator = GroupCoordinator(
            registry,
            store,
            sync_interval_s=settings.server.groups_sync_interval_s,
            heartbeat_persist_s=settings.server.heartbeat_persist_interval_s,
            consumer_session_timeout_ms=settings.server.consumer_group_session_timeout_ms,
            consumer_heartbeat_interval_ms=settings.server.consumer_group_heartbeat_interval_ms,
            group_config_bounds=group_config_bounds(settings.server),
            group_max_size=settings.server.group_max_size,
            consumer_group_max_size=settings.server.consumer_group_max_size,
            owns=(lambda g: cluster.owns(group_resource(g))) if cluster else None,
        )
        await coordinator.start()
        if cluster is not None:
            cluster.on_change(coordinator.on_membership_change)
        app.state.coordinator = coordinator
        services = Services(
            settings=settings, registry=registry, notifier=notifier, coordinator=coordinator, cluster=cluster
        )
        app.state.services = services
        app.state.kafka = listener
        if listener is not None:
            await listener.serve(services)
        janitor = asyncio.create_task(_release_idle_topics(registry, settings), name="release-idle-topics")
        schema_reader = asyncio.create_task(_refresh_schemas(registry, settings), name="refresh-schemas")
        # What start-up made (modules, routes, models, pyarrow's types) lives as long as the process:
        # kept out of the collector's sight. Else every full collection walked all of it holding
        # the GIL (measured: 150 ms, about once in 10 s at 500 requests/s, every request
        # waiting; 2 ms once frozen).
        gc.collect()
        gc.freeze()
        log.info("topiclake serving root %s", registry.storage.root)
        try:
            yield
        finally:
            janitor.cancel()
            schema_reader.cancel()
            recovery.cancel()
            if listener is not None:
                await listener.stop()
            if cluster is not None:
                await cluster.stop()  # first: the others take this gateway's groups at once
                await app.state.forwarder.aclose()
            await coordinator.stop()
            await notifier.close()
            registry.close()  # flushes queued requests before exit

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
