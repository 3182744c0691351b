"""Typed SQL over topics with a value schema: `<database>_typed.<name>` (e.g. `topics_typed.orders`),
a view over the topic's Delta table with the Kafka columns and, beside them, the value's fields as
typed columns, parsed by Spark's own `from_json` (no copy, no Python).

For JSON Schema topics: a value framed by Confluent's serializers (byte 0, 4-byte schema id) is
parsed after its frame, a plain JSON value as it is; both with the latest version's type, so records
written with older versions read with null for the fields they lack. A field named like a Kafka column
(key, value, topic, partition, offset, timestamp, timestampType, headers) is shown as `value_<name>`;
a schema whose root is not an object gives one column, `value_typed`.

For Avro topics: values are framed (Confluent's wire format); each is decoded by Spark's own
`from_avro` with the writer version its id names, resolved to the latest version (so every row has
the latest's type, as Spark maps Avro types: records struct, enums string, fixed binary, decimals
DECIMAL, logical timestamps TIMESTAMP). `from_avro` is in the spark-avro module, which get_spark
loads (`spark.avro_package`; docs/SPARK.md says why that version).

The source's parseValues option reads both kinds in its Python tasks (`ValueParser`), for streams.
"""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import TYPE_CHECKING, Any

import fastavro
import pyarrow as pa

