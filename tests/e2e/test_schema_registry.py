"""Typed topics over HTTP against a real `topiclake serve`: Confluent's SchemaRegistryClient and
serializers against /registry, produce validation on every HTTP body type, dead letters."""

from __future__ import annotations

import base64
import io
import itertools
import json

import httpx
import pyarrow as pa
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

from tests.e2e.conftest import hw
from tests.e2e.server import ServerProcess

pytestmark = [pytest.mark.e2e]

_ids = itertools.count()

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "long"}, {"name": "total", "type": "double"}],
}
ORDER_V2 = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "currency", "type": "string", "default": "EUR"}]}
ORDER_BAD = {**ORDER_V1, "fields": [*ORDER_V1["fields"], {"name": "currency", "type": "string"}]}
EVENT_SCHEMA = {
    "type": "object",
    "properties": {"user": {"type": "string"}, "n": {"type": "integer", "minimum": 0}},
    "required": ["user", "n"],
}


@pytest.fixture
def fresh_topic(http):
    name = f"typed-{next(_ids)}"
    assert http.post("/topics", json={"name": name, "partitions": 2}).status_code == 201
    return name


def registry_client(server: ServerProcess, **conf: str) -> SchemaRegistryClient:
    return SchemaRegistryClient({"url": server.url + "/registry", **conf})


def fetch_all(http: httpx.Client, topic: str, partitions: int = 2) -> list[dict]:
    out = []
    for p in range(partitions):
        out += http.get(f"/topics/{topic}/partitions/{p}/records", params={"offset": 0}).json()["records"]
    return out


def arrow_body(values: list[bytes | None]) -> bytes:
    table = pa.table({"value": pa.array(values, pa.binary())})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


def test_avro_serializer_registers_and_round_trips(server, http, fresh_topic):
    client = registry_client(server)
    serializer = AvroSerializer(client, json.dumps(ORDER_V1))
    ctx = SerializationContext(fresh_topic, MessageField.VALUE)
    orders = [{"id": i, "total": i * 1.5} for i in range(5)]
    values = [serializer(o, ctx) for o in orders]  # registers subject <topic>-value on first use

    assert f"{fresh_topic}-value" in client.get_subjects()
    latest = client.get_latest_version(f"{fresh_topic}-value")
    assert latest.version == 1 and json.loads(latest.schema.schema_str)["name"] == "Order"
    assert values[0][0] == 0 and int.from_bytes(values[0][1:5], "big") == latest.schema_id

    r = http.post(
        f"/topics/{fresh_topic}/records?value_format=binary",
        json={"records": [{"value": base64.b64encode(v).decode()} for v in values]},
    )
    assert r.status_code == 200, r.text
    deserializer = AvroDeserializer(client)
    got = [deserializer(base64.b64decode(rec["value"]), ctx) for rec in fetch_all(http, fresh_topic)]
    assert sorted(got, key=lambda o: o["id"]) == orders


def test_compatibility_rules_follow_confluent(server, fresh_topic):
    client = registry_client(server)
    subject = f"{fresh_topic}-value"
    first = client.register_schema(subject, Schema(json.dumps(ORDER_V1), "AVRO"))
    again = client.register_schema(subject, Schema(json.dumps(ORDER_V1), "AVRO"))
    assert again == first  # the same schema: the same id, no new version

    assert client.test_compatibility(subject, Schema(json.dumps(ORDER_V2), "AVRO"))
    assert not client.test_compatibility(subject, Schema(json.dumps(ORDER_BAD), "AVRO"))
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(ORDER_BAD), "AVRO"))
    assert refused.value.http_status_code == 409 and refused.value.error_code == 409
    assert "currency" in refused.value.error_message

    second = client.register_schema(subject, Schema(json.dumps(ORDER_V2), "AVRO"))
    assert second != first
    assert client.get_versions(subject) == [1, 2]
    assert client.lookup_schema(subject, Schema(json.dumps(ORDER_V1), "AVRO")).version == 1

    client.set_compatibility(subject, "NONE")
    assert client.get_compatibility(subject) == "NONE"
    client.register_schema(subject, Schema(json.dumps(ORDER_BAD), "AVRO"))
    assert client.get_versions(subject) == [1, 2, 3]

    assert client.delete_version(subject, 3) == 3
    assert client.get_versions(subject) == [1, 2]
    assert client.delete_subject(subject) == [1, 2]
    with pytest.raises(SchemaRegistryError) as gone:
        client.get_latest_version(subject)
    assert gone.value.http_status_code == 404 and gone.value.error_code == 40401
    assert client.get_schema(first).schema_str  # ids stay readable after a soft delete
    assert client.delete_subject(subject, permanent=True) == [1, 2, 3]  # every soft-deleted version
    assert subject not in client.get_subjects()


