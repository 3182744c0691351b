"""Kafka's wire protocol on a gateway started as users start it, driven by real Kafka clients:
confluent-kafka (librdkafka) and kafka-python; bad bytes on the socket."""

from __future__ import annotations

import datetime
import itertools
import json
import socket
import struct
import time

import httpx
import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

_ids = itertools.count()


@pytest.fixture
def gateway(server):
    """The module's server (tests/e2e/conftest.py): every test server also serves Kafka."""
    return server


@pytest.fixture
def admin(gateway):
    return AdminClient({"bootstrap.servers": gateway.kafka})


def new_topic(admin: AdminClient, partitions: int = 3, **config: str) -> str:
    name = f"k-{next(_ids)}"
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1, config=config)])
    futures[name].result(30)
    return name


def produce(gateway, topic: str, records: list[tuple[bytes | None, bytes | None]], **conf) -> list:
    p = Producer({"bootstrap.servers": gateway.kafka, "linger.ms": 5, **conf})
    delivered: list = []
    for i, (key, value) in enumerate(records):
        p.produce(
            topic,
            key=key,
            value=value,
            headers=[("i", str(i).encode()), ("empty", None)],
            on_delivery=lambda err, msg: delivered.append((err, msg.partition(), msg.offset(), msg.key())),
        )
    assert p.flush(60) == 0
    return delivered


def commit(consumer: Consumer) -> None:
    """Commit what was consumed (nothing to commit: auto-commit got there first)."""
    try:
        consumer.commit(asynchronous=False)
    except Exception as exc:
        if exc.args[0].code() != KafkaError._NO_OFFSET:
            raise


