"""Typed SQL over topics with a value schema: `<database>_typed.<name>` (e.g. `topics_typed.orders`),
a view over the topic's Delta table with the Kafka columns and, beside them, the value's fields as
typed columns, parsed by Spark's own `from_json` (no copy, no Python).

For JSON Schema topics: a value framed by Confluent's serializers (byte 0, 4-byte schema id) is
parsed after its frame, a plain JSON value as it is; both with the latest version's type, so records
written with older versions read with null for the fields they lack. A field named like a Kafka column
(key, value, topic, partition, offset, timestamp, timestampType, headers) is shown as `value_<name>`;
a schema whose root is not an object gives one column, `value_typed`.

Avro topics get no view yet: Spark's `from_avro` ships in spark-avro, which has no release for this
Spark version in the package index (docs/SPARK.md).
"""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from delta_log.core.value_schemas import JSON, subject_for
from delta_log.errors import SourceOptionError
from delta_log.system.schemas import SchemaStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
_MAX_DEPTH = 32
_SCALARS: dict[str, pa.DataType] = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
_STRING_FORMATS: dict[str, pa.DataType] = {"date-time": pa.timestamp("us", tz="UTC"), "date": pa.date32()}
_DDL = {
    "int64": "BIGINT",
    "double": "DOUBLE",
    "bool": "BOOLEAN",
    "string": "STRING",
    "timestamp[us, tz=UTC]": "TIMESTAMP",
    "date32[day]": "DATE",
}


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def arrow_type(schema: Any, depth: int = 0) -> pa.DataType:
    """The type a JSON Schema's documents are read into: `integer` int64, `number` float64,
    `boolean`, `string` (a timestamp or date for format date-time / date), objects with properties
    a struct, arrays a list; what the schema leaves open (several types, $ref, no type) is a string
    holding that part's JSON text."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return pa.string()
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind == "object" and isinstance(schema.get("properties"), dict) and schema["properties"]:
        return pa.struct([pa.field(name, arrow_type(sub, depth + 1)) for name, sub in schema["properties"].items()])
    if kind == "array":
        return pa.list_(arrow_type(schema.get("items"), depth + 1))
    if kind == "string":
        return _STRING_FORMATS.get(str(schema.get("format")), pa.string())
    return _SCALARS.get(str(kind), pa.string())


def spark_ddl(t: pa.DataType) -> str:
    """Spark SQL's name for an arrow_type()."""
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"{_q(f.name)}: {spark_ddl(f.type)}" for f in t) + ">"
    if pa.types.is_list(t):
        return f"ARRAY<{spark_ddl(t.value_type)}>"
    return _DDL[str(t)]


def spark_type(schema: Any) -> str:
    """The Spark SQL type (DDL) `from_json` parses a JSON Schema's documents into."""
    return spark_ddl(arrow_type(schema))


def coerce(value: Any, t: pa.DataType) -> Any:
    """A parsed JSON value as `t` holds it, as Spark's from_json reads it: what does not fit is null."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        return {f.name: coerce(value.get(f.name), f.type) for f in t} if isinstance(value, dict) else None
    if pa.types.is_list(t):
        return [coerce(v, t.value_type) for v in value] if isinstance(value, list) else None
    if pa.types.is_string(t):
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    if pa.types.is_boolean(t):
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if pa.types.is_int64(t):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return value if isinstance(value, int) and -(2**63) <= value < 2**63 else None
    if pa.types.is_float64(t):
        return float(value) if isinstance(value, int | float) else None
    if not isinstance(value, str):
        return None
    try:
        if pa.types.is_timestamp(t):
            parsed = datetime.fromisoformat(value)
            return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        return date.fromisoformat(value)
    except ValueError:
        return None


def parsed_values(values: pa.Array | pa.ChunkedArray, t: pa.DataType) -> pa.Array:
    """A batch's `value_parsed` column: each value (framed by Confluent's serializers, or plain
    JSON) parsed and read as `t`; null where it is not JSON."""
    out: list[Any] = []
    for raw in values.to_pylist():
        if raw is None:
            out.append(None)
            continue
        payload = raw[5:] if len(raw) >= 5 and raw[0] == 0 else raw
        try:
            out.append(coerce(json.loads(payload), t))
        except (ValueError, RecursionError, OverflowError):
            out.append(None)
    return pa.array(out, t)


def _literal(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def typed_view_sql(view: str, table: str, schema: Any) -> str:
    """CREATE OR REPLACE VIEW `view` over `table` (both qualified) for a JSON Schema `schema`."""
    ddl = spark_type(schema)
    payload = "CAST(IF(length(value) >= 5 AND substring(value, 1, 1) = X'00', substring(value, 6), value) AS STRING)"
    kafka = ", ".join(_q(c) for c in KAFKA_COLUMNS)
    if ddl.startswith("STRUCT<"):
        names = list(schema["properties"])
        typed = ", ".join(
            f"__v.{_q(n)} AS {_q('value_' + n if n.lower() in {c.lower() for c in KAFKA_COLUMNS} else n)}"
            for n in names
        )
    else:
        typed = "__v AS value_typed"
    return (
        f"CREATE OR REPLACE VIEW {view} AS SELECT {kafka}, {typed} "
        f"FROM (SELECT *, from_json({payload}, {_literal(ddl)}) AS __v FROM {table})"
    )


def value_type(store: SchemaStore | None, topics: list[str]) -> pa.DataType:
    """The one type the values of `topics` are parsed into (the source's parseValues option): each
    topic needs a JSON Schema value schema, all of the same shape.

    Raises: SourceOptionError that names the topic in the way.
    """
    state = store.state(max_age_s=0) if store is not None else None
    types: dict[str, pa.DataType] = {}
    for topic in topics:
        schemas = state.subject_schemas(subject_for(topic)) if state is not None else None
        if schemas is None or schemas.latest.schema_type != JSON:
            raise SourceOptionError(
                f"parseValues needs a JSON Schema value schema for topic {topic!r} (registry subject "
                f"{subject_for(topic)!r}); register one, or drop the option and parse `value` yourself.",
                option="parseValues",
            )
        types[topic] = arrow_type(schemas.latest.document)
    if len(set(types.values())) > 1:
        raise SourceOptionError(
            f"parseValues reads topics whose value schemas differ ({', '.join(sorted(types))}); "
            "read them in separate queries.",
            option="parseValues",
        )
    if not types:
        raise SourceOptionError("parseValues: no topic matches the subscription yet.", option="parseValues")
    return next(iter(types.values()))


def register_typed_views(
    spark: SparkSession, store: SchemaStore | None, tables: dict[str, str], database: str
) -> dict[str, str]:
    """A typed view per topic whose value schema is JSON Schema, in `<database>_typed`; views of
    topics that no longer have one are dropped. Returns {topic: view}."""
    typed_db = f"{database}_typed"
    state = store.state(max_age_s=0) if store is not None else None
    views: dict[str, str] = {}
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {_q(typed_db)}")
    for topic, name in tables.items():
        view = f"{_q(typed_db)}.{_q(name)}"
        schemas = state.subject_schemas(subject_for(topic)) if state is not None else None
        if schemas is None or schemas.latest.schema_type != JSON:
            spark.sql(f"DROP VIEW IF EXISTS {view}")
            continue
        spark.sql(typed_view_sql(view, f"{_q(database)}.{_q(name)}", schemas.latest.document))
        views[topic] = f"{typed_db}.{name}"
    return views
