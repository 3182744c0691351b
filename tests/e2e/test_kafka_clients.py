"""Kafka's protocol with a pure-Python client (kafka-python), SASL/PLAIN with API keys and ACLs,
and one consumer group with a Kafka member and an HTTP member."""

from __future__ import annotations

import time

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic as PyNewTopic

from tests.e2e.server import ServerProcess


def start(tmp_path_factory, name: str, config: str = "", env: dict[str, str] | None = None) -> ServerProcess:
    root = tmp_path_factory.mktemp(name)
    env = dict(env or {})
    if config:
        (root / "conf.toml").write_text(config)
        env["TOPICLAKE_CONFIG"] = str(root / "conf.toml")
    return ServerProcess(root / "data", env=env).start()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    srv = start(tmp_path_factory, "kpy")
    yield srv
    srv.stop()


def test_kafka_python_creates_produces_idempotently_and_a_group_of_two_reads_everything(gateway):
    admin = KafkaAdminClient(bootstrap_servers=gateway.kafka, request_timeout_ms=30_000)
    admin.create_topics([PyNewTopic("py-orders", num_partitions=2, replication_factor=1)])
    admin.close()
    producer = KafkaProducer(
        bootstrap_servers=gateway.kafka, acks="all", enable_idempotence=True, compression_type="gzip", linger_ms=5
    )
    futures = [
        producer.send("py-orders", key=f"k{i % 5}".encode(), value=f"v{i}".encode(), headers=[("n", str(i).encode())])
        for i in range(300)
    ]
    producer.flush(60)
    metas = [f.get(30) for f in futures]
    producer.close()
    for p in (0, 1):
        offsets = sorted(m.offset for m in metas if m.partition == p)
        assert offsets == list(range(len(offsets)))

    consumers = [
        KafkaConsumer(
            "py-orders",
            bootstrap_servers=gateway.kafka,
            group_id="py-group",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        for _ in range(2)
    ]
    seen: dict[tuple[int, int], bytes] = {}
    deadline = time.monotonic() + 90
    while (len(seen) < 300 or not all(c.assignment() for c in consumers)) and time.monotonic() < deadline:
        for c in consumers:
            for records in c.poll(timeout_ms=200).values():
                for r in records:
                    seen[(r.partition, r.offset)] = r.value
    assignments = [c.assignment() for c in consumers]
    for c in consumers:
        c.commit()
    assert len(seen) == 300
    assert all(assignments) and not assignments[0] & assignments[1]
    for c in consumers:
        c.close()
    check = KafkaConsumer(bootstrap_servers=gateway.kafka, group_id="py-group")
    committed = [check.committed(TopicPartition("py-orders", p)) for p in (0, 1)]
    found = check.offsets_for_times({TopicPartition("py-orders", 0): 0})
    check.close()
    assert sum(committed) == 300
    assert found[TopicPartition("py-orders", 0)].offset == 0


def test_a_group_with_an_http_member_and_a_kafka_member_splits_the_partitions(gateway):
    admin = AdminClient({"bootstrap.servers": gateway.kafka})
    admin.create_topics([NewTopic("mixed", 4, 1)])["mixed"].result(30)
    http = httpx.Client(base_url=gateway.url, timeout=60)
    kafka = Consumer(
        {
            "bootstrap.servers": gateway.kafka,
            "group.id": "mixed-group",
            "auto.offset.reset": "earliest",
            "client.id": "kafka-side",
        }
    )
    kafka.subscribe(["mixed"])
    deadline = time.monotonic() + 60
    while not kafka.assignment() and time.monotonic() < deadline:
        kafka.poll(0.2)
    assert len(kafka.assignment()) == 4
    # the HTTP member joins while the Kafka member keeps polling (its heartbeats learn of the rebalance)
    import threading

    joined: dict[str, object] = {}

    def join() -> None:
        body = {"topics": ["mixed"], "session_timeout_ms": 30000, "client_id": "http-side"}
        r = http.post("/groups/mixed-group/members", json=body)
        joined["answer"] = r.json()

    t = threading.Thread(target=join)
    t.start()
    deadline = time.monotonic() + 60
    while t.is_alive() and time.monotonic() < deadline:
        kafka.poll(0.2)
    t.join(5)
    deadline = time.monotonic() + 30
    while len(kafka.assignment()) != 2 and time.monotonic() < deadline:
        kafka.poll(0.2)
    answer = joined["answer"]
    http_parts = {p for p in answer["assignment"]["mixed"]}  # type: ignore[index]
    kafka_parts = {tp.partition for tp in kafka.assignment()}
    # both doors' members, described through either door, with who and where they are
    described = admin.describe_consumer_groups(["mixed-group"])["mixed-group"].result(30)
    assert sorted((m.client_id, m.host) for m in described.members) == [
        ("http-side", "/127.0.0.1"),
        ("kafka-side", "/127.0.0.1"),
    ]
    over_http = http.get("/groups/mixed-group").json()["members"]
    assert sorted((m["client_id"], m["client_host"]) for m in over_http) == [
        ("http-side", "/127.0.0.1"),
        ("kafka-side", "/127.0.0.1"),
    ]
    kafka.close()
    http.close()
    assert len(http_parts) == 2 and len(kafka_parts) == 2
    assert http_parts | kafka_parts == {0, 1, 2, 3}


KEYS = """
[[auth.api_keys]]
key = "k-admin"
principal = "admin"
acls = { "*" = ["admin"] }
groups = { "*" = ["admin"] }

[[auth.api_keys]]
key = "k-orders"
principal = "orders-app"
acls = { "orders-*" = ["produce", "consume"] }
groups = { "orders-*" = ["read"] }
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    srv = start(tmp_path_factory, "ksasl", KEYS)
    yield srv
    srv.stop()


def sasl(user: str, password: str) -> dict[str, str]:
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }


def test_sasl_plain_with_api_keys_and_topic_acls(secured):
    admin = AdminClient({"bootstrap.servers": secured.kafka, **sasl("admin", "k-admin")})
    for name in ("orders-1", "secret"):
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    # the orders key sees only its topics
    limited = AdminClient({"bootstrap.servers": secured.kafka, **sasl("orders-app", "k-orders")})
    assert set(limited.list_topics(timeout=10).topics) == {"orders-1"}
    errors: list = []
    p = Producer({"bootstrap.servers": secured.kafka, **sasl("orders-app", "k-orders")})
    p.produce("orders-1", b"ok", on_delivery=lambda e, m: errors.append(e))
    p.produce("secret", b"no", on_delivery=lambda e, m: errors.append(e))
    p.flush(30)
    codes = sorted(e.code() if e else 0 for e in errors)
    assert codes[0] == 0 and KafkaError.TOPIC_AUTHORIZATION_FAILED in codes
    # a wrong key is refused: the client reports an authentication error, nothing else answers
    auth_errors: list = []
    bad = Consumer(
        {
            "bootstrap.servers": secured.kafka,
            "group.id": "orders-x",
            "error_cb": auth_errors.append,
            **sasl("orders-app", "wrong"),
        }
    )
    with pytest.raises(KafkaException):
        bad.list_topics(timeout=5)
    bad.close()
    assert any(e.code() == KafkaError._AUTHENTICATION for e in auth_errors)
    # without SASL at all, the connection closes after ApiVersions
    plain = AdminClient({"bootstrap.servers": secured.kafka})
    with pytest.raises(KafkaException):
        plain.list_topics(timeout=5)
    assert (
        httpx.get(f"{secured.url}/topics/orders-1", headers={"Authorization": "Bearer k-orders"}).json()[
            "partition_offsets"
        ][0]["high_watermark"]
        == 1
    )


def test_connection_limits_idle_timeout_and_request_size_are_enforced(tmp_path_factory):
    import contextlib
    import socket
    import struct

    srv = start(
        tmp_path_factory,
        "klimits",
        env={
            "TOPICLAKE_KAFKA__MAX_CONNECTIONS_PER_CLIENT": "2",
            "TOPICLAKE_KAFKA__IDLE_TIMEOUT_S": "1",
            "TOPICLAKE_KAFKA__MAX_REQUEST_BYTES": "65536",
        },
    )
    try:
        host, port = srv.kafka.split(":")
        api_versions = struct.pack(">ihhih", 10, 18, 0, 1, -1)
        first, second = (socket.create_connection((host, int(port)), timeout=10) for _ in range(2))
        third = socket.create_connection((host, int(port)), timeout=10)
        assert third.recv(1) == b""  # over the per-client limit: closed at once
        first.sendall(api_versions)
        assert len(first.recv(4, socket.MSG_WAITALL)) == 4  # the others are served
        time.sleep(2.5)  # idle longer than idle_timeout_s: closed
        assert second.recv(1) == b""
        for s in (first, second, third):
            s.close()
        with socket.create_connection((host, int(port)), timeout=10) as big:
            big.sendall(struct.pack(">i", 65537))  # one byte over max_request_bytes: closed unread
            assert big.recv(1) == b""
        httpx.post(f"{srv.url}/topics", json={"name": "waits", "partitions": 1}).raise_for_status()
        fetch = _long_poll_fetch("waits")
        for _ in range(3):  # clients that pipeline many long-polls and leave without reading a byte
            with contextlib.suppress(OSError), socket.create_connection((host, int(port)), timeout=10) as rude:
                rude.sendall(fetch * 100)  # more than the answers a connection may owe
        deadline = time.monotonic() + 10
        served = 0
        while served < 2 and time.monotonic() < deadline:  # their connection slots come back
            served = 0
            with (
                contextlib.suppress(OSError),  # refused while a slot is still held: try again
                socket.create_connection((host, int(port)), timeout=10) as a,
                socket.create_connection((host, int(port)), timeout=10) as b,
            ):
                for s in (a, b):
                    s.sendall(api_versions)
                    served += len(s.recv(4, socket.MSG_WAITALL)) == 4
            time.sleep(0.2)
        assert served == 2
    finally:
        srv.stop()


def _long_poll_fetch(topic: str) -> bytes:
    """A Fetch v4 frame (kio, Kafka's own message spec) that waits 500 ms for records at offset 0."""
    import datetime
    import io
    import struct

    from kio.schema.fetch.v4.request import FetchPartition, FetchRequest, FetchTopic
    from kio.schema.request_header.v1.header import RequestHeader
    from kio.serial import entity_writer
    from kio.static.primitive import i8, i16, i32, i64

    out = io.BytesIO()
    entity_writer(RequestHeader)(
        out, RequestHeader(request_api_key=i16(1), request_api_version=i16(4), correlation_id=i32(1), client_id="t")
    )
    body = FetchRequest(
        replica_id=i32(-1),
        max_wait=datetime.timedelta(milliseconds=500),
        min_bytes=i32(1),
        max_bytes=i32(1 << 20),
        isolation_level=i8(0),
        topics=(
            FetchTopic(
                topic=topic,
                partitions=(FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20)),),
            ),
        ),
    )
    entity_writer(FetchRequest)(out, body)
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data
