"""Value schemas: parsing, Confluent's compatibility levels on Avro and JSON Schema, value checks."""

import io
import json

import fastavro
import pytest

from delta_log.core.value_schemas import (
    SubjectSchemas,
    compatibility_messages,
    parse_schema,
    topic_of_subject,
    validate_level,
)
from delta_log.errors import InvalidCompatibilityLevelError, InvalidValueSchemaError


def avro(fields, name="Order", **extra):
    return parse_schema("AVRO", json.dumps({"type": "record", "name": name, "fields": fields, **extra}))


def jsonschema(document):
    return parse_schema("JSON", json.dumps(document))


ID = {"name": "id", "type": "long"}
V1 = avro([ID])


@pytest.mark.parametrize(
    ("new", "level", "compatible"),
    [
        (avro([ID, {"name": "cur", "type": "string", "default": "EUR"}]), "BACKWARD", True),
        (avro([ID, {"name": "cur", "type": "string"}]), "BACKWARD", False),  # no default: old data lacks it
        (avro([ID, {"name": "cur", "type": "string"}]), "FORWARD", True),  # old readers ignore it
        (avro([ID, {"name": "cur", "type": "string"}]), "FULL", False),
        (avro([{"name": "id", "type": "int"}]), "BACKWARD", False),  # long cannot be read as int
        (avro([{"name": "id", "type": "double"}]), "BACKWARD", True),  # promotion
        (avro([{"name": "id", "type": ["null", "long"]}]), "BACKWARD", True),  # a union with the old type
        (avro([{"name": "key", "type": "long", "aliases": ["id"]}]), "BACKWARD", True),
        (avro([ID], name="Other"), "BACKWARD", False),
        (avro([{"name": "cur", "type": "string"}]), "NONE", True),
    ],
)
def test_avro_compatibility(new, level, compatible):
    assert (compatibility_messages(level, new, [V1]) == []) is compatible


def test_avro_enums_nested_records_and_recursion():
    def enum(symbols, default=None):
        e = {"type": "enum", "name": "Kind", "symbols": symbols}
        return avro([{"name": "kind", "type": e | ({"default": default} if default else {})}], name="E")

    assert compatibility_messages("BACKWARD", enum(["A", "B", "C"]), [enum(["A", "B"])]) == []
    assert compatibility_messages("BACKWARD", enum(["A"]), [enum(["A", "B"])]) != []
    assert compatibility_messages("BACKWARD", enum(["A", "Z"], "Z"), [enum(["A", "B"])]) == []
    node = {"type": "record", "name": "Node", "fields": [{"name": "next", "type": ["null", "Node"]}]}
    old = avro([{"name": "head", "type": node}], name="List")
    grown = {**node, "fields": [*node["fields"], {"name": "v", "type": "int", "default": 0}]}
    assert compatibility_messages("FULL", avro([{"name": "head", "type": grown}], name="List"), [old]) == []


def test_transitive_levels_check_every_version():
    v2 = avro([ID, {"name": "a", "type": "int", "default": 0}])
    v3 = avro([ID, {"name": "a", "type": "int"}])  # reads v2's data, not v1's
    assert compatibility_messages("BACKWARD", v3, [V1, v2]) == []
    assert compatibility_messages("BACKWARD_TRANSITIVE", v3, [V1, v2]) != []


OPEN = {"type": "object", "properties": {"id": {"type": "integer"}}, "required": ["id"]}
CLOSED = {**OPEN, "additionalProperties": False}


@pytest.mark.parametrize(
    ("old", "new", "level", "compatible"),
    [
        (CLOSED, {**CLOSED, "properties": {**CLOSED["properties"], "x": {"type": "string"}}}, "BACKWARD", True),
        # Confluent's rule: adding a property to an open content model is not backward compatible
        (OPEN, {**OPEN, "properties": {**OPEN["properties"], "x": {"type": "string"}}}, "BACKWARD", False),
        (OPEN, {**OPEN, "properties": {"id": {"type": "number"}}}, "BACKWARD", True),  # widened
        (OPEN, {**OPEN, "properties": {"id": {"type": "number"}}}, "FORWARD", False),
        (OPEN, {**OPEN, "required": ["id", "name"]}, "BACKWARD", False),
        (OPEN, {**OPEN, "required": []}, "BACKWARD", True),
        (OPEN, {**OPEN, "properties": {"id": {"type": "integer", "minimum": 0}}}, "BACKWARD", False),
        (OPEN, CLOSED, "BACKWARD", False),  # closing the model refuses data with extra properties
        (CLOSED, {**OPEN, "properties": {}, "required": []}, "BACKWARD", True),  # id removed from an open model
        (OPEN, {**OPEN, "oneOf": [{"required": ["a"]}]}, "BACKWARD", False),  # unchecked keyword changed
    ],
)
def test_json_schema_compatibility(old, new, level, compatible):
    messages = compatibility_messages(level, jsonschema(new), [jsonschema(old)])
    assert (messages == []) is compatible, messages


def test_a_type_change_is_never_compatible():
    assert compatibility_messages("BACKWARD", jsonschema(OPEN), [V1]) == ["the schema type changed from AVRO to JSON"]


def framed(schema_id: int, payload: bytes) -> bytes:
    return b"\0" + schema_id.to_bytes(4, "big") + payload