from delta_log.core.value_schemas import AVRO, FRAME_BYTES, JSON, MAGIC_BYTE, AvroNames, SubjectSchemas, subject_for
from delta_log.errors import SourceOptionError
from delta_log.system.schemas import SchemaStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers")
_MAX_DEPTH = 32
_SCALARS: dict[str, pa.DataType] = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_()}
_STRING_FORMATS: dict[str, pa.DataType] = {"date-time": pa.timestamp("us", tz="UTC"), "date": pa.date32()}
_DDL = {
    "int32": "INT",
    "float": "FLOAT",
    "binary": "BINARY",
    "int64": "BIGINT",
    "double": "DOUBLE",
    "bool": "BOOLEAN",
    "string": "STRING",
    "timestamp[us, tz=UTC]": "TIMESTAMP",
    "timestamp[ms, tz=UTC]": "TIMESTAMP",
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


_AVRO_TYPES: dict[str, pa.DataType] = {
    "boolean": pa.bool_(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "bytes": pa.binary(),
    "string": pa.string(),
}
_AVRO_LOGICAL: dict[str, pa.DataType] = {
    "timestamp-millis": pa.timestamp("ms", tz="UTC"),  # its ints (defaults) in its unit; read as us
    "timestamp-micros": pa.timestamp("us", tz="UTC"),
    "date": pa.date32(),
    "decimal": pa.string(),
    "uuid": pa.string(),
    "time-millis": pa.string(),
    "time-micros": pa.string(),
}


def avro_arrow_type(names: AvroNames, node: dict[str, Any], depth: int = 0) -> pa.DataType:
    """The type an Avro schema's values are read into (records struct, arrays list, maps map,
    enums string, fixed binary, [null, T] unions T; other unions and recursion beyond 32 levels a
    string holding the value's JSON text)."""
    node = names.deref(node)
    kind = node["type"]
    if depth > _MAX_DEPTH or kind == "ref":
        return pa.string()
    if kind == "union":
        branches = [b for b in node["branches"] if b["type"] != "null"]
        return avro_arrow_type(names, branches[0], depth) if len(branches) == 1 else pa.string()
    if node.get("logical") in _AVRO_LOGICAL:
        return _AVRO_LOGICAL[node["logical"]]
    if kind in _AVRO_TYPES:
        return _AVRO_TYPES[kind]
    if kind == "record":
        return pa.struct([pa.field(f["name"], avro_arrow_type(names, f["type"], depth + 1)) for f in node["fields"]])
    if kind == "array":
        return pa.list_(avro_arrow_type(names, node["items"], depth + 1))
    if kind == "map":
        return pa.map_(pa.string(), avro_arrow_type(names, node["values"], depth + 1))
    if kind == "fixed":
        return pa.binary()
    return pa.string()  # enum, null


def spark_ddl(t: pa.DataType) -> str:
    """Spark SQL's name for an arrow_type()."""
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"{_q(f.name)}: {spark_ddl(f.type)}" for f in t) + ">"
    if pa.types.is_list(t):
        return f"ARRAY<{spark_ddl(t.value_type)}>"
    if pa.types.is_map(t):
        return f"MAP<{spark_ddl(t.key_type)}, {spark_ddl(t.item_type)}>"
    return _DDL[str(t)]


def spark_type(schema: Any) -> str:
    """The Spark SQL type (DDL) `from_json` parses a JSON Schema's documents into."""
    return spark_ddl(arrow_type(schema))


def coerce(value: Any, t: pa.DataType, *, avro: bool = False) -> Any:
    """A parsed value as `t` holds it, as Spark's from_json reads JSON: what does not fit is null.
    `avro`: fastavro's values, where a logical type's default stays an int in its own unit."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        if not isinstance(value, dict):
            return None
        return {f.name: coerce(value.get(f.name), f.type, avro=avro) for f in t}
    if pa.types.is_list(t):
        return [coerce(v, t.value_type, avro=avro) for v in value] if isinstance(value, list) else None
    if pa.types.is_map(t):
        if not isinstance(value, dict):
            return None
        return [(str(k), coerce(v, t.item_type, avro=avro)) for k, v in value.items()]
    if avro and isinstance(value, int) and not isinstance(value, bool) and pa.types.is_temporal(t):
        return value
    if pa.types.is_string(t):
        return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"), default=str)
    if pa.types.is_binary(t):
        return value if isinstance(value, bytes) else None
    if isinstance(value, datetime | date) and (pa.types.is_timestamp(t) or pa.types.is_date(t)):
        return value
    if pa.types.is_boolean(t):
        return value if isinstance(value, bool) else None
    if isinstance(value, bool):
        return None
    if pa.types.is_integer(t):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        bits = t.bit_width - 1
        return value if isinstance(value, int) and -(2**bits) <= value < 2**bits else None
    if pa.types.is_floating(t):
        return float(value) if isinstance(value, int | float) else None
    if not isinstance(value, str):
        return None
    try:
        if pa.types.is_timestamp(t):
            parsed = datetime.fromisoformat(value)
            return parsed.astimezone(UTC) if parsed.tzinfo else parsed.replace(tzinfo=UTC)
        return date.fromisoformat(value)
    except (ValueError, OverflowError):
        return None


@dataclass(frozen=True, slots=True)
class ValueParser:
    """How a topic's values become `value_parsed` (picklable: it travels with each Spark task).
    JSON: framed or plain JSON text read as `arrow`. AVRO: framed values decoded with the schema of
    their id (`writers`, id -> schema JSON) and resolved to the latest version (`reader`)."""

    arrow: pa.DataType
    kind: str = JSON
    reader: str = ""
    writers: tuple[tuple[int, str], ...] = ()

    def column(self, values: pa.Array | pa.ChunkedArray) -> pa.Array:
        """The parsed column of a batch's values; null where a value does not parse."""
        decode = self._avro_decoder() if self.kind == AVRO else _json_decode
        out: list[Any] = []
        avro = self.kind == AVRO
        for raw in values.to_pylist():
            try:
                out.append(None if raw is None else coerce(decode(raw), self.arrow, avro=avro))
            except Exception:  # a value its schema does not read (corrupt, truncated, unknown id)
                out.append(None)
        try:
            column = pa.array(out, self.arrow)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):  # a value Arrow cannot hold
            column = pa.array([v if _fits(v, self.arrow) else None for v in out], self.arrow)
        spark = _microseconds(self.arrow)
        return column if spark == self.arrow else column.cast(spark)

    def _avro_decoder(self) -> Callable[[bytes], Any]:
        reader = fastavro.parse_schema(json.loads(self.reader))
        writers = {i: fastavro.parse_schema(json.loads(text)) for i, text in self.writers}

        def decode(raw: bytes) -> Any:
            if len(raw) < FRAME_BYTES or raw[0] != MAGIC_BYTE:
                return None
            writer = writers.get(int.from_bytes(raw[1:FRAME_BYTES], "big"))
            return None if writer is None else fastavro.schemaless_reader(io.BytesIO(raw[FRAME_BYTES:]), writer, reader)

        return decode


def _fits(value: Any, t: pa.DataType) -> bool:
    try:
        pa.array([value], t)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, ValueError):
        return False
    return True


