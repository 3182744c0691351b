"""Spark on an S3 root (s3a, hadoop-aws from Maven Central): SQL registration, Delta reads, the
`topiclake` source with a group, the jobs on Spark, and replication local -> S3 -> local."""

from __future__ import annotations

import time
import uuid

import pytest

from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicReader, TopicWriter
from delta_log.maintenance.replication import promote
from delta_log.spark import get_spark, register_topics
from delta_log.spark.s3a import s3a_bucket_options
from delta_log.system.offsets import OffsetCommit, OffsetStore
from jobs import compaction, replication, retention
from tests.integration.conftest import make_batch
from tests.integration.test_replication import all_records
from tests.integration.test_retention import old_batch
from tests.s3.minio import SECRET_KEY
from tests.spark.test_jobs import old_batch_2p


def test_sql_delta_and_the_topiclake_source_over_an_s3_root(spark, settings, storage, catalog, tmp_path):
    catalog.create_topic("s3-orders", partitions=2)
    w = TopicWriter(storage, "s3-orders", settings.writer)
    w.append(make_batch(10, partitions=2, topic="s3-orders"))
    w.append(make_batch(10, partitions=2, topic="s3-orders"))
    OffsetStore(storage).commit(
        [
            OffsetCommit(group="billing", topic="s3-orders", partition=0, offset=3),
            OffsetCommit(group="billing", topic="s3-orders", partition=1, offset=0),
        ]
    )

    # SQL: registration writes topics._partitions through delta-rs; Spark reads the bucket via s3a
    tables = register_topics(spark, settings.root, database="s3topics", storage_options=settings.storage_options)
    assert tables == {"s3-orders": "s3_orders"}
    assert spark.sql("SELECT count(*) AS n FROM s3topics.s3_orders").first().n == 20
    assert spark.sql("SELECT count(*) AS n FROM s3topics.s3_orders VERSION AS OF 1").first().n == 10
    parts = {r.partition: r.high_watermark for r in spark.sql("SELECT * FROM s3topics._partitions").collect()}
    assert parts == {0: 10, 1: 10}
    lag = {r.partition: r.lag for r in spark.sql("SELECT * FROM s3topics._consumer_lag").collect()}
    assert lag == {0: 7, 1: 10}
    assert spark.read.format("delta").load(storage.topic_uri("s3-orders")).count() == 20

    # the Kafka-schema source on a session whose settings' root is the bucket (TOPICLAKE_ROOT=s3://...)
    get_spark(settings)
    try:
        src = spark.read.format("topiclake").option("subscribe", "s3-orders").load()
        rows = src.select("partition", "offset").collect()
    finally:
        get_spark(load_settings())  # the shared session's source back on its default root
    assert sorted((r.partition, r.offset) for r in rows) == [(p, o) for p in (0, 1) for o in range(10)]

    # a streaming query with a group commits its offsets to the bucket's offsets table
    q = (
        spark.readStream.format("topiclake")
        .option("root", settings.root)
        .options(**{f"storage.{k}": v for k, v in settings.storage_options.items()})
        .option("subscribe", "s3-orders")
        .option("startingOffsets", "earliest")
        .option("groupId", "spark-s3")
        .load()
        .writeStream.format("memory")
        .queryName("s3_orders_stream")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert spark.sql("SELECT count(*) AS n FROM s3_orders_stream").first().n == 20
    committed = OffsetStore(storage).committed("spark-s3")
    assert {k[1]: c.offset for k, c in committed.items()} == {0: 10, 1: 10}

    # the secret reaches s3a's Hadoop configuration, never the SQL conf a user can list
    assert SECRET_KEY not in str(spark.conf.getAll)
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    assert hadoop.get("fs.s3a.bucket.topiclake.secret.key") == SECRET_KEY


def test_s3a_options_follow_the_storage_options():
    opts = s3a_bucket_options(
        "s3://b/p",
        {"aws_endpoint_url": "http://127.0.0.1:9000", "AWS_REGION": "eu-west-1", "AWS_ACCESS_KEY_ID": "k"},
    )
    assert opts == {
        "fs.s3a.bucket.b.endpoint": "http://127.0.0.1:9000",
        "fs.s3a.bucket.b.connection.ssl.enabled": "false",
        "fs.s3a.bucket.b.path.style.access": "true",
        "fs.s3a.bucket.b.endpoint.region": "eu-west-1",
    }  # a key without its secret is not half-configured: s3a's own credential chain applies
    with_token = s3a_bucket_options(
        "s3a://c", {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t"}
    )
    assert with_token["fs.s3a.bucket.c.aws.credentials.provider"].endswith("TemporaryAWSCredentialsProvider")
    assert with_token["fs.s3a.bucket.c.session.token"] == "t"


def test_compaction_and_retention_jobs_on_spark_over_s3(spark, settings, storage, catalog):
    catalog.create_topic("cmp", partitions=2)
    w = TopicWriter(storage, "cmp", settings.writer)
    for _ in range(10):
        w.append(old_batch_2p(10, "cmp"))
    before = TopicReader(storage, "cmp").fetch(1, 0, max_records=1000).records
    catalog.create_topic("ret", config={"retention.ms": 60_000})
    w = TopicWriter(storage, "ret", settings.writer)
    now = int(time.time() * 1000)
    for _ in range(3):
        w.append(old_batch(10, now - 2 * 3_600_000, "ret"))
    w.append(old_batch(10, now, "ret"))

    (cmp,) = compaction.run(spark, settings, topics=["cmp"]).topics
    assert cmp["committed"] and cmp["segments_before"] == 20 and cmp["segments_after"] == 2
    assert TopicReader(storage, "cmp").fetch(1, 0, max_records=1000).records.equals(before)
    assert retention.run(spark, settings, topics=["ret"]).records_removed == 30
    assert TopicReader(storage, "ret").log_start_offset(0) == 30


@pytest.mark.parametrize("job_on_spark", [True, False], ids=["spark", "local"])
def test_replication_from_a_local_root_to_s3_and_back(spark, minio, tmp_path, job_on_spark):
    local = load_settings(root=str(tmp_path / "primary"))
    primary = StorageRoot(local.root)
    Catalog(primary, local.writer).create_topic("orders", partitions=2)
    w = TopicWriter(primary, "orders", local.writer)
    for _ in range(3):
        w.append(make_batch(20, partitions=2, topic="orders"))
    OffsetStore(primary).commit(
        [
            OffsetCommit(group="g", topic="orders", partition=0, offset=25),
            OffsetCommit(group="g", topic="orders", partition=1, offset=30),
        ]
    )

    s3_root = minio.root(f"dr-{uuid.uuid4().hex[:8]}")
    engine = spark if job_on_spark else None
    report = replication.run(engine, replication.with_replica(local, s3_root))  # the CLI's --replica
    assert report.records_copied == 60 and report.offsets_copied == 2
    on_s3 = load_settings(root=s3_root)
    replica = StorageRoot(on_s3.root, on_s3.storage_options)
    promote(replica, on_s3.writer)
    assert all_records(replica, "orders", 2) == all_records(primary, "orders", 2)
    assert {k[1]: c.offset for k, c in OffsetStore(replica).committed("g").items()} == {0: 25, 1: 30}

    # the promoted S3 root is the primary now: it takes writes at the replicated offsets, and
    # replicates back to a local disk
    TopicWriter(replica, "orders", on_s3.writer).append(make_batch(10, partitions=2, topic="orders"))
    assert TopicReader(replica, "orders").high_watermark(0) == 35
    back = StorageRoot(str(tmp_path / "back"))
    report = replication.run(engine, replication.with_replica(on_s3, back.root))
    assert report.records_copied == 70
    assert all_records(back, "orders", 2) == all_records(replica, "orders", 2)


def test_the_sink_writes_to_an_s3_root_exactly_once(spark, settings, storage, catalog, tmp_path):
    catalog.create_topic("src", partitions=2)
    catalog.create_topic("out", partitions=2)
    TopicWriter(storage, "src", settings.writer).append(make_batch(200, partitions=2, topic="src"))
    storage_opts = {f"storage.{k}": v for k, v in settings.storage_options.items()}

    def copy() -> None:
        (
            spark.readStream.format("topiclake")
            .option("root", settings.root)
            .options(**storage_opts)
            .option("subscribe", "src")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", 50)
            .load()
            .selectExpr("key", "value")
            .writeStream.format("topiclake")
            .option("root", settings.root)
            .options(**storage_opts)
            .option("topic", "out")
            .option("checkpointLocation", str(tmp_path / "ckpt"))
            .trigger(availableNow=True)
            .start()
            .awaitTermination(180)
        )

    copy()
    last = max(int(p.name) for p in (tmp_path / "ckpt" / "commits").iterdir() if p.name.isdigit())
    (tmp_path / "ckpt" / "commits" / str(last)).unlink()  # as if the driver died before recording it
    (tmp_path / "ckpt" / "commits" / f".{last}.crc").unlink(missing_ok=True)
    copy()
    assert (tmp_path / "ckpt" / "commits" / str(last)).exists()  # Spark did run the batch again
    out = TopicReader(storage, "out")
    assert out.high_watermark(0) + out.high_watermark(1) == 200
    src_values = sorted(r["value"] for p in (0, 1) for r in TopicReader(storage, "src").fetch(p, 0).records.to_pylist())
    out_values = sorted(r["value"] for p in (0, 1) for r in out.fetch(p, 0).records.to_pylist())
    assert out_values == src_values
