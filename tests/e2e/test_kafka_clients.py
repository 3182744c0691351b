"""Kafka's protocol with a pure-Python client (kafka-python), SASL/PLAIN with API keys and ACLs,
and one consumer group with a Kafka member and an HTTP member."""

from __future__ import annotations

import datetime
import subprocess
import time
import uuid

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka import TopicPartition as ConfluentPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic as PyNewTopic

from bench.kafka_broker import ensure_jars, java
from tests.e2e import kafka_wire
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
acls = { "orders-*" = ["produce", "consume"], "walled" = ["describe"] }
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
    try:
        p.produce("secret", b"no", on_delivery=lambda e, m: errors.append(e))
    except KafkaException as exc:  # librdkafka raises it at once where its metadata already holds the refusal
        errors.append(exc.args[0])
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


def _fetch_request(topic: str) -> dict:
    from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
    from kio.static.primitive import i32, i64

    part = FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(1 << 20))
    return {
        "max_wait": datetime.timedelta(0),
        "min_bytes": i32(1),
        "topics": (FetchTopic(topic=topic, partitions=(part,)),),
        "forgotten_topics_data": (),
    }


def _topic_id(sock, name: str):
    from kio.schema.metadata.v12.request import MetadataRequestTopic

    answer = kafka_wire.call(
        sock,
        3,
        12,
        topics=(MetadataRequestTopic(topic_id=None, name=name),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    return answer.topics[0].topic_id


def test_refusals_are_answered_as_kafka_answers_them(secured):
    """Each answer checked field by field against what Kafka 4's broker sends under the same
    rights (its KafkaApis and ControllerApis)."""
    from kio.schema.delete_topics.v6.request import DeleteTopicState
    from kio.schema.elect_leaders.v2.request import TopicPartitions
    from kio.schema.errors import ErrorCode
    from kio.static.primitive import i8, i32

    admin = AdminClient({"bootstrap.servers": secured.kafka, **sasl("admin", "k-admin")})
    for name in ("orders-refusals", "hidden-refusals", "hidden-by-id"):
        admin.create_topics([NewTopic(name, 1, 1)])[name].result(30)
    with kafka_wire.connect(secured.kafka) as s, kafka_wire.connect(secured.kafka) as root:
        assert kafka_wire.sasl_login(s, "orders-app", "k-orders").error_code == ErrorCode.none
        assert kafka_wire.sasl_login(root, "admin", "k-admin").error_code == ErrorCode.none
        # a Fetch the key may not make: its error and an empty record set (null breaks librdkafka)
        part = kafka_wire.call(s, 1, 12, **_fetch_request("hidden-refusals")).responses[0].partitions[0]
        assert part.error_code == ErrorCode.topic_authorization_failed
        assert part.records is not None and len(part.records) == 0
        assert (part.high_watermark, part.log_start_offset) == (-1, -1)
        # cluster rights: ALTER for elections, DESCRIBE for reassignments
        elect = {
            "election_type": i8(0),
            "topic_partitions": (TopicPartitions(topic="orders-refusals", partitions=(i32(0),)),),
            "timeout": datetime.timedelta(seconds=10),
        }
        refused = kafka_wire.call(s, 43, 2, **elect)
        assert refused.error_code == ErrorCode.cluster_authorization_failed
        assert refused.replica_election_results[0].partition_result[0].error_code == (
            ErrorCode.cluster_authorization_failed
        )
        allowed = kafka_wire.call(root, 43, 2, **elect)
        assert allowed.error_code == ErrorCode.none
        assert allowed.replica_election_results[0].partition_result[0].error_code == ErrorCode.election_not_needed
        listing = {"timeout": datetime.timedelta(seconds=10), "topics": None}
        assert kafka_wire.call(s, 46, 0, **listing).error_code == ErrorCode.cluster_authorization_failed
        assert kafka_wire.call(root, 46, 0, **listing).error_code == ErrorCode.none
        # DeleteTopics by id: one result per id; a refused one names no topic the key may not see
        hidden_id, own_id = _topic_id(root, "hidden-by-id"), _topic_id(s, "orders-refusals")
        assert hidden_id.int != 0 and own_id.int != 0 and hidden_id != own_id
        unknown = uuid.uuid4()
        results = kafka_wire.call(
            s,
            20,
            6,
            topics=tuple(DeleteTopicState(topic_id=i) for i in (unknown, hidden_id, own_id)),
            timeout=datetime.timedelta(seconds=30),
        ).responses
        got = {r.topic_id: (r.name, r.error_code) for r in results}
        assert got == {
            unknown: (None, ErrorCode.unknown_topic_id),
            hidden_id: (None, ErrorCode.topic_authorization_failed),
            own_id: ("orders-refusals", ErrorCode.topic_authorization_failed),  # describe, not admin
        }
        deleted = kafka_wire.call(
            root, 20, 6, topics=(DeleteTopicState(topic_id=hidden_id),), timeout=datetime.timedelta(seconds=30)
        ).responses
        assert [(r.name, r.topic_id, r.error_code) for r in deleted] == [("hidden-by-id", hidden_id, ErrorCode.none)]
        assert "hidden-by-id" not in admin.list_topics(timeout=10).topics
        # group configs: DESCRIBE on the group to read them, ALTER (admin here) to change them
        from kio.schema.describe_configs.v4.request import DescribeConfigsResource
        from kio.schema.incremental_alter_configs.v1.request import AlterableConfig, AlterConfigsResource

        def described(sock, group: str) -> int:
            resource = DescribeConfigsResource(resource_type=i8(32), resource_name=group, configuration_keys=None)
            answer = kafka_wire.call(
                sock, 32, 4, resources=(resource,), include_synonyms=False, include_documentation=False
            )
            return answer.results[0].error_code

        def altered(sock, group: str) -> int:
            config = AlterableConfig(name="consumer.session.timeout.ms", config_operation=i8(0), value="50000")
            resource = AlterConfigsResource(resource_type=i8(32), resource_name=group, configs=(config,))
            return kafka_wire.call(sock, 44, 1, resources=(resource,), validate_only=False).responses[0].error_code

        assert described(s, "orders-configs") == ErrorCode.none  # `read` implies `describe`: configs too
        assert described(s, "billing") == ErrorCode.group_authorization_failed
        assert altered(s, "orders-configs") == ErrorCode.group_authorization_failed
        assert altered(root, "orders-configs") == ErrorCode.none
        # SASL once per connection: a second handshake is refused, the connection still serves
        assert kafka_wire.call(s, 17, 1, mechanism="PLAIN").error_code == ErrorCode.illegal_sasl_state
        assert kafka_wire.call(s, 18, 0).error_code == ErrorCode.none
    # a mechanism not served: the ones served, then the connection closes
    with kafka_wire.connect(secured.kafka) as s:
        answer = kafka_wire.call(s, 17, 1, mechanism="SCRAM-SHA-256")
        assert (answer.error_code, answer.mechanisms) == (ErrorCode.unsupported_sasl_mechanism, ("PLAIN",))
        assert kafka_wire.closed(s)
    # failed logins wait connection.failed.authentication.delay.ms (100 ms) each, then close
    started = time.monotonic()
    for _ in range(5):
        with kafka_wire.connect(secured.kafka) as s:
            failed = kafka_wire.sasl_login(s, "orders-app", "guess")
            assert failed.error_code == ErrorCode.sasl_authentication_failed
            assert kafka_wire.closed(s)
    assert time.monotonic() - started >= 0.5


@pytest.fixture(scope="module")
def java_libs():
    return ensure_jars()


def test_a_consumer_refused_a_topic_is_told_so_and_does_not_spin(secured, java_libs, tmp_path):
    """librdkafka, kafka-python and the Java consumer, each reading a topic its key may describe and
    not read (the refusal is the Fetch's): the application sees TOPIC_AUTHORIZATION_FAILED, and the client does not re-fetch in a loop."""
    import json

    admin = AdminClient({"bootstrap.servers": secured.kafka, **sasl("admin", "k-admin")})
    admin.create_topics([NewTopic("walled", 1, 1)])["walled"].result(30)
    stats: list[dict] = []
    errors: list[KafkaError] = []
    c = Consumer(
        {
            "bootstrap.servers": secured.kafka,
            "group.id": "orders-walled",
            "statistics.interval.ms": 1000,
            "stats_cb": lambda s: stats.append(json.loads(s)),
            "error_cb": errors.append,
            **sasl("orders-app", "k-orders"),
        }
    )
    c.assign([ConfluentPartition("walled", 0, 0)])
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is not None and msg.error():
            errors.append(msg.error())
    c.close()
    assert any(e.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED for e in errors)
    fetches = max(sum(b["req"].get("Fetch", 0) for b in s["brokers"].values()) for s in stats)
    assert fetches < 40, f"{fetches} fetches in 4 s: the client re-fetches in a loop"

    import kafka.errors

    py = KafkaConsumer(
        bootstrap_servers=secured.kafka,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="orders-app",
        sasl_plain_password="k-orders",
    )
    py.assign([TopicPartition("walled", 0)])
    py.seek(TopicPartition("walled", 0), 0)
    with pytest.raises(kafka.errors.TopicAuthorizationFailedError):
        for _ in range(10):
            py.poll(timeout_ms=500)
    py.close()

    from tests.e2e.test_kafka_tools import CONSUMER

    props = tmp_path / "refused.properties"
    props.write_text(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
        'sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="orders-app" '
        'password="k-orders";\n'
    )
    cmd = [java(), "-Xmx256m", "-cp", f"{java_libs}/*", CONSUMER, "--bootstrap-server", secured.kafka]
    cmd += ["--topic", "walled", "--partition", "0", "--offset", "earliest", "--timeout-ms", "20000"]
    cmd += ["--command-config", str(props)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    # the tool prints the refusal and ends (exit 0 with "Processed a total of 0 messages")
    assert "TopicAuthorizationException: Not authorized to access topics: [walled]" in out.stdout + out.stderr
