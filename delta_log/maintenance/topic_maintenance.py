"""One maintenance loop per active topic: every task the server runs on a topic, called by name.

    rollup       merge small adjacent segments (delta_log.maintenance.rollup), after every
                 `rollup_every_commits` commits or every `interval_s`; of the partitions
                 `rollup_scope` names, when given (with several gateways each partition's owner
                 keeps it compact: every gateway rolling up every partition doubled the work and
                 lost passes to each other's commits)
    log_cleanup  delete old `_delta_log` files (delta_log.maintenance.log_cleanup), every
                 `cleanup_every_commits` commits (the writer's plus the roll-up's)
    retention    drop whole oldest segments (delta_log.maintenance.retention), every
                 `retention_interval_s`
    vacuum       delete files no version references any more, every `vacuum_interval_s`

Concurrency contract: passes run on a `MaintenanceScheduler` shared by every topic of the process
(`maintenance.threads` threads plus one timer thread: an idle topic holds no thread), with the
topic's own table object, beside the writer, never on the produce path; one pass of a topic at a
time (`run_once` and `run_task` share a lock). A topic asks for a pass after
`rollup_every_commits` commits, or `interval_s` after the first commit since its last pass. Every task commits
only file changes, never a `hw-<p>` transaction, so producers' commits are not refused because of
it; its conflicts are its own to retry at the next pass.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Collection
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from deltalake import DeltaTable

from conf import MaintenanceSettings, ReaderSettings, WriterSettings
from delta_log.log.reader import FollowedLog, TopicReader
from delta_log.maintenance.log_cleanup import cleanup_log
from delta_log.maintenance.retention import RetentionReport, apply_retention
from delta_log.maintenance.rollup import RollupReport, roll_up
from delta_log.table.segment_files import ParquetOptions
from delta_log.table.storage import StorageRoot

log = logging.getLogger(__name__)

Task = Literal["rollup", "log_cleanup", "retention", "vacuum"]
TASKS: tuple[Task, ...] = ("rollup", "log_cleanup", "retention", "vacuum")
_KEEP_REPORTS = 100
#: the roll-up's reader only follows the log: it keeps no records or decoded row groups
_FOLLOWER = ReaderSettings(tail_cache_bytes=0, row_group_cache_bytes=0)


class MaintenanceScheduler:
    """Runs the maintenance passes of many topics on a few shared threads. One timer thread sleeps
    until the earliest pass asked for later (woken early when an earlier one is asked for)."""

    def __init__(self, threads: int, *, name: str = "maintenance") -> None:
        self._executor = ThreadPoolExecutor(max_workers=threads, thread_name_prefix=name)
        self._cond = threading.Condition()
        self._timers: list[tuple[float, int, TopicMaintenance]] = []
        self._seq = itertools.count()
        self._closed = False
        self._thread = threading.Thread(target=self._run_timers, name=f"{name}-timer", daemon=True)
        self._thread.start()

    def now(self, maintenance: TopicMaintenance) -> None:
        self._executor.submit(maintenance._scheduled_pass)

    def at(self, when: float, maintenance: TopicMaintenance) -> None:
        with self._cond:
            heapq.heappush(self._timers, (when, next(self._seq), maintenance))
            self._cond.notify()

    def _run_timers(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (not self._timers or self._timers[0][0] > time.monotonic()):
                    self._cond.wait(self._timers[0][0] - time.monotonic() if self._timers else None)
                if self._closed:
                    return
                _, _, due = heapq.heappop(self._timers)
            due._timer_due()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        self._executor.shutdown(wait=True)


@dataclass(frozen=True, slots=True)
class MaintenanceClock:
    last_run: dict[Task, float]
    commits_since_cleanup: int


class TopicMaintenance:
    """The maintenance of one topic (see module docstring)."""

    def __init__(
        self,
        storage: StorageRoot,
        topic: str,
        settings: MaintenanceSettings,
        writer: WriterSettings,
        *,
        lowest_committed: Callable[[str], dict[int, int]] | None = None,
        background: bool = True,
        scheduler: MaintenanceScheduler | None = None,
        carried: MaintenanceClock | None = None,
        rollup_scope: Callable[[], Collection[int] | None] | None = None,
    ) -> None:
        """`background`: passes run by themselves, on `scheduler` (one of this topic's own if
        none); otherwise only when `run_once`/`run_task` are called. `carried`: the clock of this
        topic's previous maintenance in this process (see `clock`), so a topic released as idle
        and opened again still reaches its log cleanup and vacuum."""
        self.storage = storage
        self.topic = topic
        self.settings = settings
        self.writer = writer
        self.uri = storage.topic_uri(topic)
        self.lowest_committed = lowest_committed
        self.rollup_scope = rollup_scope  # the partitions to roll up (this gateway's); None: all
        self._parquet = ParquetOptions.of(writer)
        self._dt: DeltaTable | None = None
        self._follower: TopicReader | None = None
        self._lock = threading.Condition()
        self._pending_commits = 0
        self._commits_since_cleanup = 0
        self._closed = False
        self._queued = False  # a pass is queued on, or running in, the scheduler
        self._timer_set = False
        self._last_run: dict[Task, float] = {"retention": 0.0, "vacuum": time.monotonic()}
        self._pass_lock = threading.Lock()
        if carried is not None:
            self._last_run = dict(carried.last_run)
            self._commits_since_cleanup = carried.commits_since_cleanup
        self.rollup_reports: list[RollupReport] = []
        self.retention_reports: list[RetentionReport] = []
        self._own_scheduler = background and scheduler is None
        self._scheduler = scheduler or (MaintenanceScheduler(1, name=f"maintenance-{topic}") if background else None)

    # -- scheduling ------------------------------------------------------------------------------
    def notify_commit(self, *_: object) -> None:
        """Called after each writer commit: a pass now after `rollup_every_commits`, else in
        `interval_s` from the first commit since the last pass."""
        with self._lock:
            if self._closed:
                return
            self._pending_commits += 1
            plan = self._plan()
        self._ask(plan)

    def _plan(self) -> Literal["now", "later"] | None:
        """With the lock held: what to ask the scheduler for, given the commits pending."""
        if self._closed or self._scheduler is None or self._queued or not self._pending_commits:
            return None
        if self._pending_commits >= self.settings.rollup_every_commits:
            self._queued = True
            return "now"
        if not self._timer_set:
            self._timer_set = True
            return "later"
        return None

    def _ask(self, plan: Literal["now", "later"] | None) -> None:
        if self._scheduler is None or plan is None:
            return
        if plan == "now":
            self._scheduler.now(self)
        else:
            self._scheduler.at(time.monotonic() + self.settings.interval_s, self)

    def _timer_due(self) -> None:
        with self._lock:
            self._timer_set = False
            if self._closed or self._queued or not self._pending_commits:
                return
            self._queued = True
        self._ask("now")

    def _scheduled_pass(self) -> None:
        with self._lock:
            commits, self._pending_commits = self._pending_commits, 0
        try:
            if commits and not self._closed:
                self.run_once(commits)
        except Exception:
            log.exception("maintenance of topic %s failed; will retry", self.topic)
        finally:
            with self._lock:
                self._queued = False
                self._lock.notify_all()  # close() waits for a running pass
                plan = self._plan()  # commits that came during the pass
            self._ask(plan)

    @property
    def busy(self) -> bool:
        """A pass is running or due (commits wait for their roll-up)."""
        return self._scheduler is not None and (self._queued or self._timer_set or self._pending_commits > 0)

    def clock(self) -> MaintenanceClock:
        """When each task last ran and the commits since the last log cleanup, to carry over."""
        with self._lock:
            return MaintenanceClock(last_run=dict(self._last_run), commits_since_cleanup=self._commits_since_cleanup)

    def due(self, now: float) -> list[Task]:
        """The tasks a pass runs now, in order (roll-up first: the cleanup counts its commit)."""
        tasks: list[Task] = ["rollup"]
        if self._commits_since_cleanup >= self.settings.cleanup_every_commits:
            tasks.append("log_cleanup")
        if now - self._last_run["retention"] >= self.settings.retention_interval_s:
            tasks.append("retention")
        if now - self._last_run["vacuum"] >= self.settings.vacuum_interval_s:
            tasks.append("vacuum")
        return tasks

    # -- passes ----------------------------------------------------------------------------------
    def run_once(self, commits: int = 0) -> dict[Task, Any]:
        """One pass: every due task, in order; returns each task's result by name."""
        with self._pass_lock:
            self._commits_since_cleanup += commits
            now = time.monotonic()
            results: dict[Task, Any] = {}
            for task in TASKS:
                if task in self.due(now):  # asked again after each task: roll-up commits count
                    results[task] = self._call(task)
            return results

    def run_task(self, task: Task) -> Any:
        """Run one task now, whether due or not (tests, admin tools)."""
        with self._pass_lock:
            return self._call(task)

    def _call(self, task: Task) -> Any:
        self._last_run[task] = time.monotonic()
        if task == "rollup":
            report = roll_up(
                self.storage,
                self.uri,
                self._followed_log() or self._table(),
                self.settings,
                parquet=self._parquet,
                attempts=self.writer.max_commit_attempts,
                closing=lambda: self._closed,
                partitions=self.rollup_scope() if self.rollup_scope else None,
            )
            self._commits_since_cleanup += report.runs
            self.rollup_reports = [*self.rollup_reports[-_KEEP_REPORTS + 1 :], report]
            return report
        if task == "log_cleanup":
            self._commits_since_cleanup = 0
            return cleanup_log(
                self.storage,
                self.uri,
                keep_versions=self.settings.log_keep_versions,
                min_age_s=self.settings.log_min_age_s,
            )
        if task == "retention":
            committed = self.lowest_committed(self.topic) if self.lowest_committed else None
            retention = apply_retention(self.storage, self.topic, self.writer, lowest_committed=committed)
            if retention.committed or retention.conflict:
                self.retention_reports = [*self.retention_reports[-_KEEP_REPORTS + 1 :], retention]
                log.info("retention on %s: %s", self.topic, retention.to_dict())
            return retention
        # the last of the closed Literal: "vacuum"
        return self._table().vacuum(dry_run=False, enforce_retention_duration=True)

    def _followed_log(self) -> FollowedLog | None:
        """On local disk, the topic's index followed from its log by a reader of this loop's own
        (the roll-up plans and commits on it); None: plan on the table object."""
        if not self.storage.is_local:
            return None
        if self._follower is None:
            self._follower = TopicReader(self.storage, self.topic, _FOLLOWER)
        return self._follower.followed_log()

    def _table(self) -> DeltaTable:
        if self._dt is None:
            self._dt = self.storage.open_table(self.uri)
        else:
            self._dt.update_incremental()
        return self._dt

    def stop(self) -> None:
        """No more passes (one running finishes); `close` then waits for it."""
        with self._lock:
            self._closed = True

    def close(self, timeout: float = 30.0) -> None:
        """No more passes; waits for one that is running."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self._closed = True
            while self._queued and (remaining := deadline - time.monotonic()) > 0:
                self._lock.wait(remaining)
        if self._own_scheduler and self._scheduler is not None:
            self._scheduler.close()
