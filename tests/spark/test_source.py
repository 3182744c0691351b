"""format("topiclake"): Spark's Kafka source, over topic tables."""

import itertools
import time

import pytest
from deltalake import DeltaTable
from pyspark.errors import PySparkException
from pyspark.sql import types as T

from conf import load_settings
from delta_log import Catalog, OffsetStore, StorageRoot, TopicWriter
from tests.integration.conftest import make_batch
from tests.spark.test_interop import KAFKA_SOURCE_SCHEMA

_ids = itertools.count()


@pytest.fixture
def root(tmp_path):
    return str(tmp_path / "root")


def make_topic(root, partitions=2, records=100, name=None):
    name = name or f"src{next(_ids)}"
    settings = load_settings(root=root)
    storage = StorageRoot(root)
    Catalog(storage, settings.writer).create_topic(name, partitions=partitions)
    w = TopicWriter(storage, name, settings.writer)
    if records:
        w.append(make_batch(records, partitions=partitions, topic=name))
    return name, w


def source(spark, root, topic, **opts):
    r = spark.read.format("topiclake").option("root", root).option("subscribe", topic)
    for k, v in opts.items():
        r = r.option(k, str(v))
    return r.load()


def test_schema_is_kafkas(spark, root):
    topic, _ = make_topic(root)
    assert source(spark, root, topic).schema == T.StructType(KAFKA_SOURCE_SCHEMA.fields[:-1])
    assert source(spark, root, topic, includeHeaders="true").schema == KAFKA_SOURCE_SCHEMA


def test_batch_read_with_offsets(spark, root):
    topic, _ = make_topic(root, records=100)
    df = source(spark, root, topic)
    assert df.count() == 100
    rows = source(
        spark,
        root,
        topic,
        startingOffsets=f'{{"{topic}": {{"0": 10, "1": -2}}}}',
        endingOffsets=f'{{"{topic}": {{"0": 20, "1": -1}}}}',
    ).collect()
    by_p = {
        0: sorted(r.offset for r in rows if r.partition == 0),
        1: sorted(r.offset for r in rows if r.partition == 1),
    }
    assert by_p == {0: list(range(10, 20)), 1: list(range(50))}
    assert rows[0].topic == topic


def test_starting_timestamp(spark, root):
    topic, w = make_topic(root, records=40)
    time.sleep(0.05)
    mid = int(time.time() * 1000)
    time.sleep(0.05)
    w.append(make_batch(10, partitions=2, topic=topic))
    rows = source(spark, root, topic, startingTimestamp=mid).collect()
    assert sorted((r.partition, r.offset) for r in rows) == [(p, o) for p in (0, 1) for o in range(20, 25)]


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        ({"startingOffsets": "{not json"}, "startingOffsets is not valid JSON"),
        ({"assign": '{"x": [0]}'}, "exactly one of subscribe"),
        ({"maxOffsetsPerTrigger": "-5"}, "maxOffsetsPerTrigger must be a positive integer"),
    ],
)
def test_option_errors_are_clear(spark, root, opts, message):
    topic, _ = make_topic(root)
    with pytest.raises(PySparkException) as e:
        source(spark, root, topic, **opts).collect()
    assert message in str(e.value)


def test_unknown_topic(spark, root):
    make_topic(root)
    with pytest.raises(PySparkException) as e:
        source(spark, root, "no-such-topic").collect()
    assert "does not exist" in str(e.value)


def run_available_now(spark, root, topic, sink, checkpoint, **opts):
    reader = spark.readStream.format("topiclake").option("root", root).option("subscribe", topic)
    for k, v in opts.items():
        reader = reader.option(k, str(v))
    q = (
        reader.load()
        .writeStream.format("delta")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start(sink)
    )
    q.awaitTermination(180)
    return q


