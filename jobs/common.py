"""Shared shape of topiclake's Spark jobs: one task per topic, spread over the executors.

Each task is a module-level function `(root, storage_options, topic, settings_json) -> dict` so it
pickles to executors; with `spark=None` the tasks run in this process (`--local`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from conf import Settings
from delta_log.catalog import Catalog
from delta_log.storage import StorageRoot

TopicTask = Callable[[str, dict[str, str], str, str], dict[str, Any]]


def for_each_topic(spark: Any, settings: Settings, topics: list[str] | None, task: TopicTask) -> list[dict[str, Any]]:
    storage = StorageRoot(settings.root, settings.storage_options)
    names = topics or Catalog(storage, settings.writer).list_topics()
    root, options, payload = settings.root, dict(settings.storage_options), settings.model_dump_json()
    if spark is None or not names:
        return [task(root, options, t, payload) for t in names]
    return spark.sparkContext.parallelize(names, len(names)).map(lambda t: task(root, options, t, payload)).collect()


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