def test_registry_errors_are_confluents_and_topiclakes(http):
    r = http.get("/registry/subjects/nope-value/versions")
    assert r.status_code == 404
    body = r.json()
    assert body["error_code"] == 40401 and "Register a schema" in body["message"]
    assert body["error"]["code"] == "SUBJECT_NOT_FOUND"
    r = http.post("/registry/subjects/x-value/versions", json={"schema": "{not json"})
    assert r.status_code == 422 and r.json()["error_code"] == 42201
    r = http.post("/registry/subjects/x-value/versions", json={"schema": "{}", "schemaType": "PROTOBUF"})
    assert r.status_code == 422 and "'AVRO' or 'JSON'" in r.json()["message"]
    r = http.put("/registry/config", json={"compatibility": "SIDEWAYS"})
    assert r.status_code == 422 and r.json()["error_code"] == 42203
    assert http.get("/registry/subjects/x-value/versions/first").json()["error_code"] == 42201
    assert http.get("/registry/schemas/ids/999999").json()["error_code"] == 40403
    assert http.get("/registry/config").json() == {"compatibilityLevel": "BACKWARD"}


def _register_json_schema(server, topic):
    client = registry_client(server)
    client.register_schema(f"{topic}-value", Schema(json.dumps(EVENT_SCHEMA), "JSON"))
    return client


@pytest.mark.parametrize("body_type", ["json", "ndjson", "arrow"])
def test_one_bad_record_refuses_the_whole_request(server, http, fresh_topic, body_type):
    _register_json_schema(server, fresh_topic)
    good, bad = {"user": "ada", "n": 1}, {"user": "bob", "n": -1}
    values = [good, good, bad, good]
    if body_type == "json":
        r = http.post(f"/topics/{fresh_topic}/records", json={"records": [{"value": v} for v in values]})
    elif body_type == "ndjson":
        lines = "\n".join(json.dumps({"value": v}) for v in values)
        r = http.post(f"/topics/{fresh_topic}/records", content=lines, headers={"Content-Type": "application/x-ndjson"})
    else:
        r = http.post(
            f"/topics/{fresh_topic}/records",
            content=arrow_body([json.dumps(v).encode() for v in values]),
            headers={"Content-Type": "application/vnd.apache.arrow.stream"},
        )
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "SCHEMA_VALIDATION_FAILED"
    assert [rec["index"] for rec in error["details"]["records"]] == [2]
    assert "minimum" in error["details"]["records"][0]["reason"] or "-1" in error["details"]["records"][0]["reason"]
    assert sum(hw(http, fresh_topic).values()) == 0  # nothing of the request was written
    ok = http.post(f"/topics/{fresh_topic}/records", json={"records": [{"value": good}]})
    assert ok.status_code == 200, ok.text


def test_json_serializer_values_are_checked_by_their_schema_id(server, http, fresh_topic):
    client = _register_json_schema(server, fresh_topic)
    serializer = JSONSerializer(json.dumps(EVENT_SCHEMA), client, conf={"auto.register.schemas": False})
    ctx = SerializationContext(fresh_topic, MessageField.VALUE)
    framed = serializer({"user": "ada", "n": 3}, ctx)
    not_registered = b"\0" + (10**6).to_bytes(4, "big") + b'{"user": "ada", "n": 3}'
    corrupt = framed[:5] + b'{"user": 7}'
    r = http.post(
        f"/topics/{fresh_topic}/records?value_format=binary",
        json={"records": [{"value": base64.b64encode(v).decode()} for v in (framed, not_registered, corrupt)]},
    )
    assert r.status_code == 422
    reasons = {rec["index"]: rec["reason"] for rec in r.json()["error"]["details"]["records"]}
    assert set(reasons) == {1, 2} and "1000000" in reasons[1]
    r = http.post(
        f"/topics/{fresh_topic}/records?value_format=binary",
        json={"records": [{"value": base64.b64encode(framed).decode()}]},
    )
    assert r.status_code == 200, r.text
    deserializer = JSONDeserializer(json.dumps(EVENT_SCHEMA), schema_registry_client=client)
    (rec,) = fetch_all(http, fresh_topic)
    assert deserializer(base64.b64decode(rec["value"]), ctx) == {"user": "ada", "n": 3}