def test_values_are_checked_by_the_id_in_their_frame():
    writer = fastavro.parse_schema(V1.document)
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, writer, {"id": 7})
    good = buf.getvalue()
    v2 = avro([ID, {"name": "n", "type": "string", "default": ""}])
    subject = SubjectSchemas("orders-value", 2, {1: V1, 2: v2})
    assert subject.reason(framed(1, good)) is None  # an older version's id
    assert subject.reason(None) is None  # a tombstone
    assert "ends early" in subject.reason(framed(2, good))  # v2 expects one more field
    assert "not a version" in subject.reason(framed(9, good))
    assert "left after" in subject.reason(framed(1, good + b"x"))
    assert "framed" in subject.reason(good)
    js = SubjectSchemas("e-value", 5, {5: jsonschema(OPEN)})
    assert js.invalid([b'{"id": 1}', framed(5, b'{"id": 2}'), b'{"id": "x"}', b"\xff", framed(5, b"{}")]).keys() == {
        2,
        3,
        4,
    }


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("PROTOBUF", "syntax = 'proto3';"),
        ("AVRO", ""),
        ("AVRO", "{"),
        ("AVRO", '{"type": "record", "name": "X"}'),
        ("AVRO", '{"type": "nope"}'),
        ("JSON", '{"type": 12}'),
        ("JSON", "[1, 2]"),
        ("JSON", "[" * 5000 + "]" * 5000),
        ("AVRO", "x" * 300_000),
        (None, None),
    ],
)
def test_bad_schemas_get_a_clear_error(kind, text):
    with pytest.raises(InvalidValueSchemaError) as refused:
        parse_schema(kind, text)
    assert refused.value.message and len(refused.value.message) < 1000


def test_names():
    assert topic_of_subject("orders-value") == "orders"
    assert topic_of_subject("orders-key") == "orders"
    assert topic_of_subject("shop.Order") == "shop.Order"
    assert topic_of_subject("-value") == "-value"
    assert validate_level("full_transitive") == "FULL_TRANSITIVE"
    with pytest.raises(InvalidCompatibilityLevelError):
        validate_level("SIDEWAYS")


@pytest.mark.parametrize(
    ("kind", "document", "why"),
    [
        ("JSON", {"properties": {"a": {"$ref": "http://169.254.169.254/latest"}}}, "outside the schema"),
        ("JSON", {"$ref": "file:///etc/passwd"}, "outside the schema"),
        ("JSON", {"$schema": 5}, "must be a string"),
        ("AVRO", {"type": "record", "name": "R", "fields": [{"name": "a", "type": "int"}] * 2}, "twice"),
        ("AVRO", ["int", "int"], "twice"),
        ("AVRO", ["null", ["int", "string"]], "union"),
        ("AVRO", {"type": "fixed", "name": "F", "size": -1}, "size"),
        ("AVRO", {"type": "array", "items": "null"}, "zero bytes"),
        ("AVRO", {"type": "map", "values": {"type": "record", "name": "E", "fields": []}}, "zero bytes"),
    ],
)
def test_schemas_that_would_hurt_are_refused(kind, document, why):
    with pytest.raises(InvalidValueSchemaError, match=why):
        parse_schema(kind, json.dumps(document))


def test_local_refs_are_resolved_and_nothing_is_fetched():
    schema = jsonschema({"$defs": {"n": {"type": "integer"}}, "properties": {"n": {"$ref": "#/$defs/n"}}})
    checker = SubjectSchemas("t-value", 1, {1: schema})
    assert checker.invalid([b'{"n": 1}', b'{"n": "x"}']).keys() == {1}


D7 = "http://json-schema.org/draft-07/schema#"
D4 = "http://json-schema.org/draft-04/schema#"


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ({"enum": [1, 2]}, {"enum": [True, 2]}),  # Python says 1 == True; JSON does not
        ({"const": 0}, {"const": False}),
        ({"$schema": D7, "items": [{"type": "string"}]}, {"$schema": D7, "items": [{"type": "integer"}]}),  # tuples
        ({"$schema": D7, "items": [{"type": "string"}]}, {"$schema": D7, "items": {"type": "string"}}),
        ({"type": "integer"}, {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}),
        (  # draft 4: exclusiveMinimum is a flag, not a bound
            {"$schema": D4, "minimum": 1, "exclusiveMinimum": False},
            {"$schema": D4, "minimum": 1, "exclusiveMinimum": True},
        ),
    ],
)
def test_json_schema_changes_compared_strictly_never_crash(old, new):
    messages = compatibility_messages("FULL", jsonschema(new), [jsonschema(old)])
    assert messages, (old, new)


def test_avro_compatibility_of_deep_named_types_is_fast():
    # each record has 12 fields referring to the next: without memoizing named pairs the check
    # walked 12^depth paths (minutes at depth 7)
    def nested(depth: int) -> dict:
        node: dict = {"type": "record", "name": f"R{depth}", "fields": [{"name": "leaf", "type": "int"}]}
        for d in range(depth - 1, -1, -1):
            node = {
                "type": "record",
                "name": f"R{d}",
                "fields": [{"name": f"f{i}", "type": node if i == 0 else f"R{d + 1}"} for i in range(12)],
            }
        return node

    import time

    old = parse_schema("AVRO", json.dumps(nested(8)))
    start = time.perf_counter()
    assert compatibility_messages("FULL_TRANSITIVE", old, [old]) == []
    assert time.perf_counter() - start < 5
