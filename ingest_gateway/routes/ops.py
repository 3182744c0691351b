"""Health, readiness and Prometheus metrics."""

from __future__ import annotations

import resource
from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse

from broker import admin
from broker.groups import held_groups
from delta_log.core.acl import authorize
from delta_log.core.ownership import group_resource
from delta_log.errors import TopicNotFoundError
from ingest_gateway.kit.dependencies import MetricsDep, OptionalPrincipalDep, PrincipalDep, RegistryDep
from ingest_gateway.kit.params import AfterQuery, SearchQuery, TopicQuery

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """Liveness: the process answers. On the event loop, never a worker thread: a busy thread pool
    must not make a live gateway look dead to the orchestrator probing it."""
    return {"status": "ok"}


def _limits(request: Request) -> dict[str, object]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    out: dict[str, object] = {"open_files": {"soft": soft, "hard": hard}}
    guard = getattr(request.app.state, "connection_guard", None)
    if guard is not None:
        out.update(guard.snapshot())
    return out


@router.get("/readyz")
async def readyz(registry: RegistryDep, request: Request) -> JSONResponse:
    """Readiness: the storage root can be listed. Also shows the open-files limit, connections, and
    the partitions still recovering a dead gateway's acked records (they answer 503 meanwhile).
    Like every route, answered only once this gateway has recovered what it owns at start."""
    try:
        topics = await run_in_threadpool(registry.catalog.list_topics)
    except Exception as exc:
        return JSONResponse(
            {"status": "unavailable", "error": {"code": "STORAGE_UNAVAILABLE", "message": str(exc)}},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    return JSONResponse(
        {
            "status": "ready",
            "topics": len(topics),
            "root": registry.storage.root,
            # partitions waiting for a dead gateway's leases to end (a count: health checks take no
            # key, and topic names are for keys that may describe them)
            "recovering_partitions": sum(len(ps) for ps in registry.recovering.values()),
            # what this gateway's start wrote into the tables from dead gateways' write-ahead logs
            "recovery": getattr(request.app.state, "recovery", None),
            **_limits(request),
        }
    )


@router.get("/metrics", response_class=PlainTextResponse)
def metrics(registry: RegistryDep, m: MetricsDep, principal: OptionalPrincipalDep) -> PlainTextResponse:
    """Prometheus text format: per-topic series for the topics the key may describe (all of them
    for a scraper without a key when `auth.open_metrics` is set)."""
    committers = registry.committers()
    text = m.render(
        {t: c.queue_depth for t, c in committers.items()},
        {t: c.queued_bytes for t, c in committers.items()},
        {t: dict(c.writer.phase_seconds) for t, c in committers.items()},
        {t: c.writer.conflicts for t, c in committers.items()},
        table_lag={t: lag for t in committers if (lag := registry.table_lag_s(t)) is not None},
        upsert_lag=registry.upsert_lags(),
        write_ahead_syncs=registry.write_ahead_syncs(),
        visible=(lambda t: True) if principal is None else (lambda t: principal.allows("describe", t)),
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


#: Groups listed per gateway by GET /cluster (the rest are counted): 1,000 groups stay one answer.
MAX_LISTED_GROUPS = 100


@router.get("/cluster")
async def cluster(
    request: Request, registry: RegistryDep, principal: PrincipalDep, group: str | None = None, topic: TopicQuery = None
) -> JSONResponse:
    """The gateways on this root: id, URL, health (heartbeat age), whether each serves TLS and
    requires keys, and the groups each coordinates (those this key may describe: the first
    100 by name, and how many); with `group`, also which gateway coordinates that group (Kafka's
    FindCoordinator); with `topic`, which gateway owns (appends to) each of its partitions (Kafka:
    the partition leaders). Needs admin on some topic (Kafka: DESCRIBE on the cluster), and
    describe on `topic`."""
    authorize(principal, "admin", None)
    if topic is not None:
        authorize(principal, "describe", topic)
    view = request.app.state.cluster
    coordinator = request.app.state.coordinator
    if view is None:  # an app without membership (embedded in a test or a notebook)
        return JSONResponse({"self": None, "gateways": [], "groups": {}})
    groups = sorted(g for g in await held_groups(coordinator) if principal.allows_group("describe", g))
    owners: dict[str, list[str]] = {}
    for g in groups:
        o = view.owner(group_resource(g))
        owners.setdefault(o.gateway_id if o else "none", []).append(g)
    described = view.describe()
    for gw in described["gateways"]:
        coordinated = owners.get(gw["gateway_id"], [])
        gw["groups"] = coordinated[:MAX_LISTED_GROUPS]
        gw["groups_total"] = len(coordinated)
    if group is not None:
        coordinator_of = view.owner(group_resource(group))
        described["coordinator"] = coordinator_of.gateway_id if coordinator_of else None
    if topic is not None:
        reader = await run_in_threadpool(registry.reader, topic)
        leaders = view.partition_owners(topic, reader.config.partitions)
        described["partitions"] = [{"partition": p, "owner": o} for p, o in enumerate(leaders)]
    return JSONResponse(described)


@router.get("/cluster/partitions")
def partition_leaders(
    request: Request,
    registry: RegistryDep,
    principal: PrincipalDep,
    search: SearchQuery = "",
    after: AfterQuery = "",
    limit: Annotated[int, Query(ge=1, le=1000, description="Topics in a page.")] = 50,
) -> dict[str, object]:
    """Which gateway owns (appends to) each partition of a page of topics (those this key may
    describe, by name; `next` asks for the next page), and how many of the page's partitions each
    gateway owns. Needs admin on some topic, as GET /cluster."""
    authorize(principal, "admin", None)
    view = request.app.state.cluster
    names, last = admin.list_topics(registry, principal, search=search, after=after, limit=limit)
    topics: list[dict[str, object]] = []
    counts: dict[str, int] = {}
    for name in names:
        try:
            partitions = registry.reader(name).config.partitions
        except TopicNotFoundError:  # deleted meanwhile
            continue
        leaders = view.partition_owners(name, partitions) if view is not None else [None] * partitions
        for o in leaders:
            counts[o or "none"] = counts.get(o or "none", 0) + 1
        topics.append({"topic": name, "partitions": partitions, "owners": leaders})
    return {"topics": topics, "next": last, "gateways": counts}
