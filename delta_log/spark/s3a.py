"""Spark on S3 roots, through Hadoop's s3a.

hadoop-aws at the Hadoop version pyspark ships with (`spark.hadoop_aws_version`) and the AWS SDK
bundle it depends on (about 690 MB) are resolved from Maven Central once, by Spark's own package
resolution (Ivy cache, as Delta's jars) in a throwaway process, and the resolved jar paths kept in
`~/.cache/topiclake/s3a-<version>.json`. A session that needs them (a root or the replica root on
S3, or `spark.s3a = true`) gets them on the driver's and executors' class path.

Not `spark.jars.packages`, measured: spark-submit also puts every package jar on the Python path
of the driver and of every Python worker and copies it into the session's files folder, so each
session start took 7 s longer and the first Python data source task 45 s instead of 11 s (Python
reading the central directory of a 690 MB jar in each new worker).

`s3://` URIs, the ones delta-rs writes, are mapped to s3a, and each bucket gets the settings'
storage options as s3a per-bucket options, so Spark and the gateway see one bucket the same way.
Spark only reads from S3: every write goes through delta-rs, whose commits are conditional puts
(Delta Spark's S3 log store is single-writer).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from conf import Settings
from delta_log.errors import InvalidConfigError
from delta_log.table.storage import storage_option

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "topiclake"

_RESOLVE = """
import sys
from pyspark.sql import SparkSession
b = SparkSession.builder.master("local[1]").appName("topiclake-s3a-resolve").config("spark.ui.enabled", "false")
b = b.config("spark.jars.packages", sys.argv[1])
if sys.argv[2]:
    b = b.config("spark.jars.ivy", sys.argv[2])
spark = b.getOrCreate()
print("JARS=" + spark.conf.get("spark.jars"))
spark.stop()
"""


def s3a_jars(settings: Settings) -> list[str]:
    """The local paths of hadoop-aws and its dependencies, resolved once (a throwaway Spark
    process; minutes the first time, for the download). Raises: InvalidConfigError if Spark's
    package resolution fails (its output says why)."""
    coordinate = f"org.apache.hadoop:hadoop-aws:{settings.spark.hadoop_aws_version}"
    manifest = CACHE / f"s3a-{settings.spark.hadoop_aws_version}.json"
    try:
        jars = json.loads(manifest.read_text())["jars"]
        if jars and all(os.path.exists(j) for j in jars):
            return list(jars)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # absent, unreadable or stale: resolve again
    try:
        out = subprocess.run(
            [sys.executable, "-c", _RESOLVE, coordinate, settings.spark.ivy_dir or ""],
            capture_output=True,
            text=True,
            env={**os.environ, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")},
            timeout=1800,
        )
    except subprocess.TimeoutExpired as exc:
        raise InvalidConfigError(
            f"Resolving {coordinate} (s3a) took over 30 minutes; check that Maven Central is reachable."
        ) from exc
    line = next((x for x in out.stdout.splitlines() if x.startswith("JARS=")), None)
    if out.returncode != 0 or line is None:
        raise InvalidConfigError(
            f"Could not resolve {coordinate} (s3a) with Spark's package resolution; its output ends: "
            f"{(out.stdout + out.stderr)[-1500:]} Check that Maven Central is reachable (see OPERATIONS.md, "
            "Object storage, if it says 'download failed' for hadoop-aws.jar)."
        )
    jars = [urlparse(j).path if j.startswith("file:") else j for j in line[len("JARS=") :].split(",") if j]
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = manifest.with_suffix(".tmp")
    tmp.write_text(json.dumps({"coordinate": coordinate, "jars": jars}))
    tmp.replace(manifest)
    return jars


def _is_s3(root: str | None) -> bool:
    return bool(root) and str(root).startswith(("s3://", "s3a://"))


def wants_s3a(settings: Settings) -> bool:
    """Whether a new session gets hadoop-aws: `spark.s3a`, else whether any root is on S3."""
    if settings.spark.s3a is not None:
        return settings.spark.s3a
    return _is_s3(settings.root) or _is_s3(settings.jobs.replica_root)


def configure_s3a(spark: SparkSession, root: str, storage_options: Mapping[str, str]) -> None:
    """Let `spark` read `root` (an S3 URI; anything else is left alone) with `storage_options`
    (delta-rs names) as s3a's per-bucket options in the SparkContext's Hadoop configuration (not the
    SQL conf, which `SET` would show). Raises: InvalidConfigError if the session has no s3a on its classpath.
    """
    if not _is_s3(root):
        return
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    from py4j.java_gateway import JavaClass

    if not isinstance(jvm.org.apache.hadoop.fs.s3a.S3AFileSystem, JavaClass):
        raise InvalidConfigError(
            f"This SparkSession cannot read {root}: it has no s3a filesystem (hadoop-aws). Start it with "
            "spark.s3a = true in the settings (get_spark adds the package), or pass "
            "--packages org.apache.hadoop:hadoop-aws:<pyspark's Hadoop version> to spark-submit."
        )
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    conf.set("fs.s3.impl", "org.apache.hadoop.fs.s3a.S3AFileSystem")
    conf.set("fs.AbstractFileSystem.s3.impl", "org.apache.hadoop.fs.s3a.S3A")
    for key, value in s3a_bucket_options(root, storage_options).items():
        conf.set(key, value)


def s3a_bucket_options(root: str, storage_options: Mapping[str, str]) -> dict[str, str]:
    """s3a's per-bucket options (`fs.s3a.bucket.<bucket>.*`) for delta-rs storage options: endpoint
    (path-style, and TLS as its scheme says), region and credentials. Without credentials, s3a's
    own chain (environment, profile, instance role) applies."""
    prefix = f"fs.s3a.bucket.{urlparse(root).netloc}."
    out: dict[str, str] = {}
    endpoint = storage_option(storage_options, "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT")
    if endpoint:
        out["endpoint"] = endpoint
        out["connection.ssl.enabled"] = str(urlparse(endpoint).scheme != "http").lower()
        virtual = storage_option(storage_options, "AWS_VIRTUAL_HOSTED_STYLE_REQUEST") or "false"
        out["path.style.access"] = str(virtual.lower() != "true").lower()
    region = storage_option(storage_options, "AWS_REGION", "AWS_DEFAULT_REGION")
    if region:
        out["endpoint.region"] = region
    key = storage_option(storage_options, "AWS_ACCESS_KEY_ID")
    secret = storage_option(storage_options, "AWS_SECRET_ACCESS_KEY")
    if key and secret:
        out["access.key"], out["secret.key"] = key, secret
        token = storage_option(storage_options, "AWS_SESSION_TOKEN")
        if token:
            out["session.token"] = token
            out["aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.TemporaryAWSCredentialsProvider"
        else:
            out["aws.credentials.provider"] = "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"
    return {prefix + k: v for k, v in out.items()}