def consume(gateway, topic: str, group: str, count: int, timeout: float = 60.0) -> list:
    c = Consumer({"bootstrap.servers": gateway.kafka, "group.id": group, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append(m)
    commit(c)
    c.close()
    return got


def test_admin_creates_a_topic_that_metadata_and_http_see(gateway, admin):
    name = new_topic(admin, partitions=4, **{"retention.ms": "3600000"})
    md = admin.list_topics(timeout=10)
    assert len(md.topics[name].partitions) == 4
    assert len(md.brokers) == 1
    info = httpx.get(f"{gateway.url}/topics/{name}").json()
    assert info["partitions"] == 4 and info["config"]["retention.ms"] == "3600000"
    again = admin.create_topics([NewTopic(name, num_partitions=1, replication_factor=1)])
    with pytest.raises(Exception) as refused:
        again[name].result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


def test_configs_are_described_and_altered(gateway, admin):
    # Kafka's configs that mean nothing for a table (what Streams and Connect set) are accepted
    name = new_topic(admin, **{"min.insync.replicas": "1", "segment.bytes": "1048576"})
    resource = ConfigResource("topic", name)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "delete"
    assert configs["segment.bytes"].value == "1048576" and configs["unclean.leader.election.enable"].value == "false"
    refused = admin.create_topics([NewTopic(f"{name}-bad", 1, 1, config={"segment.bytes": "lots"})])
    with pytest.raises(Exception) as bad:
        refused[f"{name}-bad"].result(30)
    assert bad.value.args[0].code() == KafkaError.INVALID_CONFIG
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    entry = ConfigEntry("retention.ms", "60000", incremental_operation=AlterConfigOpType.SET)
    admin.incremental_alter_configs([ConfigResource("topic", name, incremental_configs=[entry])])[resource].result(30)
    assert admin.describe_configs([resource])[resource].result(30)["retention.ms"].value == "60000"
    assert httpx.get(f"{gateway.url}/topics/{name}").json()["config"]["retention.ms"] == "60000"


def test_an_idempotent_lz4_producer_writes_keyed_records_with_headers_a_group_of_two_reads_them(gateway, admin):
    name = new_topic(admin, partitions=3)
    records = [(f"key-{i % 17}".encode(), f"value-{i}".encode()) for i in range(600)] + [(b"gone", None)]
    delivered = produce(
        gateway, name, records, **{"enable.idempotence": True, "compression.type": "lz4", "acks": "all"}
    )
    assert [d for d in delivered if d[0] is not None] == []
    # keyed records land where murmur2 puts them, the same partition for the same key
    by_key: dict[bytes, set[int]] = {}
    for _, partition, _, key in delivered:
        by_key.setdefault(key, set()).add(partition)
    assert all(len(parts) == 1 for parts in by_key.values())
    # offsets are contiguous per partition
    for p in range(3):
        offs = sorted(o for _, part, o, _ in delivered if part == p)
        assert offs == list(range(len(offs)))

    group = f"g-{name}"
    first = Consumer({"bootstrap.servers": gateway.kafka, "group.id": group, "auto.offset.reset": "earliest"})
    second = Consumer({"bootstrap.servers": gateway.kafka, "group.id": group, "auto.offset.reset": "earliest"})
    first.subscribe([name])
    second.subscribe([name])
    got: dict[tuple[int, int], object] = {}
    deadline = time.monotonic() + 90
    # until every record is read and both members hold partitions (the first may read all before the
    # second's join makes it rebalance)
    while (len(got) < len(records) or not (first.assignment() and second.assignment())) and (
        time.monotonic() < deadline
    ):
        for c in (first, second):  # a batch each (poll() takes one record, then waits on the other member)
            for m in c.consume(num_messages=500, timeout=0.2):
                if m.error() is None:
                    got[(m.partition(), m.offset())] = m
    a, b = first.assignment(), second.assignment()
    assert a and b and not {(t.topic, t.partition) for t in a} & {(t.topic, t.partition) for t in b}
    assert len(got) == len(records)
    tombstone = [m for m in got.values() if m.key() == b"gone"]
    assert tombstone[0].value() is None
    sample = next(m for m in got.values() if m.key() != b"gone")
    headers = dict(sample.headers())
    assert headers["empty"] is None and headers["i"].isdigit()
    commit(first)
    commit(second)
    first.close()
    second.close()
    # a restarted member resumes from the committed offsets: nothing left to read
    again = Consumer({"bootstrap.servers": gateway.kafka, "group.id": group, "auto.offset.reset": "earliest"})
    again.subscribe([name])
    end = time.monotonic() + 8
    extra = []
    while time.monotonic() < end:
        m = again.poll(0.5)
        if m is not None and m.error() is None:
            extra.append(m)
    committed = again.committed([TopicPartition(name, p) for p in range(3)], timeout=30)
    again.close()
    assert extra == []
    assert sum(tp.offset for tp in committed) == len(records)


def test_kafka_records_are_fetched_over_http_and_http_records_over_kafka(gateway, admin):
    name = new_topic(admin, partitions=1)
    produce(gateway, name, [(b"k", b"from-kafka")])
    body = httpx.get(f"{gateway.url}/topics/{name}/partitions/0/records", params={"offset": 0}).json()
    assert [r["value"] for r in body["records"]] == ["from-kafka"] or body["records"][0]["key"] == "k"
    r = httpx.post(f"{gateway.url}/topics/{name}/records", json={"records": [{"key": "h", "value": "from-http"}]})
    assert r.status_code == 200
    got = consume(gateway, name, f"g-{name}", 2)
    assert [m.value() for m in got] == [b"from-kafka", b'"from-http"']


def test_offsets_for_times(gateway, admin):
    name = new_topic(admin, partitions=1)
    p = Producer({"bootstrap.servers": gateway.kafka})
    for i, ts in enumerate((1_000_000, 2_000_000, 3_000_000)):
        p.produce(name, value=str(i).encode(), timestamp=1_700_000_000_000 + ts)
    p.flush(30)
    c = Consumer({"bootstrap.servers": gateway.kafka, "group.id": f"t-{name}"})
    found = c.offsets_for_times([TopicPartition(name, 0, 1_700_000_000_000 + 1_500_000)], timeout=30)
    assert found[0].offset == 1
    low, high = c.get_watermark_offsets(TopicPartition(name, 0), timeout=30)
    c.close()
    assert (low, high) == (0, 3)


def _frame(api_key: int, version: int, correlation: int, body: bytes = b"") -> bytes:
    payload = struct.pack(">hhih", api_key, version, correlation, -1) + body
    return struct.pack(">i", len(payload)) + payload


def _answer(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    return sock.recv(size, socket.MSG_WAITALL)


def test_unknown_apis_and_versions_are_answered_and_bad_frames_close_the_connection(gateway):
    host, port = gateway.kafka.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_frame(999, 0, 7))  # an API nobody knows
        answer = _answer(s)
        assert struct.unpack(">ih", answer[:6]) == (7, 35)  # UNSUPPORTED_VERSION
        s.sendall(_frame(0, 99, 8))  # Produce at a version we do not serve
        assert struct.unpack(">ih", _answer(s)[:6]) == (8, 35)
        s.sendall(_frame(18, 3, 9, b"\xff\xff"))  # ApiVersions v3 whose body does not parse
        assert struct.unpack(">ih", _answer(s)[:6]) == (9, 42)  # INVALID_REQUEST
        s.sendall(_frame(18, 0, 10))  # and the connection still serves
        assert struct.unpack(">ih", _answer(s)[:6]) == (10, 0)
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", 2**31 - 1))  # a 2 GiB frame: closed before anything is read
        assert s.recv(1) == b""
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(struct.pack(">i", 100) + b"\0" * 10)  # a truncated frame, then the client leaves
    assert httpx.get(f"{gateway.url}/healthz").status_code == 200


def test_delete_records_moves_the_log_start_offset_and_groups_are_listed_described_and_deleted(gateway, admin):
    name = new_topic(admin, partitions=1)
    for batch in range(3):  # three commits: three segments
        produce(gateway, name, [(None, f"{batch}-{i}".encode()) for i in range(10)])
    deleted = admin.delete_records([TopicPartition(name, 0, 15)])
    [(_tp, future)] = deleted.items()
    assert future.result(30).low_watermark == 15
    c = Consumer({"bootstrap.servers": gateway.kafka, "group.id": f"d-{name}", "auto.offset.reset": "earliest"})
    assert c.get_watermark_offsets(TopicPartition(name, 0), timeout=30) == (15, 30)
    c.close()
    info = httpx.get(f"{gateway.url}/topics/{name}").json()["partition_offsets"][0]
    assert (info["log_start_offset"], info["high_watermark"]) == (15, 30)
    got = consume(gateway, name, f"g-{name}", 15)
    assert [m.offset() for m in got] == list(range(15, 30))

    from confluent_kafka import ConsumerGroupState

    listed = admin.list_consumer_groups(states={ConsumerGroupState.EMPTY}).result(30)
    assert f"g-{name}" in {g.group_id for g in listed.valid}
    described = admin.describe_consumer_groups([f"g-{name}"])[f"g-{name}"].result(30)
    assert described.state == ConsumerGroupState.EMPTY
    offsets = admin.list_consumer_group_offsets([_group_request(f"g-{name}")])[f"g-{name}"].result(30)
    assert [tp.offset for tp in offsets.topic_partitions] == [30]
    admin.delete_consumer_groups([f"g-{name}"])[f"g-{name}"].result(30)
    assert f"g-{name}" not in {g.group_id for g in admin.list_consumer_groups().result(30).valid}
    assert httpx.get(f"{gateway.url}/groups/g-{name}/offsets").status_code == 404


def _group_request(group: str):
    from confluent_kafka import ConsumerGroupTopicPartitions

    return ConsumerGroupTopicPartitions(group)


def _produce_frame(topic: str, records: bytes, correlation: int) -> bytes:
    """A Produce v9 request frame (kio, Kafka's own message spec) carrying `records` for partition 0."""
    import io

    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.serial import entity_writer
    from kio.static.primitive import i16, i32

    out = io.BytesIO()
    entity_writer(RequestHeader)(
        out,
        RequestHeader(
            request_api_key=i16(0), request_api_version=i16(9), correlation_id=i32(correlation), client_id="t"
        ),
    )
    import datetime

    body = ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=datetime.timedelta(seconds=30),
        topic_data=(
            TopicProduceData(name=topic, partition_data=(PartitionProduceData(index=i32(0), records=records),)),
        ),
    )
    entity_writer(ProduceRequest)(out, body)
    data = out.getvalue()
    return struct.pack(">i", len(data)) + data


def _produce_error(answer: bytes) -> int:
    from kio.schema.produce.v9.response import ProduceResponse
    from kio.serial import entity_reader

    response, _ = entity_reader(ProduceResponse)(answer, 5)  # correlation id, then the empty tagged fields
    return int(response.responses[0].partition_responses[0].error_code)


def test_record_batches_with_a_wrong_crc_or_a_lying_count_are_refused_and_nothing_is_written(gateway, admin):
    import pyarrow as pa

    from kafka_gateway.records import HEADERS_TYPE, encode_batch

    name = new_topic(admin, partitions=1)
    good = encode_batch(
        base_offset=0,
        offsets=pa.array([0, 1, 2], pa.int64()),
        timestamp_ms=pa.array([1_700_000_000_000] * 3, pa.int64()),
        key=pa.array([None] * 3, pa.binary()),
        value=pa.array([b"a", b"b", b"c"], pa.binary()),
        headers=pa.array([[], [], []], HEADERS_TYPE),
    )
    crc_broken = bytearray(good)
    crc_broken[-1] ^= 0xFF  # the last record's value: the CRC no longer matches
    count_lies = bytearray(good)
    struct.pack_into(">i", count_lies, 57, 5)  # recordCount says 5 (the CRC is recomputed to pass)
    from kafka.record.util import calc_crc32c  # kafka-python's, an implementation independent of ours

    struct.pack_into(">I", count_lies, 17, calc_crc32c(bytes(count_lies[21:])))
    host, port = gateway.kafka.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_produce_frame(name, bytes(crc_broken), 1))
        assert _produce_error(_answer(s)) == 2  # CORRUPT_MESSAGE
        s.sendall(_produce_frame(name, bytes(count_lies), 2))
        assert _produce_error(_answer(s)) in (2, 87)  # CORRUPT_MESSAGE or INVALID_RECORD
        s.sendall(_produce_frame(name, good, 3))
        assert _produce_error(_answer(s)) == 0
    info = httpx.get(f"{gateway.url}/topics/{name}").json()["partition_offsets"][0]
    assert info["high_watermark"] == 3  # only the good batch