@pytest.mark.parametrize("ack_mode", ["table", "log"])
def test_dead_letters_take_the_bad_records(server, http, fresh_topic, ack_mode):
    _register_json_schema(server, fresh_topic)
    config = {"errors.tolerance": "all", "topiclake.ack.mode": ack_mode}
    r = http.patch(f"/topics/{fresh_topic}/config", json={"config": config})
    assert r.status_code == 200, r.text
    records = [
        {"key": "a", "value": {"user": "ada", "n": 1}},
        {"key": "b", "value": {"user": "bob"}, "headers": {"trace": "t-1"}},
        {"key": "c", "value": {"user": "cy", "n": 2}},
    ]
    r = http.post(f"/topics/{fresh_topic}/records", json={"records": records})
    assert r.status_code == 200, r.text
    body = r.json()
    dlq = f"{fresh_topic}.dlq"
    assert body["dead_letter_topic"] == dlq
    assert [d["index"] for d in body["dead_letters"]] == [1]
    assert body["offsets"][1]["topic"] == dlq and "n" in body["offsets"][1]["error"]
    assert "topic" not in body["offsets"][0] and "topic" not in body["offsets"][2]

    written = fetch_all(http, fresh_topic)
    assert sorted(r["key"] for r in written) == ["a", "c"]
    (letter,) = fetch_all(http, dlq)
    assert letter["key"] == "b" and json.loads(base64.b64decode(letter["value"])) == {"user": "bob"}
    headers = letter["headers"]
    assert headers["trace"] == "t-1"
    assert headers["__connect.errors.topic"] == fresh_topic
    assert "n" in headers["__connect.errors.exception.message"]
    assert headers["topiclake.errors.record.index"] == "1"
    # the dead-letter topic acks as its topic does (a `log` topic's request waits for no Delta commit)
    assert http.get(f"/topics/{dlq}").json()["config"]["topiclake.ack.mode"] == ack_mode


@pytest.mark.parametrize("ack_mode", ["table", "log"])
def test_idempotent_retry_with_dead_letters_writes_once(server, http, fresh_topic, ack_mode):
    _register_json_schema(server, fresh_topic)
    config = {"errors.tolerance": "all", "topiclake.ack.mode": ack_mode}
    assert http.patch(f"/topics/{fresh_topic}/config", json={"config": config}).status_code == 200
    records = {"records": [{"value": {"user": "ada", "n": 1}}, {"value": {"n": 1}}]}
    headers = {"Producer-Id": f"p-{fresh_topic}", "Producer-Sequence": "0"}
    first = http.post(f"/topics/{fresh_topic}/records", json=records, headers=headers).json()
    again = http.post(f"/topics/{fresh_topic}/records", json=records, headers=headers).json()
    assert again["duplicate"] and again["offsets"] == first["offsets"]
    assert len(fetch_all(http, fresh_topic)) == 1 and len(fetch_all(http, f"{fresh_topic}.dlq")) == 1


def test_the_python_producer_learns_where_each_record_went(server, http, fresh_topic):
    from topiclake import Producer

    _register_json_schema(server, fresh_topic)
    with Producer(server.url) as p:
        bad = p.send(fresh_topic, {"user": "ada"})
    with pytest.raises(Exception, match=r"SCHEMA_VALIDATION_FAILED|do not match"):
        bad.result(30)
    http.patch(f"/topics/{fresh_topic}/config", json={"config": {"errors.tolerance": "all"}})
    with Producer(server.url) as p:
        futures = [p.send(fresh_topic, v) for v in ({"user": "a", "n": 1}, {"user": "b"}, {"user": "c", "n": 3})]
    got = [f.result(30) for f in futures]
    assert [m.topic for m in got] == [fresh_topic, f"{fresh_topic}.dlq", fresh_topic]
    letter = http.get(
        f"/topics/{fresh_topic}.dlq/partitions/{got[1].partition}/records", params={"offset": got[1].offset}
    )
    assert json.loads(base64.b64decode(letter.json()["records"][0]["value"])) == {"user": "b"}


