"""Kafka's transactions with real clients against `topiclake serve`: confluent-kafka (librdkafka)
transactional producers and read_committed consumers, a consume-transform-produce service killed
with SIGKILL, zombie fencing, the coordinator's timeout, a gateway killed with a transaction open,
Java's transactional ProducerPerformance and kafka-transactions, and a Kafka Streams
exactly_once_v2 word count killed mid-stream."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from deltalake import DeltaTable

from bench.kafka_broker import ensure_jars, java
from tests.e2e import java_build, kafka_wire
from tests.e2e.server import REPO, ServerProcess


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    srv = ServerProcess(tmp_path_factory.mktemp("txn") / "data").start()
    yield srv
    srv.stop()


def _topic(gateway: ServerProcess, partitions: int = 3) -> str:
    name = f"tx-{uuid.uuid4().hex[:8]}"
    r = httpx.post(f"{gateway.url}/topics", json={"name": name, "partitions": partitions}, timeout=30)
    assert r.status_code == 201, r.text
    return name


def _producer(gateway: ServerProcess, tid: str, **extra: object) -> Producer:
    producer = Producer({"bootstrap.servers": gateway.kafka, "transactional.id": tid, "linger.ms": 5, **extra})
    producer.init_transactions(30)
    return producer


def _read_committed(gateway: ServerProcess, topics: list[str], expect: int, wait_s: float = 20) -> list[bytes]:
    consumer = Consumer(
        {
            "bootstrap.servers": gateway.kafka,
            "group.id": f"rc-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(topics)
    got: list[bytes] = []
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and len(got) < expect:
        for m in consumer.consume(500, 0.5):
            if m.error() is None:
                got.append(m.value())
    time.sleep(1.0 if len(got) == expect else 0)  # anything beyond what is expected shows up too
    got += [m.value() for m in consumer.consume(500, 1.0) if m.error() is None]
    consumer.close()
    return got


def _table_values(gateway: ServerProcess, topic: str) -> list[bytes]:
    """What Spark, SQL and every table reader see: the topic's Delta table."""
    table = DeltaTable(str(gateway.root / "topics" / topic)).to_pyarrow_table(columns=["value"])
    return table.column("value").to_pylist()


def test_a_committed_transaction_is_seen_whole_and_an_aborted_one_never(gateway):
    """Two topics x three partitions: the first transaction commits, the second aborts; a
    read_committed consumer and the Delta tables hold exactly the first."""
    a, b = _topic(gateway), _topic(gateway)
    producer = _producer(gateway, "commit-abort")
    producer.begin_transaction()
    delivered: list[int] = []
    for i in range(60):
        producer.produce(
            (a, b)[i % 2],
            value=f"c{i}".encode(),
            partition=i % 3,
            on_delivery=lambda e, m: delivered.append(m.offset()),
        )
    producer.commit_transaction(30)
    assert len(delivered) == 60
    producer.begin_transaction()
    for i in range(30):
        producer.produce((a, b)[i % 2], value=f"a{i}".encode(), partition=i % 3)
    producer.flush(30)
    producer.abort_transaction(30)
    got = _read_committed(gateway, [a, b], 60)
    assert sorted(got) == sorted(f"c{i}".encode() for i in range(60))
    assert sorted(_table_values(gateway, a) + _table_values(gateway, b)) == sorted(got)


def test_a_gateway_killed_mid_transaction_resumes_it_and_the_producer_commits_it_whole(tmp_path):
    """kill -9 of the gateway while a transaction is open (its records written and acked, not
    committed): restarted on the same root, it finds the transaction open in the producer's
    staging, with its partitions, and librdkafka's commit after the restart lands every record
    once."""
    srv = ServerProcess(tmp_path / "data").start()
    try:
        topic = _topic(srv, partitions=4)
        producer = _producer(srv, "resumed", **{"transaction.timeout.ms": 60_000})
        producer.begin_transaction()
        for i in range(40):
            producer.produce(topic, value=f"r{i}".encode(), partition=i % 4)
        producer.flush(30)
        srv.kill9()
        srv.start()
        state = httpx.get(f"{srv.url}/transactions/resumed", timeout=30).json()
        assert state["state"] == "Ongoing", state
        assert state["topics"] == [{"topic": topic, "partitions": [0, 1, 2, 3]}], state
        producer.commit_transaction(60)
        got = _read_committed(srv, [topic], 40)
        assert sorted(got) == sorted(f"r{i}".encode() for i in range(40))
        assert sorted(_table_values(srv, topic)) == sorted(got)
    finally:
        srv.stop()


