"""Health, readiness and Prometheus metrics."""

from __future__ import annotations

import resource

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, PlainTextResponse

from consumer_api.params import TopicQuery
from delta_log.core.acl import authorize
from delta_log.core.ownership import group_resource
from ingest_gateway.dependencies import MetricsDep, OptionalPrincipalDep, PrincipalDep, RegistryDep

router = APIRouter(tags=["operations"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Liveness: the process answers."""
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
    """Readiness: the storage root can be listed. Also shows the open-files limit and connections."""
    try:
        topics = await run_in_threadpool(registry.catalog.list_topics)
    except Exception as exc:
        return JSONResponse(
            {"status": "unavailable", "error": {"code": "STORAGE_UNAVAILABLE", "message": str(exc)}},
            status_code=503,
            headers={"Retry-After": "1"},
        )
    return JSONResponse({"status": "ready", "topics": len(topics), "root": registry.storage.root, **_limits(request)})


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
        visible=(lambda t: True) if principal is None else (lambda t: principal.allows("describe", t)),
    )
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


@router.get("/cluster")
async def cluster(
    request: Request, registry: RegistryDep, principal: PrincipalDep, group: str | None = None, topic: TopicQuery = None
) -> JSONResponse:
    """The gateways on this root: id, URL, health (heartbeat age), and the groups each coordinates;
    with `group`, also which gateway coordinates that group (Kafka's FindCoordinator); with `topic`,
    which gateway owns (appends to) each of its partitions (Kafka: the partition leaders). Needs
    admin on some topic (Kafka: DESCRIBE on the cluster), and describe on `topic`."""
    authorize(principal, "admin", None)
    if topic is not None:
        authorize(principal, "describe", topic)
    view = request.app.state.cluster
    coordinator = request.app.state.coordinator
    if view is None:  # an app without membership (embedded in a test or a notebook)
        return JSONResponse({"self": None, "gateways": [], "groups": {}})
    records = await run_in_threadpool(coordinator.store.load)
    groups = sorted(set(records) | set(coordinator.groups))
    owners: dict[str, list[str]] = {}
    for g in groups:
        o = view.owner(group_resource(g))
        owners.setdefault(o.gateway_id if o else "none", []).append(g)
    described = view.describe()
    for gw in described["gateways"]:
        gw["groups"] = owners.get(gw["gateway_id"], [])
    if group is not None:
        coordinator_of = view.owner(group_resource(group))
        described["coordinator"] = coordinator_of.gateway_id if coordinator_of else None
    if topic is not None:
        reader = await run_in_threadpool(registry.reader, topic)
        owners = view.partition_owners(topic, reader.config.partitions)
        described["partitions"] = [{"partition": p, "owner": o} for p, o in enumerate(owners)]
    return JSONResponse(described)
