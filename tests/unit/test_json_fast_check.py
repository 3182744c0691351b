"""The fast JSON Schema check agrees with jsonschema on generated schemas and documents."""

import json

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from delta_log.core.json_fast_check import compile_check
from delta_log.core.value_schemas import SubjectSchemas, parse_schema

NAMES = st.sampled_from(["id", "n", "name", "tags", "x"])
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([0, 1, 1.0, -1.5, 2.0, True, False]),
    st.text(max_size=4),
)
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(NAMES, inner, max_size=4)),
    max_leaves=12,
)
TYPES = st.sampled_from(["null", "boolean", "integer", "number", "string", "array", "object"])
NUMBER = st.one_of(st.integers(-5, 5), st.sampled_from([-1.5, 0.5, 2.0]))
LENGTH = st.integers(0, 3)


def schemas(children):
    keyword = st.fixed_dictionaries(
        {},
        optional={
            "type": st.one_of(TYPES, st.lists(TYPES, min_size=1, max_size=3, unique=True)),
            "enum": st.lists(st.text(max_size=2), max_size=3),
            "minimum": NUMBER,
            "maximum": NUMBER,
            "exclusiveMinimum": NUMBER,
            "exclusiveMaximum": NUMBER,
            "minLength": LENGTH,
            "maxLength": LENGTH,
            "minItems": LENGTH,
            "maxItems": LENGTH,
            "items": children,
            "properties": st.dictionaries(NAMES, children, max_size=3),
            "required": st.lists(NAMES, max_size=3),
            "additionalProperties": children,
            "description": st.just("annotations change nothing"),
        },
    )
    return keyword


SCHEMAS = st.recursive(st.one_of(st.booleans(), st.just({})), schemas, max_leaves=6)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SCHEMAS, DOCUMENTS)
def test_agrees_with_jsonschema(schema, document):
    check = compile_check(schema)
    assert check is not None, schema  # every generated schema is in the fast subset
    expected = jsonschema.Draft202012Validator(schema).is_valid(document)
    assert check(document) is expected, (schema, document)


@pytest.mark.parametrize(
    "schema",
    [
        {"pattern": "^a"},
        {"$ref": "#/$defs/x", "$defs": {"x": {}}},
        {"anyOf": [{"type": "string"}]},
        {"enum": [1, "a"]},
        {"type": "object", "properties": {"a": {"oneOf": []}}},
        {"$schema": "http://json-schema.org/draft-04/schema#", "exclusiveMinimum": True, "minimum": 1},
        {"items": [{"type": "string"}]},
        {"type": "decimal"},
    ],
)
def test_other_schemas_are_left_to_jsonschema(schema):
    assert compile_check(schema) is None


def test_reasons_come_from_jsonschema_whichever_path_checked():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}, "required": ["n"]}
    checker = SubjectSchemas("t-value", 1, {1: parse_schema("JSON", json.dumps(schema))})
    assert checker.invalid([b'{"n": 1}', b'{"n": -1}', b'{"n": 1.0}', b"{}", b'{"n": NaN}']) == {
        1: "at /n: -1 is less than the minimum of 0 (schema id 1)",
        3: "'n' is a required property (schema id 1)",
        4: "not JSON (NaN is not a JSON number) (schema id 1)",
    }


def test_a_subschema_of_another_dialect_is_left_to_jsonschema():
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}
    assert compile_check({"type": "object", "properties": {"a": draft4}}) is None
