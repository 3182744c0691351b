"""Compaction: merge adjacent segments, and key compaction for cleanup.policy=compact topics.

Pure planning and filtering (`plan_merge`, `surviving_rows`) live in delta_log.core.compaction_plan;
this is the per-topic execution used by jobs/compaction.py.

- Merge: runs of >= 2 ADJACENT segments (by offset) whose total stays under `target_bytes` become one
  file sorted by offset, committed with dataChange=false: same records, same offsets (invariant 6);
  streaming readers see no new data.
- Key compaction (Kafka's log cleaner): in the segments older than min.compaction.lag.ms (never the
  newest segment of a partition), keep only the latest record of each key across the whole
  partition; a tombstone (null value) that is the latest for its key is kept until it is older than
  delete.retention.ms. Survivors keep their offsets; records without a key are kept. Committed with
  dataChange=true (records are removed, as in Kafka).

Commits go through delta_log.table.file_commit: beside live producers, and never twice on one file.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.transaction import AddAction, RemoveAction

from conf import WriterSettings
from delta_log.core.compaction_plan import latest_offsets, plan_merge, surviving_rows
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.core.segments import SegmentInfo
from delta_log.core.topic_config import TopicConfig
from delta_log.errors import SourcesGoneError
from delta_log.table.file_commit import commit_file_changes
from delta_log.table.segment_files import ParquetOptions, codec_of, remove_files, segments_of, write_segments
from delta_log.table.storage import StorageRoot


@dataclass(frozen=True, slots=True, kw_only=True)
class CompactionReport:
    topic: str
    segments_before: int
    segments_after: int
    records_removed: int
    committed: bool
    conflict: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "topic": self.topic,
            "segments_before": self.segments_before,
            "segments_after": self.segments_after,
            "records_removed": self.records_removed,
            "committed": self.committed,
            "conflict": self.conflict,
        }


def _read(storage: StorageRoot, uri: str, seg: SegmentInfo, columns: list[str] | None = None) -> pa.Table:
    fs, _ = storage.filesystem()
    with fs.open_input_file(storage.file_path(uri, seg.path)) as f:
        return pq.read_table(f, columns=columns)


def compact_topic(
    storage: StorageRoot,
    topic: str,
    settings: WriterSettings,
    *,
    target_bytes: int,
    now_ms: int | None = None,
) -> CompactionReport:
    """Merge adjacent segments; on compacted topics also drop superseded records. Raises: TopicNotFoundError."""
    dt = storage.open_topic(topic)
    uri = storage.topic_uri(topic)
    config = TopicConfig.from_properties(dt.metadata().configuration)
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    options = ParquetOptions.of(settings)
    by_partition = segments_of(dt)
    before = sum(len(v) for v in by_partition.values())
    key_compaction = "compact" in config.cleanup_policy
    actions: list[AddAction | RemoveAction] = []
    removed_paths: list[str] = []
    written: list[str] = []
    removed_records = 0
    after = before
    stamp = int(time.time() * 1000)
    for partition, segments in sorted(by_partition.items()):
        ordered = sorted(segments, key=lambda s: s.first_offset)
        if key_compaction:
            lag_ms = int(config.values.get("min.compaction.lag.ms", "0"))
            dirty = [s for s in ordered[:-1] if s.max_timestamp_ms <= now_ms - lag_ms]  # never the newest
            if not dirty:
                continue
            keys_and_offsets = [_read(storage, uri, s, ["key", "offset"]) for s in ordered]
            everything = pa.concat_tables(keys_and_offsets)
            latest = latest_offsets(everything.column("key").to_pylist(), everything.column("offset").to_pylist())
            runs = [tuple(dirty)]
        else:
            runs = plan_merge(ordered, target_bytes=target_bytes)
        for run in runs:
            pieces = [_read(storage, uri, s) for s in run]
            table = pa.concat_tables(pieces).sort_by("offset")
            n_before = table.num_rows
            if key_compaction:
                table = surviving_rows(
                    table, latest, now_ms=now_ms, delete_retention_ms=int(config.values["delete.retention.ms"])
                )
            removed_records += n_before - table.num_rows
            if table.num_rows:
                table = table.append_column("partition", pa.array([partition] * table.num_rows, pa.int32()))
                files = write_segments(
                    storage,
                    uri,
                    table.select(TOPIC_SCHEMA.names).cast(TOPIC_SCHEMA),
                    options,
                    first_offset=run[0].first_offset,
                    codecs={partition: codec_of(pieces)},
                )
            else:
                files = []
            data_change = key_compaction and n_before != table.num_rows
            for w in files:
                written.append(w.relative_path)
                actions.append(
                    AddAction(
                        w.action.path, w.action.size, w.action.partition_values, stamp, data_change, w.action.stats
                    )
                )
            for seg in run:
                removed_paths.append(seg.path)
                actions.append(
                    RemoveAction(seg.path, data_change, stamp, seg.size_bytes, {"partition": str(partition)})
                )
            after += len(files) - len(run)
    if not actions:
        return CompactionReport(
            topic=topic, segments_before=before, segments_after=before, records_removed=0, committed=False
        )
    try:
        commit_file_changes(dt, removed_paths, actions, operation="compaction", attempts=settings.max_commit_attempts)
    except SourcesGoneError as exc:
        remove_files(storage, uri, written)
        return CompactionReport(
            topic=topic,
            segments_before=before,
            segments_after=before,
            records_removed=0,
            committed=False,
            conflict=str(exc),
        )
    return CompactionReport(
        topic=topic, segments_before=before, segments_after=after, records_removed=removed_records, committed=True
    )
