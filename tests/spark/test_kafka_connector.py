"""Spark's own Kafka connector (spark-sql-kafka-0-10 for Spark 4.2) against a gateway's Kafka
listener: df.write.format("kafka"), a batch read, a readStream with a checkpoint that is restarted,
and the same rows through the topic's Delta table and SQL."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.e2e.server import ServerProcess

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("spark-kafka") / "data").start()
    yield srv
    srv.stop()


def test_spark_writes_and_reads_topics_with_its_kafka_connector(spark, gateway, tmp_path):
    admin = AdminClient({"bootstrap.servers": gateway.kafka})
    admin.create_topics([NewTopic("events", 2, 1)])["events"].result(30)
    kafka = {"kafka.bootstrap.servers": gateway.kafka}

    rows = spark.createDataFrame([(f"k{i}", f"v{i}") for i in range(100)], "key string, value string")
    rows.write.format("kafka").options(**kafka).option("topic", "events").save()

    read = spark.read.format("kafka").options(**kafka).option("subscribe", "events").load()
    assert read.columns == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    got = {(r.key.decode(), r.value.decode()) for r in read.collect()}
    assert got == {(f"k{i}", f"v{i}") for i in range(100)}

    # the same rows are the topic's Delta table, and SQL over it
    table = spark.read.format("delta").load(f"{gateway.root}/topics/events")
    assert table.count() == 100
    table.createOrReplaceTempView("events_table")
    assert spark.sql("SELECT count(DISTINCT key) FROM events_table").first()[0] == 100

    # a stream with a checkpoint, run, more records, run again: each record once
    out, checkpoint = str(tmp_path / "out"), str(tmp_path / "checkpoint")

    def run_stream() -> None:
        (
            spark.readStream.format("kafka")
            .options(**kafka)
            .option("subscribe", "events")
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("CAST(value AS STRING) AS value", "partition", "offset")
            .writeStream.format("delta")
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start(out)
            .awaitTermination(180)
        )

    run_stream()
    assert spark.read.format("delta").load(out).count() == 100
    p = Producer({"bootstrap.servers": gateway.kafka})
    for i in range(100, 150):
        p.produce("events", key=f"k{i}".encode(), value=f"v{i}".encode())
    p.flush(30)
    run_stream()
    copied = spark.read.format("delta").load(out)
    assert copied.count() == 150
    assert copied.select("partition", "offset").distinct().count() == 150


def test_spark_sees_a_committed_transaction_and_never_an_aborted_one(spark, gateway):
    """A transactional producer commits to two topics x three partitions, then aborts a second
    transaction: Spark's Kafka connector (read_committed and read_uncommitted), the `topiclake`
    source and the tables read with format("delta") hold exactly the committed records."""
    admin = AdminClient({"bootstrap.servers": gateway.kafka})
    for name in ("txn-a", "txn-b"):
        admin.create_topics([NewTopic(name, 3, 1)])[name].result(30)
    producer = Producer({"bootstrap.servers": gateway.kafka, "transactional.id": "spark-txn"})
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(60):
        producer.produce(("txn-a", "txn-b")[i % 2], value=f"c{i}".encode(), partition=i % 3)
    producer.commit_transaction(30)
    producer.begin_transaction()
    for i in range(30):
        producer.produce(("txn-a", "txn-b")[i % 2], value=f"x{i}".encode(), partition=i % 3)
    producer.flush(30)
    producer.abort_transaction(30)
    committed = {f"c{i}" for i in range(60)}
    kafka = {"kafka.bootstrap.servers": gateway.kafka, "subscribe": "txn-a,txn-b"}
    for isolation in ("read_committed", "read_uncommitted"):
        read = spark.read.format("kafka").options(**kafka).option("kafka.isolation.level", isolation).load()
        assert {r.value.decode() for r in read.select("value").collect()} == committed
    tables = [spark.read.format("delta").load(f"{gateway.root}/topics/{t}") for t in ("txn-a", "txn-b")]
    values = [r.value.decode() for t in tables for r in t.select("value").collect()]
    assert sorted(values) == sorted(committed)
    source = spark.read.format("topiclake").option("root", str(gateway.root)).option("subscribe", "txn-a,txn-b").load()
    assert {r.value.decode() for r in source.select("value").collect()} == committed
