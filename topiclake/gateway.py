"""The composition root: one gateway process, assembled in one place.

`Gateway` builds what every face shares, from the settings, and starts it in this order:
1. the root is checked (a replica not promoted is refused) and the registry opened (writers,
   readers, the offsets table, the schema registry), with the commit notifier;
2. the Kafka listener binds its port (first: the cluster record carries its address);
3. cluster membership (several gateways on one root), and the forwarding client;
4. the write-ahead logs of gone gateways replayed into their tables, before anything is served,
   and on every later departure;
5. the group coordinator, then the services (broker.services) every face calls;
6. the Kafka listener serves; the background tasks (idle topics released, schemas refreshed).
`stop` undoes it: background tasks, the listener, the cluster (first, so the others take this
gateway's groups at once), the coordinator, the notifier, and the registry last (it flushes what
is queued).

`app` is the HTTP face (ingest_gateway.app.create_app) over a Gateway, which its ASGI lifespan
starts and stops; `serve` runs the process: the maintenance jobs in a process of their own,
uvicorn with the app, and their stop.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import ssl
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.concurrency import run_in_threadpool

from broker.cluster import Cluster
from broker.coordinator import GroupCoordinator, group_config_bounds
from broker.notifier import CommitNotifier
from broker.services import Services
from conf import Settings, load_settings
from delta_log.core.ownership import group_resource
from delta_log.errors import TopiclakeError
from delta_log.maintenance.replication import refuse_unpromoted_replica
from delta_log.registry import TopicRegistry
from delta_log.system.gateways import GatewayDirectory
from delta_log.system.groups import GroupStore
from delta_log.table.storage import StorageRoot
from ingest_gateway import server as http_server
from ingest_gateway.app import create_app
from ingest_gateway.kit.forwarding import transaction_adder
from ingest_gateway.metrics import Metrics
from kafka_gateway.listener import KafkaListener

log = logging.getLogger(__name__)


class Gateway:
    """What one gateway process shares between its faces, started and stopped in order."""

    def __init__(self, settings: Settings, metrics: Metrics | None = None) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.registry: TopicRegistry | None = None
        self.notifier: CommitNotifier | None = None
        self.listener: KafkaListener | None = None
        self.cluster: Cluster | None = None
        self.forwarder: httpx.AsyncClient | None = None
        self.coordinator: GroupCoordinator | None = None
        self.services: Services | None = None
        #: what start-up recovered from gone gateways' write-ahead logs
        self.recovery: dict[str, float | int] = {}
        self._tasks: list[asyncio.Task[Any]] = []

    async def start(self) -> None:
        settings = self.settings
        await run_in_threadpool(refuse_unpromoted_replica, StorageRoot(settings.root, settings.storage_options))
        registry = self.registry = TopicRegistry(settings, on_flush=self.metrics.on_flush)
        self.notifier = CommitNotifier(
            asyncio.get_running_loop(), reader=registry.reader, watch_interval_s=settings.reader.watch_interval_s
        )
        registry.add_commit_listener(self.notifier.on_commit)
        store = await run_in_threadpool(GroupStore, registry.storage)
        await run_in_threadpool(lambda: registry.offsets)  # open (or create) the offsets table off the loop
        await run_in_threadpool(lambda: registry.schemas)  # and the schema registry's
        if settings.kafka.enabled:  # bound first: the cluster record carries its address
            self.listener = KafkaListener(
                None,
                settings.kafka,
                host=settings.kafka.host or settings.server.host,
                tls=http_server.server_tls(settings.server),
            )
            await self.listener.start()
        cluster = await self._join_cluster(registry)
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
        self.recovery = {"seconds": round(time.perf_counter() - started, 3), "records": sum(replayed.values())}
        log.info("recovered %d acked records into their tables in %.3f s", *self.recovery.values())
        if cluster is not None:
            cluster.on_change(orphans.set)
        self._tasks.append(
            asyncio.create_task(_replay_write_ahead(registry, live, orphans, settings), name="write-ahead-replay")
        )
        coordinator = self.coordinator = GroupCoordinator(
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
        self.services = Services(
            settings=settings, registry=registry, notifier=self.notifier, coordinator=coordinator, cluster=cluster
        )
        transactions = self.services.transactions
        if cluster is not None and self.forwarder is not None:
            transactions.remote_add = transaction_adder(cluster, self.forwarder, settings.auth)
        await transactions.start()  # decisions a crash left half done are finished before serving
        if cluster is not None:
            cluster.on_change(transactions.on_membership_change)
        if self.listener is not None:
            await self.listener.serve(self.services)
        self._tasks.append(asyncio.create_task(_release_idle_topics(registry, settings), name="release-idle-topics"))
        self._tasks.append(asyncio.create_task(_refresh_schemas(registry, settings), name="refresh-schemas"))
        # What start-up made (modules, routes, models, pyarrow's types) lives as long as the process:
        # kept out of the collector's sight. Else every full collection walked all of it holding
        # the GIL (measured: 150 ms, about once in 10 s at 500 requests/s, every request
        # waiting; 2 ms once frozen).
        gc.collect()
        gc.freeze()
        log.info("topiclake serving root %s", registry.storage.root)

    async def _join_cluster(self, registry: TopicRegistry) -> Cluster | None:
        """Membership of the root's cluster, where `topiclake serve` advertised this gateway."""
        settings = self.settings
        if not settings.cluster.advertise_url:
            return None
        listener = self.listener
        cluster = self.cluster = Cluster(
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
        self.forwarder = httpx.AsyncClient(
            # joins wait for their rebalance: no pool limit, so they never starve heartbeats
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=64),
            timeout=httpx.Timeout(settings.cluster.forward_timeout_s, connect=5.0, pool=5.0),
            verify=_peer_tls(settings),
        )
        return cluster

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        if self.listener is not None:
            await self.listener.stop()
        if self.cluster is not None:
            await self.cluster.stop()  # first: the others take this gateway's groups at once
        if self.forwarder is not None:
            await self.forwarder.aclose()
        if self.coordinator is not None:
            await self.coordinator.stop()
        if self.services is not None:
            await self.services.transactions.stop()
        if self.notifier is not None:
            await self.notifier.close()
        if self.registry is not None:
            self.registry.close()  # flushes queued requests before exit

    def publish(self, state: Any) -> None:
        """Put what the HTTP routes use on the app's state (ingest_gateway.kit.dependencies reads it)."""
        state.registry, state.notifier, state.cluster = self.registry, self.notifier, self.cluster
        state.forwarder, state.coordinator, state.services = self.forwarder, self.coordinator, self.services
        state.kafka, state.recovery = self.listener, self.recovery


