"""SparkSession factory with Delta configured.

Delta's JVM jars come from Maven Central through Spark's own package resolution
(`spark.jars.packages`, set by delta-spark's `configure_spark_with_delta_pip`), cached in the Ivy
folder (`spark.jars.ivy`, default ~/.ivy2.5.2). The pip package delta-spark and the jar share one
version, pinned in pyproject.toml. Spark's `from_avro` (`spark.avro_package`, for the typed views of
Avro topics) and Spark's Kafka connector (`spark.kafka_package`: `format("kafka")` against the
gateways' Kafka listener) come the same way.

S3 roots: see delta_log.spark.s3a (hadoop-aws on the classpath when a root is on S3).

The catalog (`catalog.enabled`, the default): the session uses Spark's Hive catalog on the root's
metastore (delta_log.spark.metastore, started on demand) and keeps the topics registered in it
(delta_log.spark.catalog), so `spark.sql("SELECT * FROM topics.orders")` works with no call.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from conf import Settings
from conf.settings import SPARK_DEFAULTS
from delta_log.errors import InvalidConfigError
from delta_log.spark.s3a import configure_s3a, s3a_jars, wants_s3a
from delta_log.table.storage import StorageRoot

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from delta_log.spark.catalog import CatalogSync

_SYNCS: dict[str, CatalogSync] = {}  # the catalog sync each root has in this process's session


def spark_conf_from_file(path: Path = SPARK_DEFAULTS) -> dict[str, str]:
    """Parse a spark-defaults.conf style file ("key value" per line, # comments)."""
    conf: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition(" ")
        conf[key.strip()] = value.strip()
    return conf


def get_spark(settings: Settings | None = None, *, app_name: str | None = None) -> SparkSession:
    """Return the active SparkSession or build one with Delta (master from settings).

    Raises: pyspark's errors if Java or the Delta jars are unavailable (see README, Setup).
    """
    from delta import configure_spark_with_delta_pip
    from pyspark.sql import SparkSession

    from conf import load_settings

    settings = settings or load_settings()
    active = SparkSession.getActiveSession()
    if active is not None:
        _register_source(active, settings)
        _keep_catalog(active, settings)
        return active
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers (UDFs, the topiclake source) must run the interpreter that has our packages.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name or settings.spark.app_name)
    if "PYSPARK_GATEWAY_PORT" in os.environ:
        # Under spark-submit the JVM is up: its --master, --packages and --conf are the user's word.
        spark = builder.getOrCreate()
    else:
        builder = builder.master(settings.spark.master)
        for key, value in (spark_conf_from_file() | settings.spark.conf).items():
            builder = builder.config(key, value)
        if settings.spark.ivy_dir:
            builder = builder.config("spark.jars.ivy", settings.spark.ivy_dir)
        if wants_s3a(settings):
            builder = _with_s3a(builder, settings)
        if settings.catalog.enabled:
            builder = _with_catalog(builder, settings)
        extra = [p for p in (settings.spark.avro_package, settings.spark.kafka_package) if p]
        if extra and "spark.jars.excludes" not in settings.spark.conf:
            # spark-avro's and the Kafka connector's dependency on spark-tags would put a second copy
            # beside pyspark's
            builder = builder.config("spark.jars.excludes", "org.apache.spark:spark-tags_2.13")
        spark = configure_spark_with_delta_pip(builder, extra_packages=extra).getOrCreate()
    _register_source(spark, settings)
    _keep_catalog(spark, settings)
    return spark


def _with_catalog(builder: SparkSession.Builder, settings: Settings) -> SparkSession.Builder:
    """Spark's Hive catalog on the root's metastore; managed tables in its warehouse folder."""
    from delta_log.spark.metastore import ensure_metastore, warehouse_dir

    given = spark_conf_from_file() | settings.spark.conf
    builder = builder.config("spark.sql.catalogImplementation", "hive").config(
        "spark.hadoop.hive.metastore.uris", ensure_metastore(settings, wait=False)
    )  # it starts beside the Spark JVM; _keep_catalog waits for it
    if "spark.sql.warehouse.dir" not in given:
        builder = builder.config("spark.sql.warehouse.dir", str(warehouse_dir(settings)))
    return builder


def _keep_catalog(spark: SparkSession, settings: Settings) -> None:
    """Register the root's topics in a Hive catalog session and keep them in step (once per root)."""
    if not settings.catalog.enabled or spark.conf.get("spark.sql.catalogImplementation", "in-memory") != "hive":
        return
    from delta_log.spark.catalog import CatalogSync
    from delta_log.spark.metastore import ensure_metastore, wait_for_metastore

    wait_for_metastore(settings)
    storage = StorageRoot(settings.root, settings.storage_options)
    key = f"{storage.root}|{settings.catalog.database}"
    if key in _SYNCS and _SYNCS[key].spark is spark:
        return
    if key in _SYNCS:  # that session was stopped and this is a new one
        _SYNCS.pop(key).stop()
    sync = CatalogSync(spark, storage, settings.catalog.database, before_round=lambda: ensure_metastore(settings))
    sync.start(settings.catalog.sync_interval_s, partitions_refresh_s=settings.catalog.partitions_refresh_s)
    _SYNCS[key] = sync


def catalog_sync(settings: Settings) -> CatalogSync | None:
    """The running catalog sync of this process's session for the settings' root, if any."""
    storage = StorageRoot(settings.root, settings.storage_options)
    return _SYNCS.get(f"{storage.root}|{settings.catalog.database}")


def _with_s3a(builder: SparkSession.Builder, settings: Settings) -> SparkSession.Builder:
    """s3a's jars on the class path: in local mode straight from the Ivy cache (no copy); with
    executors elsewhere as `spark.jars`, which Spark ships to them."""
    jars = s3a_jars(settings)
    given = spark_conf_from_file() | settings.spark.conf
    if not settings.spark.master.startswith("local"):
        listed = given.get("spark.jars")
        return builder.config("spark.jars", ",".join([listed, *jars] if listed else jars))
    for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
        path = ":".join(jars)
        builder = builder.config(key, f"{given[key]}:{path}" if given.get(key) else path)
    return builder


def _register_source(spark: SparkSession, settings: Settings) -> None:
    """`format("topiclake")`, defaulting to the settings' root and storage options."""
    from delta_log.spark.source import bind_source

    spark.dataSource.register(bind_source(StorageRoot(settings.root).root, settings.storage_options))
    # a session without s3a fails later, at the first S3 path given to Spark, with configure_s3a's error
    with contextlib.suppress(InvalidConfigError):
        configure_s3a(spark, settings.root, settings.storage_options)