def test_dead_letter_config_and_errors_keep_the_requests_indexes(server, http, fresh_topic):
    _register_json_schema(server, fresh_topic)
    r = http.patch(f"/topics/{fresh_topic}/config", json={"config": {"errors.deadletterqueue.topic.name": fresh_topic}})
    assert r.status_code == 400 and r.json()["error"]["code"] == "INVALID_CONFIG"
    config = {"errors.tolerance": "all", "max.message.bytes": "300"}
    assert http.patch(f"/topics/{fresh_topic}/config", json={"config": config}).status_code == 200
    big = {"user": "x" * 400, "n": 1}
    r = http.post(
        f"/topics/{fresh_topic}/records", json={"records": [{"value": {"n": 1}}, {"value": {"n": 2}}, {"value": big}]}
    )
    assert r.status_code == 413 and r.json()["error"]["details"]["index"] == 2, r.text  # the request's index
    assert sum(hw(http, fresh_topic).values()) == 0


def test_a_topic_declares_its_value_schema_at_creation(server, http, tmp_path):
    """POST /topics with value_schema (AdminClient, the CLI): the schema is registered under
    `<topic>-value` with the topic and checks the first produce; a schema the registry refuses
    creates nothing."""
    from tests.e2e.test_clients import run_cli
    from topiclake import AdminClient

    name = f"declared-{next(_ids)}"
    with AdminClient(server.url) as admin:
        info = admin.create_topic(name, partitions=2, value_schema=ORDER_V1)
    assert info["value_schema"]["subject"] == f"{name}-value" and info["value_schema"]["version"] == 1
    latest = http.get(f"/registry/subjects/{name}-value/versions/latest").json()
    assert latest["id"] == info["value_schema"]["id"] and json.loads(latest["schema"])["name"] == "Order"
    r = http.post(f"/topics/{name}/records", json={"records": [{"value": {"id": 1}}]})
    assert r.status_code == 422 and r.json()["error"]["code"] == "SCHEMA_VALIDATION_FAILED"
    serialize = AvroSerializer(registry_client(server), json.dumps(ORDER_V1))
    good = serialize({"id": 1, "total": 2.5}, SerializationContext(name, MessageField.VALUE))
    r = http.post(
        f"/topics/{name}/records",
        json={"records": [{"value": base64.b64encode(good).decode()}]},
        params={"value_format": "binary"},
    )
    assert r.status_code == 200, r.text

    # an existing topic is refused before its subject is touched
    exists = http.post("/topics", json={"name": name, "value_schema": {"schema": json.dumps(ORDER_V2)}})
    assert exists.status_code == 409 and exists.json()["error"]["code"] == "TOPIC_ALREADY_EXISTS"
    assert http.get(f"/registry/subjects/{name}-value/versions").json() == [1]

    # refused schemas leave no topic: one the registry cannot parse, one incompatible with what an
    # earlier topic of the same name left under the subject
    bad = http.post("/topics", json={"name": f"{name}-x", "value_schema": {"schema": '{"type": "nope"}'}})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "INVALID_VALUE_SCHEMA"
    assert http.delete(f"/topics/{name}").status_code == 204
    again = http.post("/topics", json={"name": name, "value_schema": {"schema": json.dumps(ORDER_BAD)}})
    assert again.status_code == 409 and again.json()["error"]["code"] == "INCOMPATIBLE_SCHEMA"
    assert {f"{name}-x", name}.isdisjoint(http.get("/topics").json()["topics"])

    schema_file = tmp_path / "event.json"
    schema_file.write_text(json.dumps(EVENT_SCHEMA))
    r = run_cli(server, "topics", "create", f"{name}-cli", "--value-schema", str(schema_file), "--schema-type", "JSON")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["value_schema"]["subject"] == f"{name}-cli-value"
    r = http.post(f"/topics/{name}-cli/records", json={"records": [{"value": {"user": "a", "n": -1}}]})
    assert r.status_code == 422