def test_typed_topics_check_values_produced_over_kafka_and_dead_letter_them_with_tolerance(gateway):
    schema = {"schemaType": "JSON", "schema": '{"type": "object", "required": ["id"]}'}
    for name, config in (("typed-strict", {}), ("typed-tolerant", {"errors.tolerance": "all"})):
        r = httpx.post(
            f"{gateway.url}/topics", json={"name": name, "partitions": 1, "value_schema": schema, "config": config}
        )
        assert r.status_code == 201, r.text
    [(error, *_)] = produce(gateway, "typed-strict", [(None, b'{"total": 2}')])
    assert error is not None and error.code() == KafkaError.INVALID_RECORD
    assert httpx.get(f"{gateway.url}/topics/typed-strict").json()["partition_offsets"][0]["high_watermark"] == 0
    [(error, *_)] = produce(gateway, "typed-strict", [(None, b'{"id": 1}')])
    assert error is None
    tolerant = produce(gateway, "typed-tolerant", [(None, b'{"id": 1}'), (None, b'{"total": 2}')], **{"linger.ms": 50})
    assert [d[0] for d in tolerant] == [None, None]
    assert httpx.get(f"{gateway.url}/topics/typed-tolerant").json()["partition_offsets"][0]["high_watermark"] == 1
    dlq = httpx.get(f"{gateway.url}/topics/typed-tolerant.dlq/partitions/0/records", params={"offset": 0}).json()
    assert len(dlq["records"]) == 1