def test_an_open_transaction_is_invisible_to_readers_and_to_list_offsets_until_it_commits(gateway):
    topic = _topic(gateway, 1)
    producer = _producer(gateway, "open-then-commit")
    plain = Producer({"bootstrap.servers": gateway.kafka})
    plain.produce(topic, value=b"before", partition=0)
    plain.flush(30)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, value=f"t{i}".encode(), partition=0)
    producer.flush(30)  # acked: staged with the transaction
    watcher = Consumer({"bootstrap.servers": gateway.kafka, "group.id": "w", "isolation.level": "read_committed"})
    assert watcher.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) == (0, 1)  # the LSO
    assert _read_committed(gateway, [topic], 1, wait_s=3) == [b"before"]
    assert _table_values(gateway, topic) == [b"before"]
    producer.commit_transaction(30)  # answered once decided, as Kafka: the records land right after
    deadline = time.monotonic() + 10
    while watcher.get_watermark_offsets(TopicPartition(topic, 0), timeout=10) != (0, 6):
        assert time.monotonic() < deadline, "the committed transaction never became stable"
        time.sleep(0.05)
    watcher.close()
    assert _read_committed(gateway, [topic], 6) == [b"before", b"t0", b"t1", b"t2", b"t3", b"t4"]


def test_a_second_producer_of_the_same_id_fences_the_first(gateway):
    topic = _topic(gateway, 1)
    zombie = _producer(gateway, "fenced")
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie", partition=0)
    zombie.flush(30)
    successor = _producer(gateway, "fenced")  # aborts the zombie's open transaction
    with pytest.raises(KafkaException) as failed:
        zombie.commit_transaction(30)
    assert failed.value.args[0].fatal() or "fenced" in str(failed.value).lower()
    successor.begin_transaction()
    successor.produce(topic, value=b"successor", partition=0)
    successor.commit_transaction(30)
    assert _read_committed(gateway, [topic], 1) == [b"successor"]


_OPEN_AND_HANG = """
import sys, time
from confluent_kafka import Producer
p = Producer({"bootstrap.servers": sys.argv[1], "transactional.id": sys.argv[2], "transaction.timeout.ms": 3000})
p.init_transactions(30)
p.begin_transaction()
p.produce(sys.argv[3], value=b"lost", partition=0)
p.flush(30)
print("open", flush=True)
time.sleep(600)
"""


def _state(gateway: ServerProcess, tid: str) -> str:
    """DescribeTransactions' state of `tid`, read off the answer's first fields (kio cannot type
    the -1 start time Kafka sends for a transaction that is not open)."""
    sock = kafka_wire.connect(gateway.kafka)
    try:
        kafka_wire.send(sock, 65, 0, transactional_ids=(tid,))
        size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
        frame = sock.recv(size, socket.MSG_WAITALL)
    finally:
        sock.close()
    at = 4 + 1 + 4 + 1 + 2  # correlation id, tagged fields, throttle, array length, error code
    tid_len = frame[at] - 1
    at += 1 + tid_len
    return frame[at + 1 : at + frame[at]].decode()


def test_a_killed_producers_transaction_is_aborted_at_its_timeout(gateway):
    topic = _topic(gateway, 1)
    proc = subprocess.Popen(
        [sys.executable, "-c", _OPEN_AND_HANG, gateway.kafka, "killed", topic], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "open"
        assert _state(gateway, "killed") == "Ongoing"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    deadline = time.monotonic() + 20
    while _state(gateway, "killed") != "CompleteAbort" and time.monotonic() < deadline:
        time.sleep(0.25)
    assert _state(gateway, "killed") == "CompleteAbort"
    assert _table_values(gateway, topic) == []
    successor = _producer(gateway, "killed")
    successor.begin_transaction()
    successor.produce(topic, value=b"after", partition=0)
    successor.commit_transaction(30)
    assert _read_committed(gateway, [topic], 1) == [b"after"]


def test_consume_transform_produce_killed_twice_outputs_every_input_once(gateway):
    """A service that reads a topic and writes each record to another in transactions that also
    commit its group's offsets, SIGKILLed twice mid-stream and restarted: the output holds every
    input record exactly once, and the group's committed offsets are the input's end offsets."""
    source, sink = _topic(gateway), _topic(gateway)
    total = 3000
    feeder = Producer({"bootstrap.servers": gateway.kafka, "linger.ms": 5})
    for i in range(total):
        feeder.produce(source, value=f"r{i}".encode(), partition=i % 3)
    feeder.flush(30)
    cmd = [sys.executable, "-m", "tests.e2e.txn_worker", gateway.kafka, "ctp-1", source, sink, "ctp", "5"]
    for _ in range(2):
        worker = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert worker.stdout is not None
        commits = 0
        while commits < 3:  # killed while it is committing transactions
            line = worker.stdout.readline()
            assert line, "the worker ended before it was killed"
            commits += line.startswith("committed")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    finished = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180)
    assert finished.returncode == 0, finished.stderr[-2000:]
    got = _read_committed(gateway, [sink], total)
    assert len(got) == total and set(got) == {f"r{i}".encode() for i in range(total)}
    ends = {
        p["partition"]: p["high_watermark"]
        for p in httpx.get(f"{gateway.url}/topics/{source}").json()["partition_offsets"]
    }

    def committed() -> dict[int, int]:  # the last transaction's offsets land just after its records
        offsets = httpx.get(f"{gateway.url}/groups/ctp/offsets", timeout=30).json()["offsets"]
        return {o["partition"]: o["offset"] for o in offsets if o["topic"] == source}

    deadline = time.monotonic() + 10
    while committed() != ends and time.monotonic() < deadline:
        time.sleep(0.1)
    assert committed() == ends


