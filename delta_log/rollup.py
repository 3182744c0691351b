"""Segment roll-up: keep a topic's file count small so commit latency stays flat as it ages.

Measured (bench/log_bench.py, docs/DESIGN.md): delta-rs commit + refresh time grows with the number
of data files in the snapshot (7.9 + 7.1 ms at 100 files, 17.7 + 16.4 ms at 10,000), whatever the
log retention. One small file per commit would make a topic slower every hour. So the server rolls
up its own small segments, with delta-rs only (no Spark needed in embedded mode):

- `plan_rollup` (pure) picks runs of `fanout` ADJACENT segments (by offset) of the same size tier
  whose merged size stays under `max_bytes` (size-tiered, like an LSM: write amplification is
  about log_fanout(max/base), the file count about fanout per tier).
- `SegmentRoller` (I/O) merges a run into one file sorted by offset and commits add + remove
  actions with dataChange=false: offsets, records and order are unchanged (invariant 6), and
  streaming readers see no new data. Replaced files stay on disk until vacuum
  (delta.deletedFileRetentionDuration), so readers holding an older index keep working.

Concurrency contract: one roller thread per topic with its own table object, beside the writer.
Its commits touch no `hw-<p>` transaction and only remove files it planned from its snapshot; a
conflict (a job removed one of them meanwhile) abandons that run and deletes the unused new file.
It also runs expired-log cleanup and vacuum, periodically, never on the produce path.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from conf import WriterSettings
from delta_log.file_commit import SourcesGoneError, commit_file_changes
from delta_log.log_cleanup import cleanup_log
from delta_log.records import TOPIC_SCHEMA
from delta_log.retention import apply_retention
from delta_log.segment_files import ParquetOptions, WrittenSegment, remove_files, write_segments
from delta_log.segments import SegmentInfo, segments_of
from delta_log.storage import StorageRoot

log = logging.getLogger(__name__)


def size_tier(size_bytes: int, *, base_bytes: int, fanout: int) -> int:
    """0 below `base_bytes`, then one tier per factor of `fanout`."""
    if size_bytes < base_bytes:
        return 0
    return 1 + int(math.log(size_bytes / base_bytes, fanout))


def plan_rollup(
    segments: Sequence[SegmentInfo], *, fanout: int, base_bytes: int, max_bytes: int
) -> list[tuple[SegmentInfo, ...]]:
    """Runs of `fanout` adjacent small segments of one partition to merge (pure).

    Only segments below `base_bytes` are merged (measured: re-merging ~1 MB flush files took 44% of
    the server's busy time under Arrow load); larger ones are the Spark compaction job's. So a byte
    is rewritten about log_fanout(base/commit size) times while small, never after. `segments` are
    one partition's files in any order; runs never overlap; a run's merged size is <= `max_bytes`.
    """
    ordered = sorted(segments, key=lambda s: s.first_offset)
    runs: list[tuple[SegmentInfo, ...]] = []
    i = 0
    while i + fanout <= len(ordered):
        window = ordered[i : i + fanout]
        tiers = {size_tier(s.size_bytes, base_bytes=base_bytes, fanout=fanout) for s in window}
        small = all(s.size_bytes < base_bytes for s in window)
        if small and len(tiers) == 1 and sum(s.size_bytes for s in window) <= max_bytes:
            runs.append(tuple(window))
            i += fanout
        else:
            i += 1
    return runs


@dataclass(frozen=True, slots=True, kw_only=True)
class RollupReport:
    runs: int
    files_removed: int
    files_added: int
    conflicts: int


class SegmentRoller:
    """Rolls up small segments of one topic in a background thread (see module docstring)."""

    def __init__(
        self,
        storage: StorageRoot,
        topic: str,
        settings: WriterSettings,
        *,
        lowest_committed: Callable[[str], dict[int, int]] | None = None,
    ) -> None:
        self.storage = storage
        self.topic = topic
        self.settings = settings
        self.uri = storage.topic_uri(topic)
        self._options = ParquetOptions(
            row_group_rows=settings.max_row_group_rows, compression=settings.compression.lower()
        )
        self._dt: DeltaTable | None = None
        self._cond = threading.Condition()
        self._pending_commits = 0
        self._closed = False
        self._last_vacuum = time.monotonic()
        self._last_retention = 0.0
        self.lowest_committed = lowest_committed
        self.retention_reports: list[Any] = []
        self._commits_since_cleanup = 0
        self._pass_lock = threading.Lock()  # one maintenance pass at a time
        self.reports: list[RollupReport] = []
        self._thread = threading.Thread(target=self._run, name=f"rollup-{topic}", daemon=True)
        self._thread.start()

    def notify_commit(self, *_: object) -> None:
        """Called after each writer commit; wakes the roller every `rollup_every_commits`."""
        with self._cond:
            self._pending_commits += 1
            if self._pending_commits >= self.settings.rollup_every_commits:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and self._pending_commits < self.settings.rollup_every_commits:
                    self._cond.wait(self.settings.maintenance_interval_s)
                    if self._pending_commits:
                        break
                if self._closed:
                    return
                commits, self._pending_commits = self._pending_commits, 0
            try:
                self.run_once(commits)
            except Exception:
                log.exception("maintenance of topic %s failed; will retry", self.topic)

    def run_once(self, commits: int = 0) -> RollupReport:
        """One maintenance pass: roll-ups, then (when due) log cleanup and vacuum."""
        with self._pass_lock:
            return self._pass(commits)

    def _pass(self, commits: int) -> RollupReport:
        dt = self._table()
        report = self.rollup(dt)
        self._commits_since_cleanup += commits + report.runs
        if self._commits_since_cleanup >= self.settings.cleanup_every_commits:
            self._commits_since_cleanup = 0
            cleanup_log(
                self.storage,
                self.uri,
                keep_versions=self.settings.log_keep_versions,
                min_age_s=self.settings.log_min_age_s,
            )
        if time.monotonic() - self._last_retention >= self.settings.retention_check_interval_s:
            self._last_retention = time.monotonic()
            committed = self.lowest_committed(self.topic) if self.lowest_committed else None
            retention = apply_retention(self.storage, self.topic, self.settings, lowest_committed=committed)
            if retention.committed or retention.conflict:
                self.retention_reports = [*self.retention_reports[-99:], retention]
                log.info("retention on %s: %s", self.topic, retention.to_dict())
        if time.monotonic() - self._last_vacuum >= self.settings.vacuum_interval_s:
            self._last_vacuum = time.monotonic()
            dt.vacuum(dry_run=False, enforce_retention_duration=True)
        return report

    def _table(self) -> DeltaTable:
        if self._dt is None:
            self._dt = self.storage.open_table(self.uri)
        else:
            self._dt.update_incremental()
        return self._dt

    def rollup(self, dt: DeltaTable) -> RollupReport:
        """Plan every due run, write the merged files, commit them all in ONE commit.

        One commit per pass, not per run: each roll-up commit makes the writer's next commit
        rebase past it (measured: per-run commits every 8 writer commits hurt produce latency).
        A conflict abandons the pass; its files are deleted and the next pass plans again.
        """
        plan = [
            (partition, run)
            for partition, segments in sorted(segments_of(dt).items())
            for run in plan_rollup(
                segments,
                fanout=self.settings.rollup_fanout,
                base_bytes=self.settings.rollup_base_bytes,
                max_bytes=self.settings.rollup_max_bytes,
            )
        ]
        if not plan or self._closed:
            return RollupReport(runs=0, files_removed=0, files_added=0, conflicts=0)
        actions: list[AddAction | RemoveAction] = []
        written: list[str] = []
        now_ms = int(time.time() * 1000)
        try:
            for partition, run in plan:
                for w in self._write_merged(partition, run):
                    written.append(w.relative_path)
                    actions.append(
                        AddAction(
                            w.action.path, w.action.size, w.action.partition_values, now_ms, False, w.action.stats
                        )
                    )
                actions.extend(
                    RemoveAction(seg.path, False, now_ms, seg.size_bytes, {"partition": str(partition)}) for seg in run
                )
            commit_file_changes(
                dt,
                [seg.path for _, run in plan for seg in run],
                actions,
                operation="rollup",
                attempts=self.settings.max_commit_attempts,
            )
        except (CommitFailedError, SourcesGoneError) as exc:
            remove_files(self.storage, self.uri, written)
            dt.update_incremental()
            log.info("roll-up pass of %s abandoned after a conflict: %s", self.topic, exc)
            report = RollupReport(runs=0, files_removed=0, files_added=0, conflicts=1)
        except BaseException:
            remove_files(self.storage, self.uri, written)
            raise
        else:
            report = RollupReport(
                runs=len(plan), files_removed=sum(len(r) for _, r in plan), files_added=len(written), conflicts=0
            )
        self.reports.append(report)
        del self.reports[:-100]
        return report

    def _write_merged(self, partition: int, run: tuple[SegmentInfo, ...]) -> list[WrittenSegment]:
        fs, _ = self.storage.filesystem()
        tables = []
        for seg in run:
            with fs.open_input_file(self.storage.file_path(self.uri, seg.path)) as f:
                tables.append(pq.read_table(f))
        merged = pa.concat_tables(tables).sort_by("offset")
        n = merged.num_rows
        merged = merged.append_column("partition", pa.array([partition] * n, pa.int32())).select(TOPIC_SCHEMA.names)
        return write_segments(self.storage, self.uri, merged.cast(TOPIC_SCHEMA), self._options)

    def close(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
