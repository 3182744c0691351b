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
