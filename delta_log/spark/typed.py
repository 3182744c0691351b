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

from typing import TYPE_CHECKING, Any

from delta_log.core.value_schemas import JSON, subject_for
from delta_log.system.schemas import SchemaStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
_MAX_DEPTH = 32
_SCALARS = {"integer": "BIGINT", "number": "DOUBLE", "boolean": "BOOLEAN", "null": "STRING"}
_STRING_FORMATS = {"date-time": "TIMESTAMP", "date": "DATE"}


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def spark_type(schema: Any, depth: int = 0) -> str:
    """The Spark SQL type (DDL) `from_json` parses a JSON Schema's documents into. What the
    schema leaves open (several types, $ref, no type) is STRING: the JSON text of that part."""
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return "STRING"
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind == "object" and isinstance(schema.get("properties"), dict) and schema["properties"]:
        fields = ", ".join(f"{_q(name)}: {spark_type(sub, depth + 1)}" for name, sub in schema["properties"].items())
        return f"STRUCT<{fields}>"
    if kind == "array":
        return f"ARRAY<{spark_type(schema.get('items'), depth + 1)}>"
    if kind == "string":
        return _STRING_FORMATS.get(str(schema.get("format")), "STRING")
    return _SCALARS.get(str(kind), "STRING")


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
