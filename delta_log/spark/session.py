"""SparkSession factory with Delta configured.

Delta's JVM jars come from Maven Central through Spark's own package resolution
(`spark.jars.packages`, set by delta-spark's `configure_spark_with_delta_pip`), cached in the Ivy
folder (`spark.jars.ivy`, default ~/.ivy2.5.2). The pip package delta-spark and the jar share one
version, pinned in pyproject.toml. Spark's `from_avro` (`spark.avro_package`, for the typed views of
Avro topics) and Spark's Kafka connector (`spark.kafka_package`: `format("kafka")` against the
gateways' Kafka listener) come the same way.

S3 roots: see delta_log.spark.s3a (hadoop-aws on the classpath when a root is on S3).
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
        extra = [p for p in (settings.spark.avro_package, settings.spark.kafka_package) if p]
        if extra and "spark.jars.excludes" not in settings.spark.conf:
            # spark-avro's and the Kafka connector's dependency on spark-tags would put a second copy
            # beside pyspark's
            builder = builder.config("spark.jars.excludes", "org.apache.spark:spark-tags_2.13")
        spark = configure_spark_with_delta_pip(builder, extra_packages=extra).getOrCreate()
    _register_source(spark, settings)
    return spark


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
