"""Kafka's sink patterns (Spark's Kafka integration guide, format "topiclake"): batch save with a topic
option, streaming with a topic column, keys by murmur2, headers, and exactly-once replays."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
from pyspark.errors import AnalysisException, PySparkException

from bench.common import metric_total
from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicReader, TopicWriter
from delta_log.core.partitioner import partition_for_key
from delta_log.spark import register_topics
from tests.e2e.server import REPO, ServerProcess
from tests.integration.conftest import make_batch
from topiclake import AdminClient, Producer


def make_topics(root, **partitions):
    settings = load_settings(root=root)
    storage = StorageRoot(root)
    catalog = Catalog(storage, settings.writer)
    for name, n in partitions.items():
        catalog.create_topic(name.replace("_", "-"), partitions=n)
    return storage


def read_topic(spark, root, topic):
    return spark.read.format("topiclake").option("root", root).option("subscribe", topic).load()


def test_batch_save_with_a_topic_option_partitions_keys_like_kafka(spark, tmp_path):
    root = str(tmp_path / "root")
    make_topics(root, orders=4)
    df = spark.range(200).selectExpr("CAST(id AS STRING) AS key", "to_json(named_struct('id', id)) AS value")
    writer = df.write.format("topiclake").option("root", root).option("topic", "orders")
    try:  # the guide's save(): Spark's default mode, if Spark lets a Python data source take it
        writer.save()
    except (AnalysisException, PySparkException) as exc:
        assert "append" in str(exc).lower(), exc
        writer.mode("append").save()
    rows = read_topic(spark, root, "orders").selectExpr("CAST(key AS STRING) AS k", "partition", "offset").collect()
    assert len(rows) == 200
    assert all(r.partition == partition_for_key(r.k.encode(), 4) for r in rows)  # murmur2, as Kafka
    assert not list((tmp_path / "root" / "_system" / "sink-staging").rglob("*.arrow"))  # staged files removed
    by_partition: dict[int, list[int]] = {}
    for r in rows:
        by_partition.setdefault(r.partition, []).append(r.offset)
    assert all(sorted(o) == list(range(len(o))) for o in by_partition.values())  # contiguous from 0

    with pytest.raises(Exception, match="append-only"):
        df.write.format("topiclake").option("root", root).option("topic", "orders").mode("overwrite").save()
    with pytest.raises(Exception, match="Say which topic to write"):
        df.write.format("topiclake").option("root", root).mode("append").save()  # no topic anywhere
    with pytest.raises(Exception, match=r"TOPIC_NOT_FOUND|does not exist"):
        df.write.format("topiclake").option("root", root).option("topic", "nope").mode("append").save()


def test_columns_topic_partition_headers_and_binary_values(spark, tmp_path):
    root = str(tmp_path / "root")
    make_topics(root, a=2, b=1)
    df = spark.sql("""
        SELECT IF(id % 2 = 0, 'a', 'b') AS topic, CAST(NULL AS STRING) AS key,
               CAST(CAST(id AS STRING) AS BINARY) AS value,
               IF(id % 2 = 0, CAST(id % 4 / 2 AS INT), 0) AS partition,
               array(named_struct('key', 'src', 'value', CAST('test' AS BINARY))) AS headers,
               'ignored' AS extra
        FROM range(20)
    """)
    df.write.format("topiclake").option("root", root).mode("append").save()
    got = (
        spark.read.format("topiclake")
        .option("root", root)
        .option("subscribe", "a,b")
        .option("includeHeaders", "true")
        .load()
        .selectExpr("topic", "partition", "CAST(CAST(value AS STRING) AS INT) AS id", "headers")
        .collect()
    )
    assert sorted(r.id for r in got) == list(range(20))
    for r in got:
        assert r.topic == ("a" if r.id % 2 == 0 else "b")
        assert r.partition == (r.id % 4 // 2 if r.topic == "a" else 0)
        assert [(h.key, bytes(h.value)) for h in r.headers] == [("src", b"test")]


def stream_copy(spark, root, source, checkpoint, *, per_trigger=50):
    return (
        spark.readStream.format("topiclake")
        .option("root", root)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", per_trigger)
        .load()
        .selectExpr("'copy' AS topic", "value")  # no key, no partition: sticky partitions
        .writeStream.format("topiclake")
        .option("root", root)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )


def test_streaming_with_a_topic_column_and_a_replayed_micro_batch_writes_nothing_new(spark, tmp_path):
    root = str(tmp_path / "root")
    storage = make_topics(root, src=2, copy=2)
    TopicWriter(storage, "src", load_settings().writer).append(make_batch(300, partitions=2, topic="src"))
    checkpoint = tmp_path / "ckpt"
    stream_copy(spark, root, "src", checkpoint).awaitTermination(120)
    copy = TopicReader(storage, "copy")
    assert copy.high_watermark(0) + copy.high_watermark(1) == 300

    # a crash after the sink's tasks committed and before Spark recorded the batch: Spark replays it
    commits = sorted((checkpoint / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1)
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    (checkpoint / "commits" / f".{last.name}.crc").unlink(missing_ok=True)
    stream_copy(spark, root, "src", checkpoint).awaitTermination(120)
    assert (checkpoint / "commits" / last.name).exists()  # the batch did run again
    copy = TopicReader(storage, "copy")
    assert copy.high_watermark(0) + copy.high_watermark(1) == 300  # and wrote nothing new

    register_topics(spark, root, database="sinktopics")
    assert spark.sql("SELECT count(DISTINCT value) AS n FROM sinktopics.copy").first().n == 300


QUERY = """
import sys
from bench.common import metric_total
from conf import load_settings
from delta_log.spark import get_spark
root, checkpoint = sys.argv[1], sys.argv[2]
spark = get_spark(load_settings(root=root, spark={"master": "local[2]"}), app_name="sink-crash")
q = (spark.readStream.format("topiclake").option("subscribe", "src").option("startingOffsets", "earliest")
     .option("maxOffsetsPerTrigger", 400).load()
     .selectExpr("key", "value", "partition")
     .repartition(3)
     .writeStream.format("topiclake").option("topic", "copy").option("checkpointLocation", checkpoint)
     .trigger(availableNow=True).start())