def test_a_failed_dead_letter_write_leaves_the_valid_records_unwritten(gateway):
    """A Kafka batch split into valid records and dead letters: the dead letters are written first
    and the valid records only after them, as over HTTP, so when the dead letters are refused
    nothing of the batch is written and the producer's retry cannot write a record twice."""
    import hashlib

    import pyarrow as pa

    from kafka_gateway.records import HEADERS_TYPE, encode_batch

    name = f"dlq-order-{time.time_ns()}"
    schema = {"schemaType": "JSON", "schema": '{"type": "object", "required": ["id"]}'}
    config = {"errors.tolerance": "all"}
    r = httpx.post(
        f"{gateway.url}/topics", json={"name": name, "partitions": 1, "value_schema": schema, "config": config}
    )
    assert r.status_code == 201, r.text
    assert httpx.post(f"{gateway.url}/topics", json={"name": f"{name}.dlq", "partitions": 1}).status_code == 201
    # the dead letters of Kafka producer 77 (epoch 0) go to the dead-letter topic under their own
    # producer id (broker.produce.prepare_dead_letters); it has written sequence 5 there already,
    # so this batch's dead letters (sequence 1) are refused as an old duplicate
    own = "dlq." + hashlib.sha256(f"k77.0\0{name}".encode()).hexdigest()[:40]
    r = httpx.post(
        f"{gateway.url}/topics/{name}.dlq/records",
        json={"records": [{"value": "seed"}]},
        headers={"Producer-Id": own, "Producer-Sequence": "5"},
    )
    assert r.status_code == 200, r.text
    batch = encode_batch(
        base_offset=0,
        offsets=pa.array([0, 1], pa.int64()),
        timestamp_ms=pa.array([1_700_000_000_000] * 2, pa.int64()),
        key=pa.array([None] * 2, pa.binary()),
        value=pa.array([b'{"id": 1}', b'{"total": 2}'], pa.binary()),
        headers=pa.array([[], []], HEADERS_TYPE),
        producer_id=77,
        producer_epoch=0,
        base_sequence=0,
    )
    host, port = gateway.kafka.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(_produce_frame(name, batch, 1))
        assert _produce_error(_answer(s)) == 46  # DUPLICATE_SEQUENCE_NUMBER, the dead letters' refusal
    info = httpx.get(f"{gateway.url}/topics/{name}").json()["partition_offsets"][0]
    assert info["high_watermark"] == 0  # the valid record was not written either
    assert httpx.get(f"{gateway.url}/topics/{name}.dlq").json()["partition_offsets"][0]["high_watermark"] == 1


