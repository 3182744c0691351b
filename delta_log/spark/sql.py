"""Topics as SQL tables in a session you made yourself: `register_topics(spark)`.

Sessions made by `get_spark` with the catalog on (the default) have the topics already, kept in step
in the Hive metastore (delta_log.spark.catalog, which says what the catalog holds). This call makes
the same tables in any session's catalog, once: call it again to pick up new topics and refresh
`_partitions`. Time travel works: `SELECT * FROM topics.orders VERSION AS OF 3`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from delta_log.spark.catalog import CatalogSync
from delta_log.table.storage import StorageRoot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register_topics(
    spark: SparkSession,
    root: str | None = None,
    *,
    database: str = "topics",
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Register every topic under `root` as `<database>.<table_name(topic)>`, plus `_partitions`,
    `_consumer_lag` and the typed views. Returns {topic: table}."""
    if root is None:  # the entry point's default: the settings' root
        from conf import load_settings

        settings = load_settings()
        root, storage_options = settings.root, storage_options or settings.storage_options
    sync = CatalogSync(spark, StorageRoot(root, storage_options or {}), database)
    sync.sync()
    return sync.tables()
