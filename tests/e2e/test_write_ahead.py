"""`log` topics (topiclake.ack.mode=log) on a gateway started as users start it: acked from the
write-ahead log, fetched over HTTP and Kafka before the Delta table holds them, in the table within
the lag, and exactly once after kill -9 under load."""

from __future__ import annotations

import base64
import os
import signal
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from deltalake import DeltaTable

from tests.e2e.load import ProduceLoad, all_acked_stored, check_acked_once
from tests.e2e.server import ServerProcess

#: the table lag of the restart tests' topics: what "in the table within the lag" is held to
RESTART_LAG_MS = 1000
#: write-ahead leases far longer than a restart takes: a restarted gateway must not wait for the
#: leases of its dead predecessor to end (a gateway here starts in about 3-6 s, the default lease)
LONG_LEASES = {"TOPICLAKE_WRITER__WAL_LEASE_MS": "60000"}


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

    srv2 = ServerProcess(root, port=srv.port).start()  # replays the dead gateway's log before it serves
    try:
        deadline = time.monotonic() + 30
        while not all_acked_stored(table_rows(root, "load"), load.acked) and time.monotonic() < deadline:
            time.sleep(0.3)
        check_acked_once(table_rows(root, "load"), load.acked, 2)
        info = httpx.get(srv2.url + "/topics/load").json()
        r = httpx.post(srv2.url + "/topics/load/records", json={"records": [{"value": 1, "partition": 0}]})
        assert r.json()["offsets"][0]["offset"] == info["partition_offsets"][0]["high_watermark"]
    finally:
        srv2.stop()


def last_acked(acked: list[tuple[str, list[dict]]]) -> dict[int, int]:
    """Per partition, the highest offset a produce answer acked."""
    out: dict[int, int] = {}
    for _, offsets in acked:
        for o in offsets:
            out[o["partition"]] = max(out.get(o["partition"], -1), o["offset"])
    return out


