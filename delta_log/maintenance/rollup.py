"""Segment roll-up: keep a topic's file count small so commit latency stays flat as it ages.

Measured (bench/log_bench.py, docs/DESIGN.md): delta-rs commit + refresh time grows with the number
of data files in the snapshot (7.9 + 7.1 ms at 100 files, 17.7 + 16.4 ms at 10,000), whatever the
log retention. One small file per commit would make a topic slower every hour. So the server rolls
up its own small segments, with delta-rs only (no Spark needed in embedded mode):

- `plan_rollup` (pure) picks runs of `fanout` to 4 x `fanout` ADJACENT segments (by offset) of one
  size tier below `base_bytes` whose merged size stays under `max_bytes` (size-tiered, like an
  LSM: a byte is rewritten about log_fanout(base / its commit's size) times).
- `roll_up` (I/O) merges a run into one file sorted by offset and commits add + remove
  actions with dataChange=false: offsets, records and order are unchanged (invariant 6), and
  streaming readers see no new data. Replaced files stay on disk until vacuum
  (delta.deletedFileRetentionDuration), so readers holding an older index keep working.

Concurrency contract: called by the topic's maintenance loop (delta_log.maintenance.topic_maintenance)
with its own table object, beside the writer. Its commits touch no `hw-<p>` transaction and only
remove files it planned from its snapshot; a conflict (a job removed one of them meanwhile)
abandons the pass and deletes the unused new files.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from conf import MaintenanceSettings
from delta_log.core.records import TOPIC_SCHEMA
from delta_log.core.rollup_plan import plan_rollup
from delta_log.core.segments import SegmentInfo
from delta_log.errors import SourcesGoneError
from delta_log.log.reader import FollowedLog
from delta_log.table.file_commit import commit_file_changes, commit_own_file_changes
from delta_log.table.segment_files import (
    ParquetOptions,
    WrittenSegment,
    codec_of,
    merge_segments,
    remove_files,
    segments_of,
    write_segments,
)
from delta_log.table.storage import StorageRoot

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class RollupReport:
    runs: int
    files_removed: int
    files_added: int
    conflicts: int


def roll_up(
    storage: StorageRoot,
    uri: str,
    table: DeltaTable | FollowedLog,
    settings: MaintenanceSettings,
    *,
    parquet: ParquetOptions,
    attempts: int,
    closing: Callable[[], bool] = lambda: False,
    partitions: Collection[int] | None = None,
) -> RollupReport:
    """Plan every due run (of `partitions` only, when given), write the merged files, commit them
    all in ONE commit.

    `table`: the table object (planned on its snapshot, committed by `commit_file_changes`), or a
    reader's index of a log it follows (local disk: planned on the index, and the entry written
    on its version, with no delta-rs snapshot read at all: measured under ProducerPerformance,
    the delta-rs threads' CPU went from 0.75-0.90 to 0.34-0.36 ms per MB).

    One commit per pass, not per run: each roll-up commit makes the writer's next commit
    rebase past it (measured: per-run commits every 8 writer commits hurt produce latency).
    A conflict abandons the pass; its files are deleted and the next pass plans again.
    """
    live = table.segments if isinstance(table, FollowedLog) else segments_of(table)
    plan = [
        (partition, run)
        for partition, segments in sorted(live.items())
        if partitions is None or partition in partitions
        for run in plan_rollup(
            segments,
            fanout=settings.rollup_fanout,
            base_bytes=settings.rollup_base_bytes,
            max_bytes=settings.rollup_max_bytes,
        )
    ]
    if not plan or closing():
        return RollupReport(runs=0, files_removed=0, files_added=0, conflicts=0)
    actions: list[AddAction | RemoveAction] = []
    written: list[str] = []
    now_ms = int(time.time() * 1000)
    try:
        for partition, run in plan:
            for w in _write_merged(storage, uri, partition, run, parquet):
                written.append(w.relative_path)
                actions.append(
                    AddAction(w.action.path, w.action.size, w.action.partition_values, now_ms, False, w.action.stats)
                )
            actions.extend(
                RemoveAction(seg.path, False, now_ms, seg.size_bytes, {"partition": str(partition)}) for seg in run
            )
        removes = [seg.path for _, run in plan for seg in run]
        if isinstance(table, FollowedLog):
            commit_own_file_changes(
                table.log_dir, table.version, removes, actions, operation="rollup", attempts=attempts
            )
        else:
            commit_file_changes(table, removes, actions, operation="rollup", attempts=attempts)
    except (CommitFailedError, SourcesGoneError) as exc:  # StaleVersionError too
        remove_files(storage, uri, written)
        if not isinstance(table, FollowedLog):
            table.update_incremental()
        log.info("roll-up pass of %s abandoned after a conflict: %s", uri, exc)
        report = RollupReport(runs=0, files_removed=0, files_added=0, conflicts=1)
    except BaseException:
        remove_files(storage, uri, written)
        raise
    else:
        report = RollupReport(
            runs=len(plan), files_removed=sum(len(r) for _, r in plan), files_added=len(written), conflicts=0
        )
    return report


def _write_merged(
    storage: StorageRoot, uri: str, partition: int, run: tuple[SegmentInfo, ...], parquet: ParquetOptions
) -> list[WrittenSegment]:
    # encoded column chunks copied, nothing decoded or encoded, where merge_segments can (it checks
    # the order itself, from the files' row groups)
    if merged_file := merge_segments(storage, uri, partition, [s.path for s in run], parquet):
        return [merged_file]
    fs, _ = storage.filesystem()
    tables = []
    for seg in run:
        with fs.open_input_file(storage.file_path(uri, seg.path)) as f:
            tables.append(pq.ParquetFile(f).read())  # not read_table: its dataset set-up is Python, per file
    merged = pa.concat_tables(tables)
    offsets = merged.column("offset").to_numpy()
    if len(offsets) > 1 and not (offsets[1:] > offsets[:-1]).all():  # runs are adjacent: sorted unless a job wrote it
        merged = merged.sort_by("offset")
    n = merged.num_rows
    merged = merged.append_column("partition", pa.array([partition] * n, pa.int32())).select(TOPIC_SCHEMA.names)
    return write_segments(storage, uri, merged.cast(TOPIC_SCHEMA), parquet, codecs={partition: codec_of(tables)})