def test_max_offsets_per_trigger_splits_backlog(spark, root, tmp_path):
    topic, _ = make_topic(root, records=1000)
    q = run_available_now(
        spark,
        root,
        topic,
        str(tmp_path / "sink"),
        str(tmp_path / "ckpt"),
        startingOffsets="earliest",
        maxOffsetsPerTrigger=250,
    )
    batches = [p for p in q.recentProgress if p["numInputRows"] > 0]
    assert [p["numInputRows"] for p in batches] == [250, 250, 250, 250]
    assert spark.read.format("delta").load(str(tmp_path / "sink")).count() == 1000
    end = batches[-1]["sources"][0]["endOffset"]
    assert '"0":500' in end.replace(" ", "") and '"1":500' in end.replace(" ", "")  # per-partition progress


def test_exactly_once_after_abrupt_stop_and_restart(spark, root, tmp_path):
    topic, w = make_topic(root, records=400)
    sink, ckpt = str(tmp_path / "sink"), str(tmp_path / "ckpt")
    q = (
        spark.readStream.format("topiclake")
        .option("root", root)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", 50)
        .load()
        .writeStream.format("delta")
        .option("checkpointLocation", ckpt)
        .trigger(processingTime="100 milliseconds")
        .start(sink)
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len([p for p in q.recentProgress if p["numInputRows"]]) < 3:
        time.sleep(0.1)
    q.stop()  # mid-way: 400 records, 50 per batch
    for _ in range(3):
        w.append(make_batch(20, partitions=2, topic=topic))
    run_available_now(spark, root, topic, sink, ckpt)
    got = spark.read.format("delta").load(sink).select("partition", "offset").collect()
    assert len(got) == 460 and len(set(got)) == 460  # every record exactly once
    for p in (0, 1):
        assert sorted(r.offset for r in got if r.partition == p) == list(range(230))


def test_fail_on_data_loss(spark, root, tmp_path):
    topic, _ = make_topic(root, partitions=1, records=0)
    w = TopicWriter(StorageRoot(root), topic, load_settings(root=root).writer)
    for _ in range(4):
        w.append(make_batch(25, topic=topic))
    DeltaTable(StorageRoot(root).topic_uri(topic)).delete('"offset" < 50')  # retention removed a prefix
    start = f'{{"{topic}": {{"0": 10}}}}'
    with pytest.raises(Exception) as e:
        run_available_now(spark, root, topic, str(tmp_path / "s1"), str(tmp_path / "c1"), startingOffsets=start)
        raise AssertionError("the query should have failed")
    # the Python error (DataLossError) is the root cause in Spark's chain, with what to do
    full = str(e.value) + str(getattr(e.value, "_stackTrace", ""))
    assert "no longer available" in full and "failOnDataLoss=false" in full
    run_available_now(
        spark, root, topic, str(tmp_path / "s2"), str(tmp_path / "c2"), startingOffsets=start, failOnDataLoss="false"
    )
    offs = sorted(r.offset for r in spark.read.format("delta").load(str(tmp_path / "s2")).collect())
    assert offs == list(range(50, 100))  # continued from the log start offset


def test_group_id_commits_and_new_partitions(spark, root, tmp_path):
    topic, _ = make_topic(root, partitions=2, records=100)
    sink, ckpt = str(tmp_path / "sink"), str(tmp_path / "ckpt")
    run_available_now(spark, root, topic, sink, ckpt, startingOffsets="earliest", groupId="spark-etl")
    committed = {k: c.offset for k, c in OffsetStore(StorageRoot(root)).committed("spark-etl").items()}
    assert committed == {(topic, 0): 50, (topic, 1): 50}
    Catalog(StorageRoot(root), load_settings(root=root).writer).add_partitions(topic, 3)
    w2 = TopicWriter(StorageRoot(root), topic, load_settings(root=root).writer)
    w2.append(make_batch(9, partitions=3, topic=topic))
    run_available_now(spark, root, topic, sink, ckpt, groupId="spark-etl")
    got = spark.read.format("delta").load(sink).groupBy("partition").count().collect()
    assert {r.partition: r["count"] for r in got} == {0: 53, 1: 53, 2: 3}
    assert OffsetStore(StorageRoot(root)).committed("spark-etl")[(topic, 2)].offset == 3
