"""Runs the maintenance jobs periodically, in its own process: the embedded default maintains itself.

    python -m jobs.scheduler [--root DIR] [--once]

`topiclake serve` starts this process beside the server when `jobs.schedule` is true (the
default) and stops it on exit. Intervals come from `conf.jobs.*_interval_s`; replication runs only
when `jobs.replica_root` is set. With `jobs.use_spark` the jobs run on one SparkSession
(`spark.master`) kept for the scheduler's life; by default they run in this process (they are the
same code, one topic after another), which needs no JVM on a small machine.

The scheduler exits when the server that started it is gone, however it ended.
A job that fails is logged with its error and retried at its next interval; it never stops the
scheduler or the server. Each run prints one JSON line (`{"job": ..., "report": ...}`) on stdout
and is recorded in `_system/job_runs` (GET /jobs, the console's Jobs page).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from conf import Settings
from delta_log.system.job_runs import JobRunLog
from delta_log.table.storage import StorageRoot
from jobs.common import job_settings


@dataclass(slots=True)
class Scheduled:
    name: str
    interval_s: float
    run: Callable[[Any, Settings], dict[str, Any]]
    next_at: float = 0.0


def _compaction(spark: Any, settings: Settings) -> dict[str, Any]:
    from jobs import compaction

    return {"topics": compaction.run(spark, settings).topics}


def _retention(spark: Any, settings: Settings) -> dict[str, Any]:
    from jobs import retention

    report = retention.run(spark, settings)
    return {"records_removed": report.records_removed, "topics": report.topics}


def _rebalance(spark: Any, settings: Settings) -> dict[str, Any]:
    from jobs import rebalance

    report = rebalance.run(spark, settings)
    return {"changed": report.changed, "groups": report.groups}


def _replication(spark: Any, settings: Settings) -> dict[str, Any]:
    from jobs import replication

    return replication.run(spark, settings).to_dict()


def _upsert(spark: Any, settings: Settings) -> dict[str, Any]:
    from jobs import upsert

    return {"topics": upsert.run(spark, settings).topics}


def schedule_of(settings: Settings) -> list[Scheduled]:
    """The jobs to run and how often (pure)."""
    j = settings.jobs
    out = [
        Scheduled("rebalance", j.rebalance_interval_s, _rebalance),
        Scheduled("retention", settings.maintenance.retention_interval_s, _retention),
        Scheduled("compaction", j.compaction_interval_s, _compaction),
        Scheduled("upsert", j.upsert_interval_s, _upsert),
    ]
    if j.replica_root:
        out.append(Scheduled("replication", j.replication_interval_s, _replication))
    return out


def run_job(
    job: Scheduled, spark: Any, settings: Settings, runs: JobRunLog | None, *, trigger: str = "schedule"
) -> dict[str, Any]:
    """Run one job now: print its JSON line, and record the run in `_system/job_runs` (`runs`).
    A job's failure is its line's `error`, never raised."""
    started_ms = int(time.time() * 1000)
    started = time.monotonic()
    line: dict[str, Any]
    try:
        report: dict[str, Any] = job.run(spark, settings)
        line = {"job": job.name, "ok": True, "seconds": round(time.monotonic() - started, 3), "report": report}
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        line = {
            "job": job.name,
            "ok": False,
            "seconds": round(time.monotonic() - started, 3),
            "error": f"{type(exc).__name__}: {exc}",
        }
    print(json.dumps(line, default=str), flush=True)
    if runs is not None:
        try:
            runs.record(
                job.name,
                started_at_ms=started_ms,
                seconds=line["seconds"],
                ok=line["ok"],
                report=line.get("report"),
                error=line.get("error", ""),
                trigger=trigger,
            )
        except Exception as exc:  # the run happened; only its record is missing
            print(f"job run of {job.name} not recorded: {exc}", file=sys.stderr, flush=True)
    return line


def run_due(
    jobs: list[Scheduled], spark: Any, settings: Settings, now: float, runs: JobRunLog | None = None
) -> list[str]:
    """Run every job whose time came; returns their names."""
    ran = []
    for job in jobs:
        if now < job.next_at:
            continue
        job.next_at = now + job.interval_s
        run_job(job, spark, settings, runs)
        ran.append(job.name)
    return ran


def _orphaned(parent_pid: int | None) -> bool:
    """True once the server that started us is gone (also after a SIGKILL, which runs no cleanup)."""
    return parent_pid is not None and os.getppid() != parent_pid


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jobs.scheduler", description=__doc__)
    ap.add_argument("--root")
    ap.add_argument("--once", action="store_true", help="run every job once, then exit")
    ap.add_argument("--parent-pid", type=int, help="exit when this process is gone (the server that started us)")
    args = ap.parse_args(argv)
    settings = job_settings(args.root)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    spark = None
    if settings.jobs.use_spark:
        from delta_log.spark import get_spark

        spark = get_spark(settings, app_name="topiclake-jobs")
    jobs = schedule_of(settings)
    runs = JobRunLog(StorageRoot(settings.root, settings.storage_options))
    # First runs are staggered by a fraction of each interval so a fresh server starts quietly.
    start = time.monotonic()
    for i, job in enumerate(jobs):
        job.next_at = start if args.once else start + min(job.interval_s, 5.0 * (i + 1))
    try:
        while not stop.is_set() and not _orphaned(args.parent_pid):
            run_due(jobs, spark, settings, time.monotonic(), runs)
            if args.once:
                break
            stop.wait(min(1.0, max(0.05, min(j.next_at for j in jobs) - time.monotonic())))
    finally:
        if spark is not None:
            spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
