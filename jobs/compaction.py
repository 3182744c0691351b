"""Compaction job: merge adjacent small segments; key compaction on cleanup.policy=compact topics.

    python -m jobs.compaction [--root DIR] [--topic T ...] [--target-mb 128] [--local]
    spark-submit jobs/compaction.py --root ...
    topiclake jobs compaction

Planning is pure (`delta_log.maintenance.compaction.plan_merge`, `surviving_rows`); commits are safe beside live
producers and readers (see delta_log.maintenance.compaction). The server's own roll-up keeps small segments few;
this job makes large files and does key compaction.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from conf import Settings
from delta_log.core.compaction_plan import plan_merge, surviving_rows
from delta_log.maintenance.compaction import compact_topic
from delta_log.table.storage import StorageRoot
from jobs.common import Progress, for_each_topic, job_settings, job_spark, planned_again

__all__ = ["CompactionJobReport", "main", "plan_merge", "run", "surviving_rows"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionJobReport:
    topics: list[dict[str, Any]]


def _one(root: str, storage_options: dict[str, str], topic: str, settings_json: str) -> dict[str, Any]:
    settings = Settings.model_validate_json(settings_json)
    storage = StorageRoot(root, storage_options)
    target = settings.jobs.compaction_target_bytes
    return planned_again(lambda: compact_topic(storage, topic, settings.writer, target_bytes=target))


def run(spark: Any, settings: Settings, *, topics: list[str] | None = None) -> CompactionJobReport:
    """Compact `topics` (default: all). `spark` None runs in this process."""
    progress = Progress("compaction", spark)
    results = for_each_topic(spark, settings, topics, _one, progress)
    for r in results:
        progress.say(
            f"{r['topic']}: {r['segments_before']} -> {r['segments_after']} segments, "
            f"{r['records_removed']} superseded records removed"
            + (f" CONFLICT: {r['conflict']}" if r["conflict"] else "")
        )
    return CompactionJobReport(topics=results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jobs.compaction", description=__doc__)
    ap.add_argument("--root")
    ap.add_argument("--topic", action="append")
    ap.add_argument("--target-mb", type=int, help="largest file the job writes (default jobs.compaction_target_bytes)")
    ap.add_argument("--local", action="store_true", help="run in this process, without Spark")
    args = ap.parse_args(argv)
    settings = job_settings(args.root)
    if args.target_mb:
        settings = settings.model_copy(
            update={"jobs": settings.jobs.model_copy(update={"compaction_target_bytes": args.target_mb * 1024 * 1024})}
        )
    with job_spark(settings, "topiclake-compaction", local=args.local) as spark:
        report = run(spark, settings, topics=args.topic)
    print(json.dumps({"topics": report.topics}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
