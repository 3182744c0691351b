"""Transactions on a two-gateway cluster: kill -9 of the gateway that coordinates a transactional
id while a consume-transform-produce service commits transactions through both gateways. The
survivor takes the id over (its last saved state, a decision half done finished first), and the
output holds every input record exactly once, with the group's offsets at the input's end. And
writes of transaction version 2 (Java) and of HTTP that reach the gateway leading their partition
but not coordinating their id."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from bench.kafka_broker import ensure_jars, java
from tests.e2e import kafka_wire
from tests.e2e.server import REPO, ServerProcess
from tests.e2e.test_cluster import wait_for
from tests.e2e.test_kafka_cluster import brokers_seen, gateway, records_of
from topiclake.client import Producer as HttpProducer

pytestmark = pytest.mark.slow


def coordinator_port(bootstrap: str, tid: str) -> int:
    sock = kafka_wire.connect(bootstrap)
    try:
        found = kafka_wire.call(sock, 10, 3, key=tid, key_type=1)
    finally:
        sock.close()
    assert found.error_code == 0, found
    return int(found.port)


def supervised(worker: subprocess.Popen[str], stuck_s: float = 45.0) -> bool:
    """Run the worker to its end, as a supervisor does: True when it finished its input. One that
    fails (a fatal error: fenced) or commits nothing for `stuck_s` is killed (False).

    librdkafka 2.x can wait forever in send_offsets_to_transaction when the group's coordinator died
    between the two requests it makes: it holds the dead broker as the group's coordinator and, the
    broker gone from Metadata, is not woken to look again (seen in about 1 kill in 5 here; the
    survivor answered every FindCoordinator with itself)."""
    assert worker.stdout is not None
    seen = [time.monotonic()]

    def read() -> None:
        for line in worker.stdout:  # type: ignore[union-attr]
            if line.startswith("committed"):
                seen[0] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    while worker.poll() is None and time.monotonic() - seen[0] < stuck_s:
        time.sleep(0.5)
    if worker.poll() is None:
        worker.kill()
    worker.wait()
    reader.join(5)
    return worker.returncode == 0


@contextlib.contextmanager
def two_gateways(tmp_path_factory, name: str) -> Iterator[list[ServerProcess]]:
    """Two gateways on one root, each seeing both in Metadata; stopped by pid at the end."""
    root = tmp_path_factory.mktemp(name) / "data"
    servers = [gateway(root) for _ in range(2)]
    try:
        wait_for(lambda: all(brokers_seen(s.kafka) == 2 for s in servers), what="2 brokers in Metadata")
        yield servers
    finally:
        for s in servers:
            s.stop()


def test_kill9_of_the_coordinating_gateway_loses_and_duplicates_nothing(tmp_path_factory):
    with two_gateways(tmp_path_factory, "ktxn") as servers:
        bootstrap = ",".join(s.kafka for s in servers)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for name in ("ksrc", "kdst"):
            admin.create_topics([NewTopic(name, 3, 1)])[name].result(30)
        total = 3000
        feeder = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
        for i in range(total):
            feeder.produce("ksrc", value=f"r{i}".encode(), partition=i % 3)
        assert feeder.flush(60) == 0
        cmd = [sys.executable, "-m", "tests.e2e.txn_worker", bootstrap, "ctp-cluster", "ksrc", "kdst", "ctpc", "8"]
        worker = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert worker.stdout is not None
        commits = 0
        while commits < 3:
            line = worker.stdout.readline()
            assert line, "the worker ended before the kill"
            commits += line.startswith("committed")
        port = coordinator_port(servers[0].kafka, "ctp-cluster")
        (victim,) = [s for s in servers if s.kafka.endswith(f":{port}")]
        survivor = next(s for s in servers if s is not victim)
        victim.kill9()  # while the worker commits transactions through it
        deadline = time.monotonic() + 300
        while not supervised(worker) and time.monotonic() < deadline:  # failed or stuck: start another
            worker = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, text=True)
        assert worker.returncode == 0

        # the last transaction is answered once decided, as Kafka's: its records and offsets land just after
        def values() -> list[str]:
            return [v for records in records_of(survivor.url, "kdst", 3).values() for _, v in records]

        def committed() -> dict[int, int]:
            offsets = httpx.get(f"{survivor.url}/groups/ctpc/offsets", timeout=30).json()["offsets"]
            return {o["partition"]: o["offset"] for o in offsets}

        ends = {
            p["partition"]: p["high_watermark"]
            for p in httpx.get(f"{survivor.url}/topics/ksrc").json()["partition_offsets"]
        }
        wait_for(lambda: len(values()) >= total and committed() == ends, what="the last transaction landed")
        got = values()
        assert len(got) == total and set(got) == {f"r{i}" for i in range(total)}
        described = httpx.get(f"{survivor.url}/transactions/ctp-cluster", timeout=30).json()
        assert described["state"] in ("CompleteCommit", "CompleteAbort")


def test_java_transactions_of_version_2_write_through_both_gateways(tmp_path_factory):
    """Kafka 4.x's Java producer picks transaction version 2 (the gateways finalize it): its
    Produce v12 adds the partition to the transaction itself. Here every record goes to a
    partition led by the gateway that does not coordinate the id, which asks the coordinator
    (POST /transactions/{id}/partitions), as a Kafka partition leader does; without that the
    coordinator would see no transaction to commit. Every EndTxn v5 bumps the epoch."""
    with two_gateways(tmp_path_factory, "ktv2") as servers:
        bootstrap = ",".join(s.kafka for s in servers)
        admin = AdminClient({"bootstrap.servers": bootstrap})
        admin.create_topics([NewTopic("tv2", 1, 1)])["tv2"].result(30)
        metadata = admin.list_topics("tv2", timeout=10)
        leader_port = metadata.brokers[metadata.topics["tv2"].partitions[0].leader].port
        tid = next(
            t for t in (f"java-tv2-{i}" for i in range(100)) if coordinator_port(servers[0].kafka, t) != leader_port
        )
        libs = ensure_jars()
        out = subprocess.run(
            [java(), "-Xmx256m", "-cp", f"{libs}/*", "org.apache.kafka.tools.ProducerPerformance",
             "--topic", "tv2", "--num-records", "6000", "--record-size", "100", "--throughput", "-1",
             "--transactional-id", tid, "--transaction-duration-ms", "100",
             "--command-property", f"bootstrap.servers={bootstrap}"],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-2000:]

        # landed by the coordinator; the partition's gateway reads the table's new version shortly
        def landed(prefix: str = "") -> list[str]:
            values = [v for records in records_of(servers[0].url, "tv2", 1).values() for _, v in records]
            return sorted(v for v in values if v.startswith(prefix))

        wait_for(lambda: len(landed()) >= 6000, what="the Java producer's records")
        assert len(landed()) == 6000
        described = httpx.get(f"{servers[0].url}/transactions/{tid}", timeout=30).json()
        # one epoch a transaction: the producer used EndTxn v5 (transaction version 2)
        assert described["state"] == "CompleteCommit" and described["producer_epoch"] >= 1

        # HTTP's transactional writes to a gateway that does not coordinate the id reach it the same way
        first = servers[0]
        http_tid = next(
            t
            for t in (f"http-tv2-{i}" for i in range(100))
            if coordinator_port(first.kafka, t) != int(first.kafka.rsplit(":", 1)[1])
        )
        producer = HttpProducer(first.url, transactional_id=http_tid, value_format="string", linger_ms=1)
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(20):
            producer.send("tv2", f"h{i}")
        producer.flush()
        producer.commit_transaction()
        producer.close()
        wait_for(lambda: len(landed("h")) >= 20, what="the HTTP transaction's records")
        assert landed("h") == sorted(f"h{i}" for i in range(20))
