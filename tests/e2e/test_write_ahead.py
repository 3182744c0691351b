"""`log` topics (topiclake.ack.mode=log) on a gateway started as users start it: acked from the
write-ahead log, fetched over HTTP and Kafka before the Delta table holds them, in the table within
the lag, and exactly once after kill -9 under load."""

from __future__ import annotations

import time

import httpx
from confluent_kafka import Consumer, Producer
from deltalake import DeltaTable

from tests.e2e.load import ProduceLoad, check_acked_once
from tests.e2e.server import ServerProcess


def table_rows(root, topic: str) -> list[dict]:
    return DeltaTable(str(root / "topics" / topic)).to_pyarrow_table().to_pylist()


def test_acks_are_fetched_before_the_table_holds_them_then_the_table_catches_up(server, tmp_path):
    root = server.root
    created = httpx.post(
        f"{server.url}/topics",
        json={
            "name": "wal",
            "partitions": 2,
            "config": {"topiclake.ack.mode": "log", "topiclake.table.max.lag.ms": 4000},
        },
    )
    assert created.status_code == 201, created.text
    r = httpx.post(
        f"{server.url}/topics/wal/records", json={"records": [{"value": i, "partition": 0} for i in range(5)]}
    )
    assert r.status_code == 200 and [o["offset"] for o in r.json()["offsets"]] == [0, 1, 2, 3, 4]
    fetched = httpx.get(f"{server.url}/topics/wal/partitions/0/records?offset=0&value_format=json").json()
    assert [rec["value"] for rec in fetched["records"]] == [0, 1, 2, 3, 4]
    assert table_rows(root, "wal") == []  # acked and served, not yet in the table
    info = httpx.get(f"{server.url}/topics/wal").json()
    assert info["config"]["topiclake.ack.mode"] == "log" and info["table_lag_ms"] >= 0
    metrics = httpx.get(f"{server.url}/metrics").text
    assert 'topiclake_table_lag_seconds{topic="wal"}' in metrics
    # every ack waited for a durable write: the histogram of their times counts them
    syncs = {
        line.split()[0]: float(line.split()[1])
        for line in metrics.splitlines()
        if line.startswith("topiclake_write_ahead_sync_seconds")
    }
    buckets = [v for k, v in syncs.items() if "_bucket" in k]
    assert (
        syncs["topiclake_write_ahead_sync_seconds_count"] >= 1 and syncs["topiclake_write_ahead_sync_seconds_sum"] > 0
    )
    assert buckets == sorted(buckets) and buckets[-1] == syncs["topiclake_write_ahead_sync_seconds_count"]

    # a Kafka producer's acks=all is the write-ahead ack too; a Kafka consumer reads at once
    producer = Producer({"bootstrap.servers": server.kafka, "enable.idempotence": True, "acks": "all"})
    for i in range(20):
        producer.produce("wal", key=f"k{i}".encode(), value=f"v{i}".encode(), partition=1)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": server.kafka, "group.id": "wal-readers", "auto.offset.reset": "earliest"})
    consumer.subscribe(["wal"])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 25 and time.monotonic() < deadline:
        m = consumer.poll(0.2)
        if m is not None and m.error() is None:
            got.append((m.partition(), m.offset()))
    consumer.close()
    assert sorted(got) == sorted([(0, i) for i in range(5)] + [(1, i) for i in range(20)])

    deadline = time.monotonic() + 15
    while len(table_rows(root, "wal")) < 25 and time.monotonic() < deadline:
        time.sleep(0.2)
    rows = table_rows(root, "wal")
    assert sorted((r["partition"], r["offset"]) for r in rows) == sorted(got)


def test_kill9_under_load_keeps_every_acked_record_once_with_contiguous_offsets(tmp_path):
    root = tmp_path / "data"
    srv = ServerProcess(root).start()
    config = {"topiclake.ack.mode": "log", "topiclake.table.max.lag.ms": 3000}
    httpx.post(srv.url + "/topics", json={"name": "load", "partitions": 2, "config": config}).raise_for_status()
    load = ProduceLoad(srv.url, "load").start()
    load.wait_for(300)
    in_table = len(table_rows(root, "load"))
    srv.kill9()
    load.stop()
    assert len(load.acked) >= 300
    assert in_table < 10 * len(load.acked)  # acks were ahead of the table when the gateway died

    srv2 = ServerProcess(root, port=srv.port).start()  # replays the dead gateway's log once its leases end
    try:
        deadline = time.monotonic() + 30
        while len(table_rows(root, "load")) < 10 * len(load.acked) and time.monotonic() < deadline:
            time.sleep(0.3)
        check_acked_once(table_rows(root, "load"), load.acked, 2)
        info = httpx.get(srv2.url + "/topics/load").json()
        r = httpx.post(srv2.url + "/topics/load/records", json={"records": [{"value": 1, "partition": 0}]})
        assert r.json()["offsets"][0]["offset"] == info["partition_offsets"][0]["high_watermark"]
    finally:
        srv2.stop()