def _microseconds(t: pa.DataType) -> pa.DataType:
    """`t` with every timestamp in microseconds (Spark's TIMESTAMP)."""
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz=t.tz)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _microseconds(f.type)) for f in t])
    if pa.types.is_list(t):
        return pa.list_(_microseconds(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(t.key_type, _microseconds(t.item_type))
    return t


def _json_decode(raw: bytes) -> Any:
    return json.loads(raw[FRAME_BYTES:] if len(raw) >= FRAME_BYTES and raw[0] == MAGIC_BYTE else raw)


def parser_for(schemas: SubjectSchemas) -> ValueParser:
    """The parser of a topic's values, from its registry subject."""
    latest = schemas.latest
    if latest.schema_type == JSON:
        return ValueParser(arrow_type(latest.document))
    names = AvroNames(latest.document)
    writers = tuple(sorted((i, s.text) for i, s in schemas.by_id.items() if s.schema_type == AVRO))
    return ValueParser(avro_arrow_type(names, names.root), AVRO, latest.text, writers)


def _literal(text: str) -> str:
    """A SQL string literal of `text`. Spark substitutes `${...}` in SQL text before parsing it
    (spark.sql.variable.substitute), also when it re-reads a view: a schema's `${env:SECRET}` would
    become the session's secret. So `${` is written as two adjacent literals, `'$' '{'`, which Spark
    joins back."""
    escaped = text.replace("\\", "\\\\").replace("'", "\\'")
    return "'" + escaped.replace("${", "$' '{") + "'"


#: A framed value's payload (after byte 0 and the 4-byte schema id), and that id.
_PAYLOAD = "substring(value, 6)"
_FRAMED = "length(value) >= 5 AND substring(value, 1, 1) = X'00'"
_SCHEMA_ID = "CAST(conv(hex(substring(value, 2, 4)), 16, 10) AS BIGINT)"
#: The writer versions an Avro view decodes (each is a branch of the view's SQL, holding the writer's
#: and the latest's schema text): the latest, then the newest ids, within both bounds.
MAX_AVRO_VIEW_VERSIONS = 100
MAX_AVRO_VIEW_SQL = 8 * 1024 * 1024


def _view_sql(
    view: str, table: str, parsed: str, fields: list[str] | None, properties: dict[str, str] | None = None
) -> str:
    """CREATE OR REPLACE VIEW `view`: the Kafka columns of `table`, then the struct `parsed` spread
    into its `fields` (a field named like a Kafka column is `value_<name>`), or, with no fields,
    one column `value_typed`."""
    kafka = ", ".join(_q(c) for c in KAFKA_COLUMNS)
    fields = [n for n in fields or () if "${" not in n]  # an identifier cannot be split like _literal
    if fields:
        taken = {c.lower() for c in KAFKA_COLUMNS}
        columns = []
        for n in fields:
            column = f"value_{n}" if n.lower() in taken else n
            while column.lower() in taken:  # Spark's names are case-insensitive: Id and id collide
                column += "_"
            taken.add(column.lower())
            columns.append(f"__v.{_q(n)} AS {_q(column)}")
        typed = ", ".join(columns)
    else:
        typed = "__v AS value_typed"
    props = (
        " TBLPROPERTIES (" + ", ".join(f"{_literal(k)} = {_literal(v)}" for k, v in properties.items()) + ")"
        if properties
        else ""
    )
    return (
        f"CREATE OR REPLACE VIEW {view}{props} AS SELECT {kafka}, {typed} FROM (SELECT *, {parsed} AS __v FROM {table})"
    )


def typed_view_sql(view: str, table: str, schema: Any, properties: dict[str, str] | None = None) -> str:
    """CREATE OR REPLACE VIEW `view` over `table` (both qualified) for a JSON Schema `schema`, with
    `properties` as its TBLPROPERTIES."""
    ddl = spark_type(schema)
    payload = f"CAST(IF({_FRAMED}, {_PAYLOAD}, value) AS STRING)"
    fields = list(schema["properties"]) if ddl.startswith("STRUCT<") else None
    return _view_sql(view, table, f"from_json({payload}, {_literal(ddl)})", fields, properties)


def avro_view_sql(view: str, table: str, schemas: SubjectSchemas, properties: dict[str, str] | None = None) -> str:
    """CREATE OR REPLACE VIEW `view` over `table` for an Avro subject: each framed value decoded by
    Spark's `from_avro` with the version its id names and resolved to the latest (the `avroSchema`
    option: new fields get their defaults), so every row has the latest version's type, as Spark
    maps Avro types. A value not framed, framed with an id this subject does not know (or one beyond
    MAX_AVRO_VIEW_VERSIONS / MAX_AVRO_VIEW_SQL), or that does not decode (PERMISSIVE) is null."""
    latest = schemas.latest
    others = sorted(((i, s) for i, s in schemas.by_id.items() if s.schema_type == AVRO and i != schemas.latest_id))
    options = f"map('mode', 'PERMISSIVE', 'avroSchema', {_literal(latest.text)})"
    branches: list[str] = []
    size = 0
    for i, writer in [(schemas.latest_id, latest), *reversed(others)]:  # the latest, then the newest ids
        branch = f"WHEN {i} THEN from_avro({_PAYLOAD}, {_literal(writer.text)}, {options})"
        if branches and (len(branches) >= MAX_AVRO_VIEW_VERSIONS or size + len(branch) > MAX_AVRO_VIEW_SQL):
            break
        branches.append(branch)
        size += len(branch)
    parsed = f"CASE WHEN {_FRAMED} THEN CASE {_SCHEMA_ID} {' '.join(branches)} END END"
    names = AvroNames(latest.document)
    root = names.deref(names.root)
    fields = [f["name"] for f in root["fields"]] if root["type"] == "record" and root["fields"] else None
    return _view_sql(view, table, parsed, fields, properties)


def value_parser(store: SchemaStore | None, topics: list[str]) -> ValueParser:
    """How the source's parseValues option reads `topics`: each needs a value schema (JSON Schema
    or Avro), all read into the same type.

    Raises: SourceOptionError that names the topic in the way.
    """
    state = store.state(max_age_s=0) if store is not None else None
    parsers: dict[str, ValueParser] = {}
    for topic in topics:
        schemas = state.subject_schemas(subject_for(topic)) if state is not None else None
        if schemas is None:
            raise SourceOptionError(
                f"parseValues needs a value schema for topic {topic!r} (registry subject "
                f"{subject_for(topic)!r}); register one, or drop the option and parse `value` yourself.",
                option="parseValues",
            )
        parsers[topic] = parser_for(schemas)
    if len({p.arrow for p in parsers.values()}) > 1:
        raise SourceOptionError(
            f"parseValues reads topics whose value schemas differ ({', '.join(sorted(parsers))}); "
            "read them in separate queries.",
            option="parseValues",
        )
    if not parsers:
        raise SourceOptionError("parseValues: no topic matches the subscription yet.", option="parseValues")
    return next(iter(parsers.values()))


def register_typed_views(
    spark: SparkSession, store: SchemaStore | None, tables: dict[str, str], database: str
) -> dict[str, str]:
    """A typed view per topic whose value schema is JSON Schema or Avro, in `<database>_typed`;
    views of topics that no longer have one are dropped. Returns {topic: view}. An Avro topic needs
    Spark's from_avro (`spark.avro_package`, which get_spark loads); without it its view is left out
    with a warning that says so."""
    typed_db = f"{database}_typed"
    state = store.state(max_age_s=0) if store is not None else None
    views: dict[str, str] = {}
    spark.sql(f"CREATE DATABASE IF NOT EXISTS {_q(typed_db)}")
    for topic, name in tables.items():
        view = f"{_q(typed_db)}.{_q(name)}"
        schemas = state.subject_schemas(subject_for(topic)) if state is not None else None
        if schemas is None or schemas.latest.schema_type not in (JSON, AVRO):
            spark.sql(f"DROP VIEW IF EXISTS {view}")
            continue
        table = f"{_q(database)}.{_q(name)}"
        properties = {
            "topiclake.topic": topic,
            "topiclake.value.subject": schemas.subject,
            "topiclake.value.schema.id": str(schemas.latest_id),
            "topiclake.value.schema.type": schemas.latest.schema_type,
        }
        try:
            if schemas.latest.schema_type == AVRO:
                spark.sql(avro_view_sql(view, table, schemas, properties))
            else:
                spark.sql(typed_view_sql(view, table, schemas.latest.document, properties))
        except Exception as exc:  # one topic's schema Spark cannot express must not stop the others
            spark.sql(f"DROP VIEW IF EXISTS {view}")  # never leave an older version's view behind
            hint = (
                " (Spark's from_avro is not loaded: build the session with delta_log.spark.get_spark, "
                "or add the spark.avro_package coordinates to --packages)"
                if "AVRO_NOT_LOADED" in str(exc)
                else ""
            )
            log.warning("no typed view for topic %s%s: %s", topic, hint, str(exc)[:500])
            continue
        views[topic] = f"{typed_db}.{name}"
    return views