def app(settings: Settings | None = None) -> FastAPI:
    """The HTTP face over a Gateway that its lifespan starts and stops."""
    settings = settings or load_settings()
    gateway = Gateway(settings)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        try:
            await gateway.start()
            gateway.publish(app.state)
            yield
        finally:
            await gateway.stop()

    return create_app(settings, metrics=gateway.metrics, lifespan=lifespan)


def serve(
    settings: Settings,
    *,
    host: str,
    port: int,
    log_config: dict[str, Any],
    sockets: list[Any] | None = None,
    jobs: bool = True,
) -> None:
    """Run one gateway process until it is stopped: the maintenance jobs (`jobs`, where the
    settings schedule them) in a process of their own, so their CPU time never holds this GIL;
    uvicorn with `app`; then the jobs' process, stopped by its id."""
    scheduler = None
    if settings.jobs.schedule and jobs:
        scheduler = subprocess.Popen(
            [sys.executable, "-m", "jobs.scheduler", "--root", settings.root, "--parent-pid", str(os.getpid())]
        )
        print(f"maintenance jobs scheduled (pid {scheduler.pid}); intervals in conf [jobs]", flush=True)
    try:
        http_server.run(app(settings), settings, host=host, port=port, log_config=log_config, sockets=sockets)
    finally:
        if scheduler is not None:
            scheduler.terminate()
            try:
                scheduler.wait(timeout=30)
            except subprocess.TimeoutExpired:
                scheduler.kill()


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
