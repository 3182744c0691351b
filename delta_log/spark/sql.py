"""Topics as SQL tables: `register_topics(spark)`.

- `topics.<name>`: every topic, a Delta table at its location, `-` and `.` written `_`
  (time travel works: `SELECT * FROM topics.orders VERSION AS OF 3`).
- `topics._partitions`: topic, partition, log start offset, high watermark, segments, bytes
  (a snapshot, written to `<root>/_system/partitions` at each registration, through delta-rs:
  on S3 a Spark write would use Delta Spark's single-writer S3 log store).
- `topics_typed.<name>`: for a topic with a JSON Schema value schema, the Kafka columns and the
  value's fields as typed columns (delta_log.spark.typed).
- `topics._consumer_lag`: a view over `<root>/_system/consumer_offsets` (live) and `_partitions`:
  group, topic, partition, committed offset, high watermark, log start offset, lag.

Tables live in the session's catalog; call register_topics again to pick up new topics and
refresh `_partitions`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import pyarrow as pa
from deltalake import write_deltalake

from conf import WriterSettings
from delta_log.core.lag import lag_sql
from delta_log.log.catalog import Catalog
from delta_log.log.reader import TopicReader
from delta_log.spark.s3a import configure_s3a
from delta_log.spark.typed import register_typed_views
from delta_log.system.offsets import OffsetStore
from delta_log.system.schemas import SchemaStore
from delta_log.table.storage import StorageRoot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PARTITIONS_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("log_start_offset", pa.int64()),
        ("high_watermark", pa.int64()),
        ("segments", pa.int32()),
        ("size_bytes", pa.int64()),
    ]
)


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def table_name(topic: str) -> str:
    """SQL table name of a topic: Spark's catalog allows only letters, digits and `_` ("orders-eu" -> "orders_eu")."""
    return topic.replace("-", "_").replace(".", "_")


def register_topics(
    spark: SparkSession,
    root: str | None = None,
    *,
    database: str = "topics",
    storage_options: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Register every topic under `root` as `<database>.<table_name(topic)>`, plus `_partitions` and
    `_consumer_lag`. Returns {topic: table}. Two topics whose SQL names collide: the second is
    registered as `<name>_2` (and so on), never silently replaced."""
    if root is None:  # the entry point's default: the settings' root
        from conf import load_settings

        settings = load_settings()
        root, storage_options = settings.root, storage_options or settings.storage_options
    storage = StorageRoot(root, storage_options or {})
    configure_s3a(spark, storage.root, storage.storage_options)
    OffsetStore(storage)  # make sure the offsets table exists, so the lag view always resolves
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {_q(database)}")
    topics = Catalog(storage, WriterSettings()).list_topics()
    tables: dict[str, str] = {}
    rows = []
    for t in topics:
        name, n = table_name(t), 1
        while name in tables.values():
            n += 1
            name = f"{table_name(t)}_{n}"
        tables[t] = name
        spark.sql(f"CREATE TABLE IF NOT EXISTS {_q(database)}.{name} USING DELTA LOCATION '{storage.topic_uri(t)}'")
        for p in TopicReader(storage, t).partition_offsets():
            rows.append((t, p.partition, p.log_start_offset, p.high_watermark, p.segments, p.size_bytes))
    partitions_uri = storage.system_uri("partitions")
    write_deltalake(
        partitions_uri,
        pa.Table.from_pylist([dict(zip(PARTITIONS_SCHEMA.names, r, strict=True)) for r in rows], PARTITIONS_SCHEMA),
        mode="overwrite",
        schema_mode="overwrite",
        storage_options=storage.options(),
    )
    spark.sql(f"CREATE TABLE IF NOT EXISTS {_q(database)}._partitions USING DELTA LOCATION '{partitions_uri}'")
    spark.sql(f"REFRESH TABLE {_q(database)}._partitions")
    offsets_uri = storage.system_uri("consumer_offsets")
    spark.sql(f"""
        CREATE OR REPLACE VIEW {_q(database)}._consumer_lag AS
        WITH latest AS (
            SELECT `group`, topic, partition, max_by(offset, commit_timestamp) AS committed_offset
            FROM delta.`{offsets_uri}`
            GROUP BY `group`, topic, partition
        )
        SELECT l.`group`, l.topic, l.partition, l.committed_offset, p.high_watermark, p.log_start_offset,
               {lag_sql(committed="l.committed_offset", log_start_offset="p.log_start_offset", high_watermark="p.high_watermark")} AS lag
        FROM latest l JOIN {_q(database)}._partitions p ON l.topic = p.topic AND l.partition = p.partition
        WHERE l.committed_offset >= 0
    """)
    register_typed_views(spark, SchemaStore.open_if_exists(storage), tables, database)
    return tables