def test_a_cooperative_group_is_assigned_by_its_leader_as_in_kafka(gateway, admin):
    """librdkafka with cooperative-sticky alone: the coordinator does not run that protocol, so
    (as Kafka does for every group) one member leads, assigns in SyncGroup and rebalances
    incrementally. An HTTP member cannot join such a group."""
    name = new_topic(admin, partitions=4)
    produce(gateway, name, [(f"k{i}".encode(), f"v{i}".encode()) for i in range(200)])
    group = f"coop-{name}"
    conf = {
        "bootstrap.servers": gateway.kafka,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": "cooperative-sticky",
    }
    first, second = Consumer(conf), Consumer(conf)
    first.subscribe([name])
    got: list[tuple[int, int]] = []  # every delivery: a record read twice shows up twice
    deadline = time.monotonic() + 60
    while len(got) < 100 and time.monotonic() < deadline:
        m = first.poll(0.2)
        if m is not None and m.error() is None:
            got.append((m.partition(), m.offset()))
    assert len(first.assignment()) == 4
    second.subscribe([name])  # an incremental rebalance: the first member gives up two partitions
    deadline = time.monotonic() + 60
    while (len(set(got)) < 200 or len(second.assignment()) != 2) and time.monotonic() < deadline:
        for c in (first, second):
            m = c.poll(0.1)
            if m is not None and m.error() is None:
                got.append((m.partition(), m.offset()))
    a = {tp.partition for tp in first.assignment()}
    b = {tp.partition for tp in second.assignment()}
    assert len(set(got)) == 200 and len(a) == 2 and len(b) == 2 and a | b == {0, 1, 2, 3}
    # the member giving partitions up committed them (Kafka takes such commits), so none was read twice
    assert len(got) == 200, f"{len(got) - 200} records were delivered twice"
    commit(first)
    commit(second)
    described = admin.describe_consumer_groups([group])[group].result(30)
    assert described.partition_assignor == "cooperative-sticky" and str(described.state).endswith("STABLE")
    shown = {m.member_id: {tp.partition for tp in m.assignment.topic_partitions} for m in described.members}
    assert sorted(map(sorted, shown.values())) == sorted([sorted(a), sorted(b)])
    refused = httpx.post(f"{gateway.url}/groups/{group}/members", json={"topics": [name]}, timeout=30)
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "INCONSISTENT_GROUP_PROTOCOL"
    first.close()
    second.close()


