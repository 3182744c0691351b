"""SparkSession factory with Delta configured.

Delta's JVM jars come from Maven Central through Spark's own package resolution
(`spark.jars.packages`, set by delta-spark's `configure_spark_with_delta_pip`), cached in the Ivy
folder (`spark.jars.ivy`, default ~/.ivy2.5.2). The pip package delta-spark and the jar share one
version, pinned in pyproject.toml.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from conf import Settings
from conf.settings import SPARK_DEFAULTS
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
        spark = configure_spark_with_delta_pip(builder).getOrCreate()
    _register_source(spark, settings)
    return spark


def _register_source(spark: SparkSession, settings: Settings) -> None:
    """`format("topiclake")`, defaulting to the settings' root and storage options."""
    from delta_log.spark.source import bind_source

    spark.dataSource.register(bind_source(StorageRoot(settings.root).root, settings.storage_options))
