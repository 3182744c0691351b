"""The maintenance jobs over HTTP: their schedule and last runs, and a run now.

The runs are the `_system/job_runs` table's (every scheduler and gateway on the root records
there). A run asked for here runs in this gateway's process, on a worker thread, the same code
the scheduler runs; the answer comes when it is done. The jobs act on every topic and group, and
their reports name them: both routes need admin on `*` topics and `*` groups (Kafka: ALTER on the
cluster). Asking for a run takes a JSON body, so that a page on another site cannot send one
(a cross-site JSON request needs CORS, which the API does not grant), also with auth off.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict

from broker.admin import JobRun, JobRunLog
from broker.services import TopicRegistry
from delta_log.core.acl import authorize_all
from delta_log.errors import UnknownJobError
from ingest_gateway.kit.dependencies import PrincipalDep, RegistryDep, SettingsDep
from jobs.scheduler import run_job, schedule_of

router = APIRouter(prefix="/jobs", tags=["operations"])
#: one requested run of a job at a time in this process (the scheduler's runs and other gateways'
#: are not serialized with it: the jobs are safe side by side, as two gateways' schedulers are)
_locks: dict[str, asyncio.Lock] = {}


class RunRequest(BaseModel):
    """Nothing to set yet: `{}`."""

    model_config = ConfigDict(extra="forbid")


def _run(r: JobRun) -> dict[str, Any]:
    return {
        "started_at_ms": r.started_at_ms,
        "seconds": r.seconds,
        "ok": r.ok,
        "report": r.report,
        "error": r.error or None,
        "host": r.host,
        "pid": r.pid,
        "trigger": r.trigger,
    }


def _log(request: Request, registry: TopicRegistry) -> JobRunLog:
    """The root's job run table (opened, or created, on first use: blocking)."""
    log: JobRunLog | None = getattr(request.app.state, "job_runs", None)
    if log is None:
        log = request.app.state.job_runs = JobRunLog(registry.storage)
    return log


@router.get("")
async def list_jobs(request: Request, registry: RegistryDep, settings: SettingsDep, principal: PrincipalDep) -> dict:
    """Each job this server's scheduler runs: its interval, and its last 10 runs (newest first)
    by whoever ran them, with what each did."""
    authorize_all(principal, "describe the maintenance jobs")
    recent = await run_in_threadpool(lambda: _log(request, registry).recent(10))
    return {
        "scheduled": settings.jobs.schedule,
        "jobs": [
            {"job": j.name, "interval_s": j.interval_s, "runs": [_run(r) for r in recent.get(j.name, [])]}
            for j in schedule_of(settings)
        ],
    }


@router.post("/{job}/runs")
async def run_now(
    job: str,
    body: RunRequest,
    request: Request,
    registry: RegistryDep,
    settings: SettingsDep,
    principal: PrincipalDep,
) -> dict:
    """Run a job now, in this gateway, and answer with what it did (`ok` false and `error` when
    it failed). One run of a job at a time per gateway: a second request waits for the first."""
    authorize_all(principal, "run the maintenance jobs")
    known = {j.name: j for j in schedule_of(settings)}
    if job not in known:
        raise UnknownJobError(f"No job named {job[:64]!r}; this server runs {', '.join(known)}.", job=job[:64])
    async with _locks.setdefault(job, asyncio.Lock()):
        return await run_in_threadpool(
            lambda: run_job(known[job], None, settings, _log(request, registry), trigger="request")
        )
