"""Shared shape of topiclake's Spark jobs: one task per topic, spread over the executors.

Each task is a module-level function `(root, storage_options, topic, settings_json) -> dict` so it
pickles to executors; with `spark=None` the tasks run in this process (`--local`).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from conf import Settings
from delta_log.log.catalog import Catalog
from delta_log.table.storage import StorageRoot

TopicTask = Callable[[str, dict[str, str], str, str], dict[str, Any]]


class _Planned(Protocol):
    @property
    def conflict(self) -> str | None: ...

    def to_dict(self) -> dict[str, Any]: ...


def planned_again(apply: Callable[[], _Planned], attempts: int = 3) -> dict[str, Any]:
    """Run a file-changing pass, planning again while another job removed its planned files
    (retention, compaction, the server's roll-up); the last report, as a dict."""
    for _ in range(attempts):
        report = apply()
        if report.conflict is None:
            break
    return report.to_dict()


class Progress:
    """Progress lines on stderr for long runs: `[<job> 12.3s] 3/10 topics done`, at most every `every_s`.

    With Spark, a thread reads the SparkContext's status tracker (tasks done / total of the job's
    active stages) while the driver waits for `collect()`.
    """

    def __init__(self, job: str, spark: Any = None, *, every_s: float = 2.0) -> None:
        self.job, self.spark, self.every_s = job, spark, every_s
        self.started = time.monotonic()
        self._last = 0.0

    def say(self, message: str) -> None:
        print(f"[{self.job} {time.monotonic() - self.started:.1f}s] {message}", file=sys.stderr, flush=True)

    def step(self, done: int, total: int, what: str) -> None:
        now = time.monotonic()
        if done == total or now - self._last >= self.every_s:
            self._last = now
            self.say(f"{done}/{total} {what} done")

    @contextmanager
    def watching_spark(self, what: str) -> Iterator[None]:
        if self.spark is None:
            yield
            return
        tracker = self.spark.sparkContext.statusTracker()
        stop = threading.Event()

        def watch() -> None:
            while not stop.wait(self.every_s):
                stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
                stages = [s for s in stages if s is not None]
                if stages:
                    done = sum(s.numCompletedTasks for s in stages)
                    self.say(f"{done}/{sum(s.numTasks for s in stages)} {what} done (Spark tasks)")

        watcher = threading.Thread(target=watch, name=f"{self.job}-progress", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            stop.set()
            watcher.join()


def for_each_topic(
    spark: Any, settings: Settings, topics: list[str] | None, task: TopicTask, progress: Progress | None = None
) -> list[dict[str, Any]]:
    storage = StorageRoot(settings.root, settings.storage_options)
    names = topics if topics is not None else Catalog(storage, settings.writer).list_topics()
    root, options, payload = settings.root, dict(settings.storage_options), settings.model_dump_json()
    progress = progress or Progress("job", spark)
    if spark is None or not names:
        results = []
        for i, t in enumerate(names, 1):
            results.append(task(root, options, t, payload))
            progress.step(i, len(names), "topics")
        return results
    with progress.watching_spark("topics"):
        rdd = spark.sparkContext.parallelize(names, len(names))
        results = rdd.map(lambda t: task(root, options, t, payload)).collect()
    progress.step(len(names), len(names), "topics")
    return results


@contextmanager
def job_spark(settings: Settings, app_name: str, *, local: bool) -> Iterator[Any]:
    """A SparkSession for a job's run (stopped afterwards), or None with `local`."""
    if local:
        yield None
        return
    from delta_log.spark import get_spark

    spark = get_spark(settings, app_name=app_name)
    try:
        yield spark
    finally:
        spark.stop()


def job_settings(root: str | None) -> Settings:
    from conf import load_settings

    return load_settings(**({"root": root} if root else {}))
