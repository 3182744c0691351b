"""Retention job: drop whole oldest segments past retention.ms / retention.bytes on every topic.

    python -m jobs.retention [--root DIR] [--topic T ...] [--local]
    spark-submit jobs/retention.py --root s3://bucket/topiclake
    topiclake jobs retention

With Spark (the default), topics are spread over the executors, one task each; `--local` runs in
this process. Planning is `delta_log.core.retention_plan.plan_retention` (pure); the removal commits are
safe beside live producers and consumers (see delta_log.maintenance.retention). `topiclake serve` also applies
retention itself every `maintenance.retention_interval_s`, the interval this job is scheduled at too.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any

from conf import Settings
from delta_log.core.lag import lowest_committed
from delta_log.core.retention_plan import plan_retention
from delta_log.maintenance.retention import apply_retention
from delta_log.system.offsets import OffsetStore
from delta_log.table.storage import StorageRoot
from jobs.common import Progress, for_each_topic, job_settings, job_spark, planned_again

__all__ = ["JobReport", "main", "plan_retention", "run"]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobReport:
    topics: list[dict[str, Any]]

    @property
    def records_removed(self) -> int:
        return sum(int(t["records_removed"]) for t in self.topics)


def _one(root: str, storage_options: dict[str, str], topic: str, settings_json: str) -> dict[str, Any]:
    settings = Settings.model_validate_json(settings_json)
    storage = StorageRoot(root, storage_options)
    lowest = lowest_committed(OffsetStore(storage).all_committed(), topic)
    return planned_again(lambda: apply_retention(storage, topic, settings.writer, lowest_committed=lowest))


def run(spark: Any, settings: Settings, *, topics: list[str] | None = None) -> JobReport:
    """Apply retention to `topics` (default: all). `spark` None runs in this process."""
    progress = Progress("retention", spark)
    results = for_each_topic(spark, settings, topics, _one, progress)
    for r in results:
        progress.say(
            f"{r['topic']}: removed {r['records_removed']} records ({r['bytes_removed']} bytes)"
            + (f" CONFLICT: {r['conflict']}" if r["conflict"] else "")
        )
    return JobReport(topics=results)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jobs.retention", description=__doc__)
    ap.add_argument("--root")
    ap.add_argument("--topic", action="append")
    ap.add_argument("--local", action="store_true", help="run in this process, without Spark")
    args = ap.parse_args(argv)
    settings = job_settings(args.root)
    with job_spark(settings, "topiclake-retention", local=args.local) as spark:
        report = run(spark, settings, topics=args.topic)
    print(json.dumps({"records_removed": report.records_removed, "topics": report.topics}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
