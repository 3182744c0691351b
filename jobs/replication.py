"""Replication job: mirror every topic, its config and committed group offsets to a replica root.

    python -m jobs.replication --replica DIR_OR_URI [--root DIR] [--topic T ...] [--local]
    spark-submit jobs/replication.py --root s3://primary/topiclake --replica s3://dr/topiclake
    topiclake jobs replication --replica /mnt/other-disk/topiclake
    topiclake replica promote --root /mnt/other-disk/topiclake     # after losing the primary

Incremental and offset-preserving (see delta_log.maintenance.replication): each run copies what the source
committed since the last run, one Spark task per topic (`--local`: in this process), then the
committed group offsets. The replica root is marked as a replica; a server refuses to serve it
until `topiclake replica promote`, after which producers continue at the replicated high
watermarks and groups resume from their replicated commits.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass
from typing import Any

from conf import Settings
from conf.settings import object_store_options
from delta_log.log.catalog import Catalog
from delta_log.maintenance.replication import (
    check_replica_target,
    plan_replication,
    promote,
    read_marker,
    replicate_offsets,
    replicate_topic,
    write_marker,
)
from delta_log.table.storage import StorageRoot
from jobs.common import Progress, for_each_topic, job_settings, job_spark

__all__ = ["ReplicationReport", "main", "plan_replication", "promote", "run"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicationReport:
    replica: str
    topics: list[dict[str, Any]]
    offsets_copied: int
    seconds: float

    @property
    def bytes_copied(self) -> int:
        return sum(int(t["bytes_copied"]) for t in self.topics)

    @property
    def records_copied(self) -> int:
        return sum(int(t["records_copied"]) for t in self.topics)

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica": self.replica,
            "records_copied": self.records_copied,
            "bytes_copied": self.bytes_copied,
            "offsets_copied": self.offsets_copied,
            "seconds": round(self.seconds, 3),
            "topics": self.topics,
        }


def with_replica(settings: Settings, replica_root: str) -> Settings:
    """`settings` replicating to `replica_root`, its storage options completed from the AWS
    environment as the settings' own replica root's are."""
    options = object_store_options(replica_root, dict(settings.jobs.replica_storage_options))
    jobs = settings.jobs.model_copy(update={"replica_root": replica_root, "replica_storage_options": options})
    return settings.model_copy(update={"jobs": jobs})


def _replica_of(settings: Settings) -> StorageRoot:
    if not settings.jobs.replica_root:
        raise SystemExit("jobs.replication: no replica root; pass --replica or set jobs.replica_root")
    return StorageRoot(settings.jobs.replica_root, settings.jobs.replica_storage_options)


def _one(root: str, storage_options: dict[str, str], topic: str, settings_json: str) -> dict[str, Any]:
    settings = Settings.model_validate_json(settings_json)
    report = replicate_topic(StorageRoot(root, storage_options), _replica_of(settings), topic, settings.writer)
    return report.to_dict()


def run(spark: Any, settings: Settings, *, topics: list[str] | None = None) -> ReplicationReport:
    """Replicate `topics` (default: all) to `settings.jobs.replica_root`. Raises: ReplicaStateError."""
    started = time.monotonic()
    source = StorageRoot(settings.root, settings.storage_options)
    replica = _replica_of(settings)
    check_replica_target(source, replica, settings.writer)
    marker = read_marker(replica) or {"source": source.root, "promoted": False}
    write_marker(replica, {**marker, "run_started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    names = topics if topics is not None else Catalog(source, settings.writer).list_topics()
    progress = Progress("replication", spark)
    results = for_each_topic(spark, settings, names, _one, progress)
    for r in results:
        progress.say(
            f"{r['topic']}: copied {r['records_copied']} records ({r['bytes_copied']} bytes, {r['files_copied']} files)"
            + (
                f", {r['records_skipped']} records expired at the source before replication"
                if r["records_skipped"]
                else ""
            )
        )
    offsets = replicate_offsets(source, replica)  # after the records: a replicated commit never points past them
    progress.say(f"copied {offsets} committed group offsets")
    write_marker(replica, {**marker, "last_run_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    return ReplicationReport(
        replica=replica.root, topics=results, offsets_copied=offsets, seconds=time.monotonic() - started
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="jobs.replication", description=__doc__)
    ap.add_argument("--root")
    ap.add_argument("--replica", help="replica root (default jobs.replica_root)")
    ap.add_argument("--topic", action="append")
    ap.add_argument("--local", action="store_true", help="run in this process, without Spark")
    args = ap.parse_args(argv)
    settings = job_settings(args.root)
    if args.replica:
        settings = with_replica(settings, args.replica)
    with job_spark(settings, "topiclake-replication", local=args.local) as spark:
        report = run(spark, settings, topics=args.topic)
    print(json.dumps(report.to_dict(), indent=2))
    return 0


def promote_main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="topiclake replica promote")
    ap.add_argument("--root", required=True, help="the replica root to make the primary")
    args = ap.parse_args(argv)
    settings = job_settings(args.root)
    marker = promote(StorageRoot(settings.root, settings.storage_options), settings.writer)
    print(json.dumps(marker, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