def test_a_consumer_subscribed_before_its_topic_exists_gets_it_once_created(gateway, admin):
    """Kafka's consumers may subscribe to a topic nobody created yet (Connect's sink tasks do):
    they join with no partitions, and the group rebalances once the topic appears."""
    name = f"later-{next(_ids)}"
    c = Consumer({"bootstrap.servers": gateway.kafka, "group.id": f"g-{name}", "auto.offset.reset": "earliest"})
    c.subscribe([name])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = c.poll(0.2)
        assert m is None or m.error() is None or m.error().code() == KafkaError.UNKNOWN_TOPIC_OR_PART, m.error()
    admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)])[name].result(30)
    produce(gateway, name, [(b"k", b"v")])
    got = []
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        m = c.poll(0.2)
        if m is not None and m.error() is None:
            got.append(m.value())
    assert got == [b"v"] and len(c.assignment()) == 2
    c.close()


def test_consumer_offsets_is_listed_as_kafka_lists_it_and_regex_consumers_skip_it(gateway, admin):
    from kio.schema.errors import ErrorCode
    from kio.schema.metadata.v12.request import MetadataRequestTopic

    from tests.e2e import kafka_wire

    listed = admin.list_topics(timeout=10).topics
    assert len(listed["__consumer_offsets"].partitions) == 50
    with kafka_wire.connect(gateway.kafka) as s:
        answer = kafka_wire.call(
            s,
            3,
            12,
            topics=(MetadataRequestTopic(topic_id=None, name="__consumer_offsets"),),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        [internal] = answer.topics
        assert (internal.error_code, internal.is_internal, len(internal.partitions)) == (ErrorCode.none, True, 50)
    created = admin.create_topics([NewTopic("__consumer_offsets", 1, 1)])["__consumer_offsets"]
    with pytest.raises(Exception) as refused:
        created.result(30)
    assert refused.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS

    name = new_topic(admin, partitions=1)
    produce(gateway, name, [(None, b"x")])
    pattern = f"^(__consumer_offsets|{name})$"
    c = Consumer({"bootstrap.servers": gateway.kafka, "group.id": f"re-{name}", "auto.offset.reset": "earliest"})
    c.subscribe([pattern])
    got = None
    deadline = time.monotonic() + 30
    while got is None and time.monotonic() < deadline:
        got = c.poll(0.5)
    assert got is not None and got.error() is None and got.topic() == name
    assert {tp.topic for tp in c.assignment()} == {name}
    c.close()

    from kafka import KafkaConsumer

    py = KafkaConsumer(bootstrap_servers=gateway.kafka, group_id=f"re-py-{name}", auto_offset_reset="earliest")
    py.subscribe(pattern=pattern)
    records = {}
    deadline = time.monotonic() + 30
    while not records and time.monotonic() < deadline:
        records = py.poll(timeout_ms=500)
    assert {tp.topic for tp in records} == {name}
    assert {tp.topic for tp in py.assignment()} == {name}
    py.close()


def _decompress(codec: str, section: bytes) -> bytes:
    """A records section decompressed by the codecs' own Python libraries (not topiclake's)."""
    import gzip

    import lz4.frame
    import snappy
    import zstandard

    if codec == "gzip":
        return gzip.decompress(section)
    if codec == "snappy":  # Kafka's (xerial) framing
        return _xerial(section, snappy)
    if codec == "lz4":
        return lz4.frame.decompress(section)
    return zstandard.ZstdDecompressor().decompress(section, max_output_size=64 << 20)


def _xerial(section: bytes, snappy) -> bytes:
    assert section[:8] == b"\x82SNAPPY\x00"
    out, at = b"", 16
    while at < len(section):
        size = struct.unpack(">i", section[at : at + 4])[0]
        out += snappy.uncompress(section[at + 4 : at + 4 + size])
        at += 4 + size
    return out


def test_a_topics_compression_type_compresses_the_batches_fetch_returns(gateway, admin):
    """Batches of a topic with compression.type gzip/snappy/lz4/zstd come back in that codec
    (produced with another one: re-encoded), decompress with the codecs' own libraries, and a
    client reads every value byte for byte."""

    for codec in CODECS:
        name = new_topic(admin, partitions=1, **{"compression.type": codec})
        other = "lz4" if codec != "lz4" else "zstd"
        _fetched_in(gateway, name, codec, produced_with=other)


CODECS = {"gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
JSON_VALUES = [json.dumps({"id": i, "name": f"customer-{i % 7}", "note": "x" * 900}).encode() for i in range(200)]


def _fetched_in(gateway, name: str, codec: str, *, produced_with: str) -> None:
    """Produce JSON_VALUES to `name` compressed with `produced_with`: Fetch returns them in batches
    compressed with `codec` that decompress with the codec's own library, and a client reads every
    value byte for byte."""
    from kio.schema.fetch.v12.request import FetchPartition, FetchTopic
    from kio.static.primitive import i32, i64

    from kafka_gateway.records import decode_batches
    from tests.e2e import kafka_wire

    values = JSON_VALUES
    produce(gateway, name, [(None, v) for v in values], **{"compression.type": produced_with})
    with kafka_wire.connect(gateway.kafka) as s:
        part = FetchPartition(partition=i32(0), fetch_offset=i64(0), partition_max_bytes=i32(8 << 20))
        answer = kafka_wire.call(
            s,
            1,
            12,
            max_wait=datetime.timedelta(0),
            min_bytes=i32(1),
            topics=(FetchTopic(topic=name, partitions=(part,)),),
            forgotten_topics_data=(),
        )
    records = bytes(answer.responses[0].partitions[0].records)
    at, sections = 0, []
    while at < len(records):
        length = struct.unpack(">i", records[at + 8 : at + 12])[0]
        attributes = struct.unpack(">h", records[at + 21 : at + 23])[0]
        assert attributes & 7 == CODECS[codec], (codec, attributes)
        sections.append(_decompress(codec, records[at + 61 : at + 12 + length]))
        at += 12 + length
    assert sum(len(x) for x in sections) > 2 * len(records)  # 1 KB JSON compresses
    assert decode_batches(records, max_records=10_000, max_bytes=64 << 20).value.to_pylist() == values
    got = consume(gateway, name, f"g-{name}", len(values))
    assert [m.value() for m in got] == values


@pytest.mark.parametrize("ack_mode", ["table", "log"])
def test_by_default_fetch_returns_the_codec_each_producer_used(gateway, admin, ack_mode):
    """compression.type=producer (the default): batches come back in the codec their producer
    compressed them with, on a `table` topic and on a `log` one (acked from the write-ahead log).
    (From segment files: tests/integration/test_fetch_codec.py.)"""
    for codec in CODECS:
        name = new_topic(admin, partitions=1, **{"topiclake.ack.mode": ack_mode})
        _fetched_in(gateway, name, codec, produced_with=codec)
