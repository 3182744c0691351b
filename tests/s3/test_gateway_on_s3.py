"""`topiclake serve --root s3://...` against a real S3 server, started as a user starts it (the
endpoint and credentials in the standard AWS environment variables)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import httpx
import pytest
from deltalake import DeltaTable

from tests.e2e import test_jobs_e2e as jobs_e2e
from tests.e2e import test_kafka_transactions as kafka_txn
from tests.e2e import test_notebooks as notebooks
from tests.e2e.server import REPO, ServerProcess
from tests.e2e.test_write_ahead import LONG_LEASES, check_restart
from tests.s3.minio import SECRET_KEY
from topiclake import Consumer, Producer


def read_values(url: str, topic: str, partitions: int) -> list[int]:
    values: list[int] = []
    for p in range(partitions):
        r = httpx.get(
            f"{url}/topics/{topic}/partitions/{p}/records",
            params={"offset": 0, "max_records": 100_000, "value_format": "json"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        offsets = [rec["offset"] for rec in r.json()["records"]]
        assert offsets == list(range(len(offsets)))  # contiguous from 0
        values += [rec["value"]["n"] for rec in r.json()["records"]]
    return values


def test_produce_fetch_groups_and_restart_on_s3(minio):
    root = minio.root(f"gw-{uuid.uuid4().hex[:8]}")
    srv = ServerProcess(root).start()
    try:
        assert httpx.post(srv.url + "/topics", json={"name": "orders", "partitions": 3}, timeout=60).status_code == 201
        with Producer(srv.url, linger_ms=5) as p:
            for f in [p.send("orders", value={"n": i}, key=f"k{i}") for i in range(300)]:
                f.result(timeout=60)
        assert sorted(read_values(srv.url, "orders", 3)) == list(range(300))

        c = Consumer(srv.url, group_id="g", auto_offset_reset="earliest", enable_auto_commit=False)
        c.subscribe(["orders"])
        got: list[int] = []
        deadline = time.monotonic() + 60
        while len(got) < 300 and time.monotonic() < deadline:
            got += [json.loads(r.value)["n"] for r in c.poll(1.0)]
        c.commit()
        c.close()
        assert sorted(got) == list(range(300))

        srv.stop()
        srv.start()  # everything lives in the bucket
        offsets = httpx.get(f"{srv.url}/groups/g/offsets", timeout=60).json()["offsets"]
        assert sum(o["offset"] for o in offsets) == 300
        assert sorted(read_values(srv.url, "orders", 3)) == list(range(300))
        ready = httpx.get(srv.url + "/readyz", timeout=30)
        assert ready.status_code == 200 and ready.json()["root"] == root
    finally:
        srv.stop()
    assert SECRET_KEY not in srv.log.read_text()  # never logged


def test_kafka_transactions_on_s3_commit_abort_and_survive_a_kill_9_with_one_open(minio):
    """Kafka's transactions on an S3 root, where staging cannot be renamed aside, so librdkafka's
    next transaction (version 1, the same epoch) waits for the last one's landing: two commits
    back to back and an abort, then kill -9 with a transaction open. The restarted gateway takes
    the id over from the bucket (its saved state, and the open transaction from its staging),
    and the producer's commit lands it whole: a read_committed consumer sees every committed
    record once and nothing aborted."""
    root = minio.root(f"txn-{uuid.uuid4().hex[:8]}")
    srv = ServerProcess(root).start()
    try:
        topic = kafka_txn._topic(srv)
        producer = kafka_txn._producer(srv, "on-s3", **{"transaction.timeout.ms": 60_000})

        def begin_and_write(prefix: str, count: int) -> list[bytes]:
            producer.begin_transaction()
            values = [f"{prefix}{i}".encode() for i in range(count)]
            for i, value in enumerate(values):
                producer.produce(topic, value=value, partition=i % 3)
            producer.flush(30)
            return values

        expected = [*begin_and_write("c0-", 30)]
        producer.commit_transaction(60)
        expected += begin_and_write("c1-", 30)
        producer.commit_transaction(60)
        begin_and_write("a", 10)
        producer.abort_transaction(60)
        expected += begin_and_write("r", 20)
        srv.kill9()
        srv.start()
        producer.commit_transaction(60)
        assert sorted(kafka_txn._read_committed(srv, [topic], len(expected), wait_s=60)) == sorted(expected)
    finally:
        srv.stop()


def test_a_gateway_restarted_after_kill_9_on_s3_serves_every_acked_offset_when_ready(minio):
    """As on a local root (tests/e2e/test_write_ahead.check_restart): the write-ahead log's objects
    are replayed before the restarted gateway serves."""
    root = minio.root(f"restart-{uuid.uuid4().hex[:8]}")

    def rows() -> list[dict]:
        return (
            DeltaTable(f"{root}/topics/restart", storage_options=minio.storage_options()).to_pyarrow_table().to_pylist()
        )

    check_restart(root, rows, env=LONG_LEASES)


def test_two_gateways_on_one_bucket_and_a_kill_9_under_load(minio):
    root = minio.root(f"cl-{uuid.uuid4().hex[:8]}")
    fast = {"TOPICLAKE_CLUSTER__HEARTBEAT_INTERVAL_S": "0.3", "TOPICLAKE_CLUSTER__MEMBER_TIMEOUT_S": "3"}
    a, b = ServerProcess(root, env=fast).start(), ServerProcess(root, env=fast).start()
    try:
        deadline = time.monotonic() + 30
        while len(httpx.get(a.url + "/cluster", timeout=10).json()["gateways"]) < 2:
            assert time.monotonic() < deadline, "the gateways did not see each other through the bucket"
            time.sleep(0.2)
        assert httpx.post(a.url + "/topics", json={"name": "t", "partitions": 4}, timeout=60).status_code == 201
        acked: list[int] = []
        stop = threading.Event()

        def produce() -> None:
            with Producer([b.url, a.url], linger_ms=5, retries=100) as p:
                n = 0
                while not stop.is_set():
                    futures = [(i, p.send("t", value={"n": i}, key=f"k{i}")) for i in range(n, n + 20)]
                    n += 20
                    for i, f in futures:
                        try:
                            f.result(timeout=60)
                            acked.append(i)
                        except Exception:
                            pass

        t = threading.Thread(target=produce, daemon=True)
        t.start()
        while len(acked) < 200:
            time.sleep(0.1)
        assert b.proc is not None
        os.kill(b.proc.pid, signal.SIGKILL)  # the gateway the producer talks to
        b.proc.wait(10)
        count = len(acked)
        while len(acked) < count + 200:
            time.sleep(0.1)
        stop.set()
        t.join(120)
        seen = read_values(a.url, "t", 4)
        deadline = time.monotonic() + 10
        while not set(acked) <= set(seen) and time.monotonic() < deadline:
            time.sleep(0.5)
            seen = read_values(a.url, "t", 4)
        assert len(seen) == len(set(seen)) and set(acked) <= set(seen)  # every acked record, once
    finally:
        a.stop()
        b.stop()


def test_the_retention_job_on_s3(minio):
    root = minio.root(f"jobs-{uuid.uuid4().hex[:8]}")
    srv = ServerProcess(root).start()
    try:
        body = {"name": "old", "partitions": 1, "config": {"retention.ms": "60000"}}
        assert httpx.post(srv.url + "/topics", json=body, timeout=60).status_code == 201
        old = int(time.time() * 1000) - 3_600_000
        for i in range(3):  # three segments an hour old, then a fresh one
            records = [{"value": i, "timestamp": old} for _ in range(10)]
            assert httpx.post(f"{srv.url}/topics/old/records", json={"records": records}, timeout=60).status_code == 200
        assert (
            httpx.post(f"{srv.url}/topics/old/records", json={"records": [{"value": 9}]}, timeout=60).status_code == 200
        )
    finally:
        srv.stop()
    done = subprocess.run(
        [sys.executable, "-m", "topiclake", "jobs", "retention", "--root", root, "--local"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert SECRET_KEY not in done.stdout + done.stderr
    srv.start()
    try:
        offsets = httpx.get(f"{srv.url}/topics/old/offsets", timeout=60).json()["partitions"][0]
        assert offsets["log_start_offset"] == 30 and offsets["high_watermark"] == 31, offsets
    finally:
        srv.stop()


@pytest.mark.parametrize("name", ["quickstart", "consumer_lag"])
def test_a_notebook_over_an_s3_root(minio, monkeypatch, tmp_path, name):
    """The notebooks as a user runs them with TOPICLAKE_ROOT=s3://...: the kernel's Spark gets s3a
    because its root is on S3, and reads the topics the gateway wrote to the bucket."""
    srv = ServerProcess(minio.root(f"nb-{uuid.uuid4().hex[:8]}")).start()
    try:
        notebooks.test_notebook_runs(REPO / "notebooks" / f"{name}.ipynb", srv, monkeypatch, tmp_path)
    finally:
        srv.stop()


def test_the_rebalance_job_on_s3_while_the_server_is_down(minio, tmp_path):
    jobs_e2e.rebalance_while_the_server_is_down(minio.root(f"rb-{uuid.uuid4().hex[:8]}"), tmp_path)