q.awaitTermination()
print("done", flush=True)
"""


@pytest.mark.slow
def test_a_query_killed_mid_stream_restarts_from_its_checkpoint_and_every_row_lands_once(tmp_path):
    root = str(tmp_path / "root")
    storage = make_topics(root, src=3, copy=3)
    w = TopicWriter(storage, "src", load_settings().writer)
    for i in range(6):
        w.append(make_batch(1000, partitions=3, topic="src", key_prefix=f"r{i}-"))
    script = tmp_path / "query.py"
    script.write_text(QUERY)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(script), root, str(tmp_path / "ckpt")]

    def copied() -> int:
        try:
            r = TopicReader(storage, "copy")
            return sum(r.high_watermark(p) for p in range(3))
        except Exception:
            return 0

    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    deadline = time.monotonic() + 180
    while copied() < 1500 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the query finished before it could be killed: give it more rows"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver, its JVM and the Python workers at once
    proc.wait()
    killed_at = copied()
    assert 0 < killed_at < 6000
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    reader = TopicReader(storage, "copy")
    values = []
    for p in range(3):
        values += reader.fetch(p, 0, max_records=100_000, max_bytes=1 << 30).records.column("value").to_pylist()
    assert len(values) == 6000 and len(set(values)) == 6000, (killed_at, len(values), len(set(values)))


@pytest.mark.parametrize("ack_mode", ["table", "log"])
def test_the_sink_beside_a_live_gateway_never_duplicates_an_offset(spark, tmp_path, ack_mode):
    root = tmp_path / "root"
    srv = ServerProcess(root).start()
    try:
        AdminClient(srv.url).create_topic("mixed", partitions=2, config={"topiclake.ack.mode": ack_mode})
        stop = threading.Event()
        acked: list[int] = []

        def produce() -> None:
            with Producer(srv.url, linger_ms=2, value_format="string") as p:
                i = 0
                while not stop.is_set():
                    p.send("mixed", f"http-{i}", partition=i % 2).result(timeout=60)
                    acked.append(i)
                    i += 1

        t = threading.Thread(target=produce)
        t.start()
        try:
            df = (
                spark.range(4000)
                .repartition(4)
                .selectExpr("CAST(id % 2 AS INT) AS partition", "concat('spark-', id) AS value")
            )
            df.write.format("topiclake").option("root", str(root)).option("topic", "mixed").mode("append").save()
        finally:
            stop.set()
            t.join()
        assert acked, "the HTTP producer ran beside the sink"
        # the sink found the gateway in the root's membership and sent its records through it
        # (on a `log` topic the counter, of records in the table, trails the acks by the lag)
        deadline = time.monotonic() + 15
        while (records_in := metric_total(httpx.get(srv.url + "/metrics").text, "topiclake_records_in_total")) < (
            4000 + len(acked)
        ) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert records_in == 4000 + len(acked)
    finally:
        srv.stop()  # a `log` topic's acks are in its table once the gateway stopped (or within its lag)
    rows = (
        read_topic(spark, str(root), "mixed").selectExpr("partition", "offset", "CAST(value AS STRING) AS v").collect()
    )
    values = [r.v for r in rows]
    assert sorted(v for v in values if v.startswith("spark-")) == sorted(f"spark-{i}" for i in range(4000))
    assert sorted(v for v in values if v.startswith("http-")) == sorted(f"http-{i}" for i in acked)
    for p in (0, 1):  # unique, contiguous offsets whoever wrote them
        offsets = sorted(r.offset for r in rows if r.partition == p)
        assert offsets == list(range(len(offsets)))


def test_the_sink_checks_values_against_the_topics_schema(spark, tmp_path):
    import json

    from delta_log.core.value_schemas import parse_schema
    from delta_log.system.schemas import SchemaStore

    root = str(tmp_path / "root")
    storage = make_topics(root, events=2)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    SchemaStore(storage).register("events-value", parse_schema("JSON", json.dumps(schema)))
    df = spark.sql("SELECT IF(id = 3, '{\"n\": \"three\"}', to_json(named_struct('n', id))) AS value FROM range(10)")
    write = df.write.format("topiclake").option("root", root).option("topic", "events").option("gateway", "none")
    with pytest.raises(Exception, match=r"SCHEMA_VALIDATION_FAILED|do not match the value schema"):
        write.mode("append").save()
    assert read_topic(spark, root, "events").count() == 0  # nothing of the write (an empty topic reads)

    Catalog(storage, load_settings(root=root).writer).alter_config("events", {"errors.tolerance": "all"})
    write.mode("append").save()
    assert sorted(
        json.loads(r.v)["n"]
        for r in read_topic(spark, root, "events").selectExpr("CAST(value AS STRING) AS v").collect()
    ) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    dlq = spark.read.format("topiclake").option("root", root).option("subscribe", "events.dlq")
    (letter,) = dlq.option("includeHeaders", "true").load().collect()
    headers = {h.key: h.value.decode() for h in letter.headers}
    assert json.loads(letter.value) == {"n": "three"} and headers["__connect.errors.topic"] == "events"
    assert "integer" in headers["__connect.errors.exception.message"]