def fetch_everything(url: str, topic: str, partitions: int) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record, fetched over HTTP from offset 0."""
    out = []
    with httpx.Client(base_url=url, timeout=10) as c:
        for p in range(partitions):
            offset = 0
            while True:
                r = c.get(f"/topics/{topic}/partitions/{p}/records", params={"offset": offset, "max_records": 1000})
                r.raise_for_status()
                records = r.json()["records"]
                if not records:
                    break
                out += [(p, rec["offset"], base64.b64decode(rec["value"])) for rec in records]
                offset = records[-1]["offset"] + 1
    return sorted(out)


def kafka_read_everything(bootstrap: str, topic: str, ends: dict[int, int]) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record below `ends` (per partition), read by a Kafka consumer."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{uuid.uuid4().hex[:6]}"})
    c.assign([TopicPartition(topic, p, 0) for p in ends])
    got: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + 60
    while len(got) < sum(ends.values()) and time.monotonic() < deadline:
        for m in c.consume(1000, timeout=0.5):
            if m.error() is None and m.offset() < ends[m.partition()]:
                got[(m.partition(), m.offset())] = m.value()
    c.close()
    return sorted((p, o, v) for (p, o), v in got.items())


def check_restart(
    root: Path | str,
    rows_of: Callable[[], list[dict]],
    *,
    env: dict[str, str] | None = None,
    partitions: int = 3,
    ack_mode: str = "log",
) -> None:
    """Produce load on a topic (`ack_mode` log or table), kill -9 the gateway, start it again on its
    ports: the moment it is ready it serves every acked offset (HTTP fetch, Kafka's high
    watermark), the table holds every acked record exactly once within the lag, and fetch (HTTP and
    Kafka) equals the table."""
    srv = ServerProcess(root, env=env).start()
    config = {"topiclake.ack.mode": ack_mode, "topiclake.table.max.lag.ms": RESTART_LAG_MS}
    created = httpx.post(srv.url + "/topics", json={"name": "restart", "partitions": partitions, "config": config})
    created.raise_for_status()
    load = ProduceLoad(srv.url, "restart").start()
    load.wait_for(300)
    srv.kill9()
    load.stop()
    last = last_acked(load.acked)
    assert len(last) == partitions and len(load.acked) >= 300
    if ack_mode == "log":
        assert len(rows_of()) < 10 * len(load.acked)  # acks were ahead of the table when the gateway died

    srv2 = ServerProcess(root, port=srv.port, env={**(env or {}), "TOPICLAKE_KAFKA__PORT": srv.kafka.split(":")[1]})
    try:
        srv2.start()  # returns at the first /healthz answered
        ready = time.monotonic()
        readiness = httpx.get(srv2.url + "/readyz", timeout=10).json()
        assert readiness["recovering_partitions"] == 0
        assert (readiness["recovery"]["records"] > 0) == (ack_mode == "log")  # replayed before it served
        with httpx.Client(base_url=srv2.url, timeout=10) as c:
            for p, offset in last.items():
                r = c.get(f"/topics/restart/partitions/{p}/records", params={"offset": offset, "max_records": 1})
                assert r.status_code == 200, r.text  # never 416: the high watermark did not go back
                assert [rec["offset"] for rec in r.json()["records"]] == [offset]
        watermarks = Consumer({"bootstrap.servers": srv2.kafka, "group.id": "watermarks"})
        for p, offset in last.items():
            _, high = watermarks.get_watermark_offsets(TopicPartition("restart", p), timeout=10)
            assert high >= offset + 1
        watermarks.close()
        deadline = ready + RESTART_LAG_MS / 1000
        while not all_acked_stored(rows_of(), load.acked) and time.monotonic() < deadline:
            time.sleep(0.05)
        rows = rows_of()
        check_acked_once(rows, load.acked, partitions)  # in the table within the lag of readiness, once
        stored = sorted((r["partition"], r["offset"], r["value"]) for r in rows)
        assert fetch_everything(srv2.url, "restart", partitions) == stored
        ends = {p: 1 + max(o for q, o, _ in stored if q == p) for p in range(partitions)}
        assert kafka_read_everything(srv2.kafka, "restart", ends) == stored
    finally:
        srv2.stop()


@pytest.mark.parametrize("ack_mode", ["log", "table"])
def test_a_restarted_gateway_serves_every_acked_offset_the_moment_it_is_ready(tmp_path, ack_mode):
    root = tmp_path / "data"
    check_restart(root, lambda: table_rows(root, "restart"), env=LONG_LEASES, ack_mode=ack_mode)


def test_a_quiet_restart_puts_every_acked_record_in_the_table_with_no_request(tmp_path):
    """A burst, kill -9 right after its last ack, a restart, and no request at all: the table holds
    every acked record within the lag after readiness."""
    root = tmp_path / "data"
    srv = ServerProcess(root, env=LONG_LEASES).start()
    # a lag the burst cannot outlast on a loaded machine: nothing reaches the table before the kill
    config = {"topiclake.ack.mode": "log", "topiclake.table.max.lag.ms": 60_000}
    httpx.post(srv.url + "/topics", json={"name": "burst", "partitions": 2, "config": config}).raise_for_status()

    def send(i: int) -> tuple[str, list[dict]]:
        tag = f"b{i}"
        body = {"records": [{"key": tag, "value": {"tag": tag, "i": j}} for j in range(10)]}
        r = httpx.post(f"{srv.url}/topics/burst/records", json=body, timeout=30)
        r.raise_for_status()
        return tag, r.json()["offsets"]

    with ThreadPoolExecutor(8) as pool:
        acked = list(pool.map(send, range(40)))
    srv.kill9()
    assert len(table_rows(root, "burst")) < 400  # the burst was acked from the log, not the table

    srv2 = ServerProcess(root, port=srv.port, env=LONG_LEASES).start()
    try:
        ready = time.monotonic()  # and then within 1 s, far inside the topic's lag
        while len(table_rows(root, "burst")) < 400 and time.monotonic() < ready + RESTART_LAG_MS / 1000:
            time.sleep(0.05)
        check_acked_once(table_rows(root, "burst"), acked, 2)
    finally:
        srv2.stop()


def test_a_kafka_consumer_at_its_committed_end_reads_on_after_a_restart(tmp_path):
    """Committed offsets at the acked end and auto.offset.reset=earliest: after kill -9 and a
    restart the group reads the new records only, never the partition again from its start."""
    root = tmp_path / "data"
    srv = ServerProcess(root, env=LONG_LEASES).start()
    kafka_port = srv.kafka.split(":")[1]
    config = {"topiclake.ack.mode": "log", "topiclake.table.max.lag.ms": 60_000}  # nothing flushed before the kill
    httpx.post(srv.url + "/topics", json={"name": "acked", "partitions": 2, "config": config}).raise_for_status()

    def produce(bootstrap: str, first: int, count: int) -> None:
        p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
        for i in range(first, first + count):
            p.produce("acked", key=f"k{i}".encode(), value=f"v{i}".encode())
        assert p.flush(30) == 0

    def consume(bootstrap: str, want: int) -> list[tuple[int, int, bytes]]:
        c = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "readers",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        c.subscribe(["acked"])
        got = []
        deadline = time.monotonic() + 60
        while len(got) < want and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                if m.error() is None:
                    got.append((m.partition(), m.offset(), m.value()))
        # and nothing more arrives: a re-read would come right behind
        extra = c.consume(500, timeout=2.0)
        got += [(m.partition(), m.offset(), m.value()) for m in extra if m.error() is None]
        c.commit(asynchronous=False)
        c.close()
        return got

    produce(srv.kafka, 0, 300)
    first = consume(srv.kafka, 300)
    assert sorted(v for _, _, v in first) == sorted(f"v{i}".encode() for i in range(300))
    srv.kill9()

    srv2 = ServerProcess(root, port=srv.port, env={**LONG_LEASES, "TOPICLAKE_KAFKA__PORT": kafka_port}).start()
    try:
        produce(srv2.kafka, 300, 50)
        second = consume(srv2.kafka, 50)
        assert sorted(v for _, _, v in second) == sorted(f"v{i}".encode() for i in range(300, 350))
        ends = {}
        for p, o, _ in first:
            ends[p] = max(ends.get(p, -1), o)
        assert all(o > ends.get(p, -1) for p, o, _ in second)
    finally:
        srv2.stop()


def test_a_worker_killed_under_load_hands_its_acks_over_at_once(tmp_path):
    """`serve --workers 2` under produce load on a `log` topic, one worker killed with kill -9: the
    other sees at once that its process ended (not after the membership timeout or the leases),
    replays its log and takes its partitions; every acked record is in the table within the lag,
    exactly once, and Kafka's high watermarks cover every ack."""
    root = tmp_path / "data"
    srv = ServerProcess(root, args=["--workers", "2"], env=LONG_LEASES).start()
    try:
        gateways = wait_for_workers(srv.url, 2)
        config = {"topiclake.ack.mode": "log", "topiclake.table.max.lag.ms": RESTART_LAG_MS}
        created = httpx.post(srv.url + "/topics", json={"name": "workers", "partitions": 4, "config": config})
        created.raise_for_status()
        load = ProduceLoad(srv.url, "workers").start()
        load.wait_for(300)
        victim = gateways[0]
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        time.sleep(1.0)  # the load goes on through the other worker (and the one started again)
        load.stop()
        assert len(load.acked) >= 300
        # within the lag, plus the heartbeat that sees the process gone (1 s) and the replay
        deadline = killed + RESTART_LAG_MS / 1000 + 4.0
        while not all_acked_stored(table_rows(root, "workers"), load.acked) and time.monotonic() < deadline:
            time.sleep(0.05)
        check_acked_once(table_rows(root, "workers"), load.acked, 4)
        watermarks = Consumer({"bootstrap.servers": srv.kafka, "group.id": "watermarks"})
        for p, offset in last_acked(load.acked).items():
            _, high = watermarks.get_watermark_offsets(TopicPartition("workers", p), timeout=10)
            assert high >= offset + 1
        watermarks.close()
    finally:
        srv.stop()


def wait_for_workers(url: str, count: int, timeout: float = 60) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gateways = httpx.get(url + "/cluster", timeout=10).json()["gateways"]
        if len(gateways) == count:
            return gateways
        time.sleep(0.2)
    raise AssertionError(f"{count} workers did not join the cluster")