def test_a_busy_producer_through_state_table_rewrites_and_a_kill_keeps_each_transaction_whole(tmp_path):
    """A producer commits hundreds of small transactions, so the gateway rewrites the state table
    (every 256 saves, beside the saves going on) while it is killed with SIGKILL mid-load; a new
    producer of the id goes on after the restart. Every transaction whose commit returned is read
    once, the one in flight at the kill whole or not at all, and nothing else."""
    srv = ServerProcess(tmp_path / "data").start()
    try:
        topic = _topic(srv, partitions=2)
        committed: list[bytes] = []
        in_flight: list[bytes] = []
        killer = threading.Timer(6.0, srv.kill9)
        producer = _producer(srv, "busy")
        killer.start()
        n = 0
        try:
            while True:
                values = [f"t{n}-{i}".encode() for i in range(3)]
                in_flight = values
                producer.begin_transaction()
                for v in values:
                    producer.produce(topic, value=v)
                producer.commit_transaction(10)
                committed += values
                in_flight = []
                n += 1
        except KafkaException:  # the gateway died under it
            pass
        killer.join()
        assert n > 300, n  # enough saves for the state table's rewrites
        srv.start()
        producer = _producer(srv, "busy")  # fences the old one and finishes what it decided
        for m in range(20):
            producer.begin_transaction()
            producer.produce(topic, value=f"after-{m}".encode())
            producer.commit_transaction(30)
        committed += [f"after-{m}".encode() for m in range(20)]
        got = _read_committed(srv, [topic], len(committed), wait_s=40)  # and what follows, for a second
        assert len(got) == len(set(got))  # none twice
        extra = set(got) - set(committed)
        assert extra in (set(), set(in_flight)), sorted(extra)[:5]  # the one in flight: whole or not at all
        assert set(committed) <= set(got)
        assert sorted(_table_values(srv, topic)) == sorted(got)
    finally:
        srv.stop()


