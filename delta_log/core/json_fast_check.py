"""A fast validity check for the JSON Schemas Kafka topics mostly declare. Pure.

jsonschema validates a small order in about 17 µs; produce to a JSON Schema topic ran at 0.27x of
a plain topic's rate (bench/schema_bench.py). `compile_check(schema)` turns a schema that uses only
the keywords below into nested closures that answer valid / invalid in a few µs, with jsonschema's
meaning (draft 2020-12, the default without `$schema`; draft 6 and 7 read these keywords the same).
A schema with any other keyword (`$ref`, `pattern`, `anyOf`...), an older draft, or a non-string
`enum` gets None: jsonschema checks it. jsonschema also explains every value found invalid, so the
reasons a client sees do not depend on which path checked. `tests/unit/test_json_fast_check.py`
compares the two on generated schemas and documents.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Check = Callable[[Any], bool]

_ANNOTATIONS = frozenset(
    {"$schema", "$id", "title", "description", "default", "examples", "$comment", "deprecated", "format"}
)
_KEYWORDS = _ANNOTATIONS | {
    "type",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
}
_DRAFTS = (
    "https://json-schema.org/draft/2020-12/schema",
    "https://json-schema.org/draft/2019-09/schema",
    "http://json-schema.org/draft-07/schema",
    "http://json-schema.org/draft-06/schema",
)
_MAX_DEPTH = 32


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_TYPES: dict[str, Check] = {
    "null": lambda v: v is None,
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
    "number": _is_number,
    "string": lambda v: isinstance(v, str),
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def compile_check(schema: Any) -> Check | None:
    """A function telling whether a parsed JSON document is valid, or None when the schema is
    outside what this module checks."""
    if isinstance(schema, dict):
        declared = schema.get("$schema")
        if declared is not None and (not isinstance(declared, str) or declared.rstrip("#") not in _DRAFTS):
            return None
    return _compile(schema, 0)


def _bound(value: Any) -> bool:
    return _is_number(value)


def _compile(schema: Any, depth: int) -> Check | None:
    if schema is True:
        return lambda v: True
    if schema is False:
        return lambda v: False
    if not isinstance(schema, dict) or depth > _MAX_DEPTH or set(schema) - _KEYWORDS:
        return None
    if depth > 0 and "$schema" in schema:  # a subschema of another dialect: jsonschema's rules
        return None
    checks: list[Check] = []
    if "type" in schema:
        kinds = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not kinds or any(not isinstance(k, str) or k not in _TYPES for k in kinds):
            return None
        tests = [_TYPES[k] for k in kinds]
        checks.append(tests[0] if len(tests) == 1 else lambda v, ts=tests: any(t(v) for t in ts))  # type: ignore[misc]
    if "enum" in schema:
        allowed = schema["enum"]
        if not isinstance(allowed, list) or not all(isinstance(a, str) for a in allowed):
            return None
        members = frozenset(allowed)
        checks.append(lambda v: isinstance(v, str) and v in members)
    numeric = {k: schema[k] for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in schema}
    if numeric:
        if not all(_bound(b) for b in numeric.values()):
            return None
        lo, hi = numeric.get("minimum"), numeric.get("maximum")
        xlo, xhi = numeric.get("exclusiveMinimum"), numeric.get("exclusiveMaximum")
        checks.append(
            lambda v: (
                not _is_number(v)
                or (
                    (lo is None or v >= lo)
                    and (hi is None or v <= hi)
                    and (xlo is None or v > xlo)
                    and (xhi is None or v < xhi)
                )
            )
        )
    for kind, low, high in ((str, "minLength", "maxLength"), (list, "minItems", "maxItems")):
        lengths = [schema.get(low, 0), schema.get(high)]
        if low in schema or high in schema:
            if not all(n is None or (isinstance(n, int) and not isinstance(n, bool) and n >= 0) for n in lengths):
                return None
            checks.append(
                lambda v, k=kind, a=lengths[0], b=lengths[1]: (
                    not isinstance(v, k) or (a <= len(v) and (b is None or len(v) <= b))
                )  # type: ignore[misc]
            )
    if "items" in schema:
        item = _compile(schema["items"], depth + 1)
        if item is None:
            return None
        checks.append(lambda v: not isinstance(v, list) or all(item(x) for x in v))
    supported, object_check = _object(schema, depth)
    if not supported:
        return None
    if object_check is not None:
        checks.append(object_check)
    if not checks:
        return lambda v: True
    if len(checks) == 1:
        return checks[0]
    return lambda v: all(c(v) for c in checks)


def _object(schema: dict[str, Any], depth: int) -> tuple[bool, Check | None]:
    """(whether this module checks the object keywords, their check: None if there are none)."""
    if not {"properties", "required", "additionalProperties"} & set(schema):
        return True, None
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    if (
        not isinstance(properties, dict)
        or not isinstance(required, list)
        or not all(isinstance(r, str) for r in required)
    ):
        return False, None
    compiled: dict[str, Check] = {}
    for name, sub in properties.items():
        sub_check = _compile(sub, depth + 1)
        if sub_check is None:
            return False, None
        compiled[name] = sub_check
    extra: Check | None = None
    if "additionalProperties" in schema:
        extra = _compile(schema["additionalProperties"], depth + 1)
        if extra is None:
            return False, None
    needed = tuple(dict.fromkeys(required))

    def check(v: Any) -> bool:
        if not isinstance(v, dict):
            return True
        for name in needed:
            if name not in v:
                return False
        for key, value in v.items():
            sub = compiled.get(key)
            if sub is not None:
                if not sub(value):
                    return False
            elif extra is not None and not extra(value):
                return False
        return True

    return True, check
