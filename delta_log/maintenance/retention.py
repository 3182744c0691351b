"""Retention: drop whole oldest segments past retention.ms / retention.bytes.

`plan_retention` (delta_log.core.retention_plan) is pure: it removes a PREFIX of a partition's segments (never a hole, invariant 7),
by Kafka's rules — a segment goes when its newest record is older than retention.ms, or while the
partition without it is still at least retention.bytes. Consumer-aware: records some consumer group
has not consumed yet (at or above its lowest committed offset) are reported, and kept when the topic
sets retention.protect.unconsumed=true.

`apply_retention` commits the removals (dataChange=true) through `file_commit`, beside live writers:
appends are never refused by it and it never removes a file twice. The log start offset advances to
the first remaining offset (or the high watermark when nothing remains). Files are physically
deleted by vacuum after delta.deletedFileRetentionDuration, so readers mid-fetch keep working.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass

from deltalake.transaction import RemoveAction

from conf import WriterSettings
from delta_log.core.retention_plan import PartitionRetention, plan_retention
from delta_log.core.topic_config import TopicConfig
from delta_log.errors import SourcesGoneError
from delta_log.table.app_transactions import read_high_watermark
from delta_log.table.file_commit import commit_file_changes
from delta_log.table.segment_files import segments_of
from delta_log.table.storage import StorageRoot


@dataclass(frozen=True, slots=True, kw_only=True)
class RetentionReport:
    topic: str
    partitions: tuple[PartitionRetention, ...]
    committed: bool
    conflict: str | None = None

    @property
    def records_removed(self) -> int:
        return sum(p.records for p in self.partitions) if self.committed else 0

    @property
    def bytes_removed(self) -> int:
        return sum(p.bytes for p in self.partitions) if self.committed else 0

    def to_dict(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "committed": self.committed,
            "conflict": self.conflict,
            "records_removed": self.records_removed,
            "bytes_removed": self.bytes_removed,
            "partitions": [
                {
                    "partition": p.partition,
                    "segments_removed": len(p.remove),
                    "records_removed": p.records,
                    "log_start_offset": p.log_start_offset,
                    "unconsumed_records": p.unconsumed_records,
                    "protected": p.protected,
                }
                for p in self.partitions
            ],
        }


def apply_retention(
    storage: StorageRoot,
    topic: str,
    settings: WriterSettings,
    *,
    now_ms: int | None = None,
    lowest_committed: Mapping[int, int] | None = None,
) -> RetentionReport:
    """Plan and commit retention for one topic. Raises: TopicNotFoundError, StorageUnavailableError."""
    dt = storage.open_topic(topic)
    config = TopicConfig.from_properties(dt.metadata().configuration)
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    plans = []
    for partition, segments in sorted(segments_of(dt).items()):
        hw = read_high_watermark(dt, partition)
        plans.append(
            plan_retention(
                segments,
                partition=partition,
                now_ms=now_ms,
                retention_ms=config.retention_ms,
                retention_bytes=config.retention_bytes,
                high_watermark=hw,
                lowest_committed=(lowest_committed or {}).get(partition),
                protect_unconsumed=config.values.get("retention.protect.unconsumed") == "true",
            )
        )
    plans = [p for p in plans if p.remove or p.protected]
    doomed = [s for p in plans for s in p.remove]
    if not doomed:
        return RetentionReport(topic=topic, partitions=tuple(plans), committed=False)
    now = int(time.time() * 1000)
    actions = [RemoveAction(s.path, True, now, s.size_bytes, {"partition": str(s.partition)}) for s in doomed]
    try:
        commit_file_changes(
            dt, [s.path for s in doomed], list(actions), operation="retention", attempts=settings.max_commit_attempts
        )
    except SourcesGoneError as exc:
        return RetentionReport(topic=topic, partitions=tuple(plans), committed=False, conflict=str(exc))
    return RetentionReport(topic=topic, partitions=tuple(plans), committed=True)