def test_java_transactional_producer_and_kafka_transactions(gateway):
    """Java's client (transaction version 2, which the gateway finalizes): ProducerPerformance
    commits a transaction every 200 ms, each EndTxn v5 bumping the epoch; kafka-transactions lists
    and describes the id."""
    libs = ensure_jars()
    topic = _topic(gateway)
    cmd = [java(), "-Xmx256m", "-cp", f"{libs}/*"]
    out = subprocess.run(
        [*cmd, "org.apache.kafka.tools.ProducerPerformance", "--topic", topic, "--num-records", "5000",
         "--record-size", "100", "--throughput", "-1", "--transactional-id", "java-tx",
         "--transaction-duration-ms", "200", "--command-property", f"bootstrap.servers={gateway.kafka}"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    # the last EndTxn is answered once decided, as Kafka's: its records land right after
    deadline = time.monotonic() + 10
    while len(_table_values(gateway, topic)) < 5000 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(_table_values(gateway, topic)) == 5000
    assert httpx.get(f"{gateway.url}/transactions/java-tx", timeout=30).json()["producer_epoch"] >= 1
    tool = [*cmd, "org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server", gateway.kafka]
    listed = subprocess.run([*tool, "list"], capture_output=True, text=True, timeout=60).stdout
    assert any(line.split()[:1] == ["java-tx"] and "CompleteCommit" in line for line in listed.splitlines())
    described = subprocess.run(
        [*tool, "describe", "--transactional-id", "java-tx"], capture_output=True, text=True, timeout=60
    ).stdout
    assert "CompleteCommit" in described


WORD_COUNT = Path(__file__).with_name("java_streams") / "WordCount.java"


def _latest_counts(gateway: ServerProcess, topic: str) -> dict[str, int]:
    """The word count's output as a table: each word's latest count (read_committed)."""
    consumer = Consumer(
        {
            "bootstrap.servers": gateway.kafka,
            "group.id": f"counts-{uuid.uuid4().hex[:6]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([topic])
    latest: dict[str, int] = {}
    idle = 0
    while idle < 3:
        batch = [m for m in consumer.consume(1000, 1.0) if m.error() is None]
        idle = 0 if batch else idle + 1
        for m in batch:
            latest[m.key().decode()] = struct.unpack(">q", m.value())[0]
    consumer.close()
    return latest


def test_kafka_streams_exactly_once_word_count_killed_once_counts_exactly(gateway, tmp_path):
    """Kafka Streams 4.x with processing.guarantee=exactly_once_v2 (transactions, read_committed,
    TxnOffsetCommit with the member's generation, OffsetFetch's require_stable): a word count through
    a repartition topic and a changelogged store, SIGKILLed mid-stream and restarted, counts every
    word exactly."""
    source, sink = _topic(gateway, 2), _topic(gateway, 2)
    words = [f"w{i}" for i in range(20)]
    lines = 3000
    expected = {w: lines * 3 // 20 for w in words}

    def feed() -> None:  # ~6 s of input: the app is killed while it comes in
        feeder = Producer({"bootstrap.servers": gateway.kafka, "linger.ms": 5})
        for i in range(lines):
            feeder.produce(source, key=str(i).encode(), value=" ".join(words[(i + j) % 20] for j in range(3)).encode())
            if i % 50 == 49:
                feeder.flush(30)
                time.sleep(0.1)
        feeder.flush(30)

    feeding = threading.Thread(target=feed)
    cmd = java_build.command(WORD_COUNT, gateway.kafka, "wc-app", source, sink, str(tmp_path / "state"))
    app = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert app.stdout is not None
        while (line := app.stdout.readline()) and line.strip() != "STATE RUNNING":
            pass
        assert line, "the Streams app ended"
        feeding.start()
        time.sleep(3)
    finally:
        os.kill(app.pid, signal.SIGKILL)
        app.wait()
    assert _latest_counts(gateway, sink) != expected  # killed mid-stream
    feeding.join()
    app = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        counts: dict[str, int] = {}
        while time.monotonic() < deadline and counts != expected:
            time.sleep(3)
            counts = _latest_counts(gateway, sink)
        assert counts == expected
    finally:
        app.terminate()
        app.wait(30)


def test_http_transactions_through_the_python_producer(gateway):
    """The HTTP transaction API (docs/API.md) through `topiclake.Producer`: records of two topics and
    a group's offsets visible all at once at commit, nothing of an aborted transaction, the same
    fencing as Kafka's producers, and a Kafka read_committed consumer sees what HTTP committed."""
    from topiclake.client import Producer as HttpProducer
    from topiclake.client import TopiclakeClientError

    a, b = _topic(gateway), _topic(gateway, 1)
    producer = HttpProducer(gateway.url, transactional_id="http-tx", value_format="string", linger_ms=1)
    producer.init_transactions()
    producer.begin_transaction()
    futures = [producer.send(a, f"h{i}", key=f"k{i}") for i in range(10)] + [producer.send(b, "hb", partition=0)]
    producer.send_offsets_to_transaction({(b, 0): 7}, "http-group")
    producer.flush()
    assert all(f.result(10).offset is None for f in futures)  # staged: offsets come with the commit
    described = httpx.get(f"{gateway.url}/transactions/http-tx", timeout=30).json()
    assert described["state"] == "Ongoing" and described["groups"] == ["http-group"]
    assert {t["topic"] for t in described["topics"]} == {a, b}
    assert _table_values(gateway, a) == [] and _table_values(gateway, b) == []
    producer.commit_transaction()
    assert sorted(_table_values(gateway, a)) == sorted(f"h{i}".encode() for i in range(10))
    committed = httpx.get(f"{gateway.url}/groups/http-group/offsets", timeout=30).json()["offsets"]
    assert committed == [{"topic": b, "partition": 0, "offset": 7, "metadata": ""}]
    assert httpx.get(f"{gateway.url}/transactions/http-tx", timeout=30).json()["state"] == "CompleteCommit"

    producer.begin_transaction()
    producer.send(b, "aborted", partition=0)
    producer.abort_transaction()
    successor = HttpProducer(gateway.url, transactional_id="http-tx", value_format="string")
    successor.init_transactions()
    producer.begin_transaction()
    producer.send(b, "fenced", partition=0)
    with pytest.raises(TopiclakeClientError) as refused:
        producer.commit_transaction()
    assert refused.value.code in ("PRODUCER_FENCED", "TRANSACTION_ABORTABLE")
    successor.begin_transaction()
    successor.send(b, "successor", partition=0)
    successor.commit_transaction()
    assert _read_committed(gateway, [b], 2) == [b"hb", b"successor"]
    listed = httpx.get(f"{gateway.url}/transactions", timeout=30).json()["transactions"]
    assert any(t["transactional_id"] == "http-tx" for t in listed)
    producer.close()
    successor.close()
