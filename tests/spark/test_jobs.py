"""jobs/retention.py on Spark (topics spread over executors) and from the CLI without Spark."""

import json
import os
import subprocess
import sys
import time

from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicReader, TopicWriter
from jobs import retention
from tests.e2e.server import REPO
from tests.integration.test_retention import old_batch
from tests.integration.test_stored_batches import Counting, records


def make(root, name, hours_old):
    settings = load_settings(root=root)
    storage = StorageRoot(root)
    Catalog(storage, settings.writer).create_topic(name, config={"retention.ms": 60_000})
    w = TopicWriter(storage, name, settings.writer)
    now = int(time.time() * 1000)
    for _ in range(3):
        w.append(old_batch(10, now - hours_old * 3_600_000, name))
    w.append(old_batch(10, now, name))
    return settings, storage


def test_retention_job_on_spark(spark, tmp_path):
    root = str(tmp_path / "root")
    settings, storage = make(root, "ret-a", 2)
    make(root, "ret-b", 5)
    report = retention.run(spark, settings)
    assert report.records_removed == 60
    assert {t["topic"]: t["records_removed"] for t in report.topics} == {"ret-a": 30, "ret-b": 30}
    assert TopicReader(storage, "ret-a").log_start_offset(0) == 30


def test_retention_cli_local(tmp_path):
    root = str(tmp_path / "root")
    make(root, "ret-c", 3)
    out = subprocess.run(
        [sys.executable, "-m", "topiclake", "jobs", "retention", "--root", root, "--local"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["records_removed"] == 30


def test_compaction_job_on_spark(spark, tmp_path):
    from jobs import compaction

    root = str(tmp_path / "root")
    settings = load_settings(root=root)
    storage = StorageRoot(root)
    Catalog(storage, settings.writer).create_topic("cmp", partitions=2)
    w = TopicWriter(storage, "cmp", settings.writer)
    for _ in range(12):
        w.append(old_batch_2p(10, "cmp"))
    before = TopicReader(storage, "cmp").fetch(1, 0, max_records=1000).records
    report = compaction.run(spark, settings)
    (t,) = report.topics
    assert t["committed"] and t["segments_before"] == 24 and t["segments_after"] == 2 and t["records_removed"] == 0
    assert TopicReader(storage, "cmp").fetch(1, 0, max_records=1000).records.equals(before)
    # the Kafka face reads Spark's file (its own timestamp and list encodings) itself, to the same records
    encoder = Counting()
    got = TopicReader(storage, "cmp").fetch(1, 0, max_records=1000, encoder=encoder)
    assert got.count == before.num_rows and records(got.encoded) == records(encoder.table(before))
    assert encoder.native and all(encoder.native)


def old_batch_2p(n, topic):
    import pyarrow as pa

    from delta_log import normalize_batch

    return normalize_batch(
        pa.table({"value": [b"v"] * n, "partition": pa.array([i % 2 for i in range(n)], pa.int32())}),
        partitions=2,
        topic=topic,
        max_message_bytes=10**6,
        now_us=int(time.time() * 1e6),
        log_append_time=False,
    )


def test_streaming_readers_started_before_compaction_continue_without_duplicates(spark, tmp_path):
    """Both Spark streaming faces (the Delta source and the Kafka-compatible one) over a topic the
    compaction job rewrites between two micro-batches: every record exactly once, no error."""
    from jobs import compaction
    from tests.integration.conftest import make_batch

    root = str(tmp_path / "root")
    settings = load_settings(root=root)
    storage = StorageRoot(root)
    Catalog(storage, settings.writer).create_topic("live-cmp", partitions=2)
    w = TopicWriter(storage, "live-cmp", settings.writer)
    for i in range(12):
        w.append(make_batch(10, partitions=2, topic="live-cmp", key_prefix=f"a{i}-"))
    delta_q = (
        spark.readStream.format("delta")
        .load(storage.topic_uri("live-cmp"))
        .select("partition", "offset")
        .writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "ck-delta"))
        .start(str(tmp_path / "sink-delta"))
    )
    kafka_q = (
        spark.readStream.format("topiclake")
        .option("root", root)
        .option("subscribe", "live-cmp")
        .option("startingOffsets", "earliest")
        .load()
        .select("partition", "offset")
        .writeStream.format("delta")
        .option("checkpointLocation", str(tmp_path / "ck-kafka"))
        .start(str(tmp_path / "sink-kafka"))
    )
    try:
        for q in (delta_q, kafka_q):
            q.processAllAvailable()
        report = compaction.run(spark, settings)
        assert report.topics[0]["segments_after"] < report.topics[0]["segments_before"]
        for i in range(5):
            w.append(make_batch(10, partitions=2, topic="live-cmp", key_prefix=f"b{i}-"))
        for q in (delta_q, kafka_q):
            q.processAllAvailable()
            assert q.exception() is None
    finally:
        delta_q.stop()
        kafka_q.stop()
    expected = sorted((p, o) for p in (0, 1) for o in range(85))
    for sink in ("sink-delta", "sink-kafka"):
        rows = spark.read.format("delta").load(str(tmp_path / sink)).collect()
        assert sorted((r["partition"], r["offset"]) for r in rows) == expected, sink


def test_scheduler_runs_every_job_once_on_spark(tmp_path):
    """`jobs.use_spark`: the scheduler's runs go through one SparkSession (its own JVM here)."""
    root = str(tmp_path / "root")
    make(root, "sched-a", 2)
    env = {**os.environ, "TOPICLAKE_JOBS__USE_SPARK": "true", "TOPICLAKE_JOBS__REPLICA_ROOT": str(tmp_path / "dr")}
    out = subprocess.run(
        [sys.executable, "-m", "jobs.scheduler", "--root", root, "--once"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = {j["job"]: j for j in (json.loads(x) for x in out.stdout.splitlines() if x.startswith("{"))}
    assert set(lines) == {"rebalance", "retention", "compaction", "upsert", "replication"}
    assert all(j["ok"] for j in lines.values()), lines
    assert lines["retention"]["report"]["records_removed"] == 30
    assert lines["replication"]["report"]["records_copied"] == 10  # what retention left
    assert "io.delta#delta-spark" in out.stderr  # a SparkSession (with its packages) was built
