"""The maintenance jobs' runs: the `_system/job_runs` Delta table.

One row per run of compaction, retention, replication or rebalance, whoever ran it (the scheduler
process beside a gateway, or `POST /jobs/{job}/runs`): when, how long, whether it worked, and what
it did (the job's report, as JSON). The console's Jobs page and `GET /jobs` read it.

Concurrency contract: appends are blind (several schedulers and gateways may record at once). Once
the table has `trim_files` files, a record rewrites it to the newest `keep` runs per job; the
rewrite loses to any concurrent append (no retry), which is then simply kept for the next trim.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, PostCommitHookProperties, write_deltalake
from deltalake.exceptions import DeltaError

from delta_log.table.storage import StorageRoot, translate_storage_errors

log = logging.getLogger(__name__)

JOB_RUNS_TABLE = "job_runs"
JOB_RUNS_SCHEMA = pa.schema(
    [
        pa.field("job", pa.string()),
        pa.field("started_at", pa.timestamp("us", tz="UTC")),
        pa.field("seconds", pa.float64()),
        pa.field("ok", pa.bool_()),
        pa.field("report", pa.string()),  # the job's report, JSON
        pa.field("error", pa.string()),
        pa.field("host", pa.string()),
        pa.field("pid", pa.int64()),
        pa.field("trigger", pa.string()),  # "schedule", or "request" (POST /jobs/{job}/runs)
    ]
)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobRun:
    job: str
    started_at_ms: int
    seconds: float
    ok: bool
    report: dict[str, Any]
    error: str
    host: str
    pid: int
    trigger: str


class JobRunLog:
    def __init__(self, storage: StorageRoot, *, keep: int = 50, trim_files: int = 200) -> None:
        self.storage = storage
        self.keep = keep
        self.trim_files = trim_files
        self._dt = storage.open_or_create_system_table(JOB_RUNS_TABLE, JOB_RUNS_SCHEMA)

    def record(
        self,
        job: str,
        *,
        started_at_ms: int,
        seconds: float,
        ok: bool,
        report: dict[str, Any] | None = None,
        error: str = "",
        trigger: str = "schedule",
    ) -> None:
        """Append one run. Raises: StorageUnavailableError."""
        row = {
            "job": [job],
            "started_at": [started_at_ms * 1000],
            "seconds": [float(seconds)],
            "ok": [ok],
            "report": [json.dumps(report or {}, default=str)],
            "error": [error],
            "host": [socket.gethostname()],
            "pid": [os.getpid()],
            "trigger": [trigger],
        }
        with translate_storage_errors():
            write_deltalake(
                self._dt,
                pa.table(row, schema=JOB_RUNS_SCHEMA),
                mode="append",
                commit_properties=CommitProperties(max_commit_retries=20),
                post_commithook_properties=PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=True),
            )
            if len(self._dt.file_uris()) >= self.trim_files:
                self._trim()

    def _trim(self) -> None:
        try:
            self.storage.rewrite_system_table(self._dt, _newest(self._read(), self.keep))
        except (DeltaError, OSError) as exc:  # lost to a concurrent append: trim next time
            log.info("job runs not trimmed this time: %s", exc)
            self._dt.update_incremental()

    def _read(self) -> pa.Table:
        with translate_storage_errors():
            self._dt.update_incremental()
            return self.storage.read_system_table(self._dt, JOB_RUNS_SCHEMA)

    def recent(self, per_job: int = 10) -> dict[str, list[JobRun]]:
        """The newest `per_job` runs of each job, newest first."""
        table = _newest(self._read(), per_job)
        out: dict[str, list[JobRun]] = {}
        for r in table.to_pylist():
            out.setdefault(r["job"], []).append(
                JobRun(
                    job=r["job"],
                    started_at_ms=int(r["started_at"].timestamp() * 1000),
                    seconds=r["seconds"],
                    ok=r["ok"],
                    report=json.loads(r["report"] or "{}"),
                    error=r["error"] or "",
                    host=r["host"] or "",
                    pid=r["pid"] or 0,
                    trigger=r["trigger"] or "",
                )
            )
        return out


def _newest(rows: pa.Table, per_job: int) -> pa.Table:
    """The newest `per_job` rows of each job, newest first."""
    if not rows.num_rows:
        return rows
    ordered = rows.sort_by([("job", "ascending"), ("started_at", "descending")])
    jobs = ordered.column("job").to_pylist()
    keep, seen, count = [], None, 0
    for i, job in enumerate(jobs):
        count = count + 1 if job == seen else 1
        seen = job
        if count <= per_job:
            keep.append(i)
    return ordered.take(pa.array(keep, pa.int64()))
