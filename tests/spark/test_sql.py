"""Topics as SQL tables; lag view numbers equal the consumer API's."""

import httpx

from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicWriter
from delta_log.spark import register_topics
from tests.e2e.server import ServerProcess
from tests.integration.conftest import make_batch


def test_topics_partitions_time_travel_and_lag(spark, tmp_path):
    root = str(tmp_path / "root")
    storage = StorageRoot(root)
    settings = load_settings(root=root)
    Catalog(storage, settings.writer).create_topic("sql-orders", partitions=2)
    w = TopicWriter(storage, "sql-orders", settings.writer)
    w.append(make_batch(10, partitions=2, topic="sql-orders"))
    w.append(make_batch(10, partitions=2, topic="sql-orders"))
    srv = ServerProcess(tmp_path / "root").start()
    try:
        c = httpx.Client(base_url=srv.url)
        c.post(
            "/groups/billing/offsets/reset",
            json={"topic": "sql-orders", "to": "offset", "offset": 3, "partitions": [0]},
        ).raise_for_status()
        c.post(
            "/groups/billing/offsets/reset", json={"topic": "sql-orders", "to": "earliest", "partitions": [1]}
        ).raise_for_status()
        api = {(x["topic"], x["partition"]): x["lag"] for x in c.get("/groups/billing").json()["lag"]}
    finally:
        srv.stop()
    assert register_topics(spark, root) == {"sql-orders": "sql_orders"}
    assert spark.sql("SELECT count(*) AS n FROM topics.sql_orders").first().n == 20
    assert spark.sql("SELECT count(*) AS n FROM topics.sql_orders VERSION AS OF 1").first().n == 10
    parts = {
        r.partition: (r.log_start_offset, r.high_watermark)
        for r in spark.sql("SELECT * FROM topics._partitions").collect()
    }
    assert parts == {0: (0, 10), 1: (0, 10)}
    lag = {
        (r.topic, r.partition): r.lag
        for r in spark.sql("SELECT * FROM topics._consumer_lag WHERE `group` = 'billing'").collect()
    }
    assert lag == {("sql-orders", 0): 7, ("sql-orders", 1): 10}
    assert lag == api  # the SQL view and the consumer API agree


def test_typed_views_show_the_values_fields_as_columns(spark, tmp_path):
    import json

    from delta_log.core.value_schemas import parse_schema
    from delta_log.system.schemas import SchemaStore

    root = str(tmp_path / "root")
    storage = StorageRoot(root)
    settings = load_settings(root=root)
    catalog = Catalog(storage, settings.writer)
    for name in ("typed-orders", "plain"):
        catalog.create_topic(name, partitions=1)
    schema = {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "total": {"type": "number"},
            "offset": {"type": "string"},  # named like a Kafka column: shown as value_offset
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }
    v1 = SchemaStore(storage).register("typed-orders-value", parse_schema("JSON", json.dumps(schema)))
    values = [
        json.dumps({"id": 1, "total": 9.5, "offset": "x", "tags": ["a"]}).encode(),
        b"\0" + v1.schema_id.to_bytes(4, "big") + json.dumps({"id": 2, "total": 0.5}).encode(),  # framed
        None,  # a tombstone
    ]
    write_values(storage, "typed-orders", values)
    tables = register_topics(spark, root, database="typedsql")
    assert tables == {"plain": "plain", "typed-orders": "typed_orders"}
    views = {r.viewName for r in spark.sql("SHOW VIEWS IN typedsql_typed").collect() if not r.isTemporary}
    assert views == {"typed_orders"}  # only topics with a (JSON Schema) value schema
    rows = spark.sql("SELECT offset, id, total, value_offset, tags FROM typedsql_typed.typed_orders ORDER BY offset")
    assert [tuple(r) for r in rows.collect()] == [
        (0, 1, 9.5, "x", ["a"]),
        (1, 2, 0.5, None, None),
        (2, None, None, None, None),
    ]
    fields = {f.name: f.dataType.simpleString() for f in spark.table("typedsql_typed.typed_orders").schema.fields}
    assert fields["id"] == "bigint" and fields["total"] == "double" and fields["partition"] == "int"
    assert spark.sql("SELECT sum(total) AS s FROM typedsql_typed.typed_orders").first().s == 10.0


def test_the_source_returns_parsed_values_with_parse_values(spark, tmp_path):
    import json

    import pytest

    from delta_log.core.value_schemas import parse_schema
    from delta_log.system.schemas import SchemaStore

    root = str(tmp_path / "root")
    storage = StorageRoot(root)
    settings = load_settings(root=root)
    for name in ("events", "untyped"):
        Catalog(storage, settings.writer).create_topic(name, partitions=1)
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "at": {"type": "string", "format": "date-time"}, "o": {}},
    }
    SchemaStore(storage).register("events-value", parse_schema("JSON", json.dumps(schema)))
    values = [b'{"n": 1, "at": "2026-11-23T10:00:00Z", "o": {"k": [1]}}', b'{"n": 2.5}', b"\0\0\0\0\1" + b'{"n": 3}']
    write_values(storage, "events", values)

    def source(topic):
        return (
            spark.read.format("topiclake")
            .option("root", root)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("parseValues", "true")
        )

    df = source("events").load()
    assert df.schema["value_parsed"].dataType.simpleString() == "struct<n:bigint,at:timestamp,o:string>"
    assert df.columns[:7] == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType"]
    rows = df.selectExpr(
        "offset", "value_parsed.n AS n", "CAST(value_parsed.at AS STRING) AS at", "value_parsed.o AS o"
    )
    got = sorted(tuple(r) for r in rows.collect())
    assert got[0][:2] == (0, 1) and got[0][2].startswith("2026-11-23") and got[0][3] == '{"k":[1]}'
    assert got[1:] == [(1, None, None, None), (2, 3, None, None)]  # 2.5 is no integer: null, as from_json
    with pytest.raises(Exception, match="parseValues needs a value schema"):
        source("untyped").load()


def framed(schema, schema_id, record):
    """An Avro value as Confluent's serializers write it: byte 0, the 4-byte schema id, the binary."""
    import io

    import fastavro

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(schema), record)
    return b"\0" + schema_id.to_bytes(4, "big") + buf.getvalue()


def test_parse_values_reads_avro_by_each_values_schema_id(spark, tmp_path):
    import json

    from delta_log.core.value_schemas import parse_schema
    from delta_log.system.schemas import SchemaStore

    root = str(tmp_path / "root")
    storage = StorageRoot(root)
    settings = load_settings(root=root)
    Catalog(storage, settings.writer).create_topic("orders", partitions=1)
    v1 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
    v2 = {
        **v1,
        "fields": [
            *v1["fields"],
            {"name": "currency", "type": "string", "default": "EUR"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 0},
            {"name": "tags", "type": {"type": "map", "values": "int"}, "default": {}},
        ],
    }
    store = SchemaStore(storage)
    ids = [store.register("orders-value", parse_schema("AVRO", json.dumps(v))).schema_id for v in (v1, v2)]

    values = [
        framed(v1, ids[0], {"id": 1}),  # an older version: read with v2's defaults
        framed(v2, ids[1], {"id": 2, "currency": "USD", "at": 1_700_000_000_000, "tags": {"a": 1}}),
        b"\0\0\0\0\x63garbage",  # an id the subject does not have: null
    ]
    write_values(storage, "orders", values)
    df = (
        spark.read.format("topiclake")
        .option("root", root)
        .option("subscribe", "orders")
        .option("startingOffsets", "earliest")
        .option("parseValues", "true")
        .load()
    )
    assert (
        df.schema["value_parsed"].dataType.simpleString()
        == "struct<id:bigint,currency:string,at:timestamp,tags:map<string,int>>"
    )
    rows = df.orderBy("offset").selectExpr(
        "value_parsed.id", "value_parsed.currency", "unix_millis(value_parsed.at) AS at", "value_parsed.tags"
    )
    assert [tuple(r) for r in rows.collect()] == [
        (1, "EUR", 0, {}),
        (2, "USD", 1_700_000_000_000, {"a": 1}),
        (None, None, None, None),
    ]


def test_avro_topics_get_typed_views_decoded_by_each_values_schema_id(spark, tmp_path):
    """topics_typed.<name> for an Avro topic: Spark's from_avro reads each framed value with the
    version its id names, resolved to the latest (defaults fill new fields); what does not decode,
    is not framed, or names an id the subject lacks reads null; the Kafka columns stay."""
    import json

    from delta_log.core.value_schemas import parse_schema
    from delta_log.system.schemas import SchemaStore

    root = str(tmp_path / "root")
    storage = StorageRoot(root)
    Catalog(storage, load_settings(root=root).writer).create_topic("avro-orders", partitions=1)
    v1 = {"type": "record", "name": "Order", "fields": [{"name": "id", "type": "long"}]}
    v2 = {
        **v1,
        "fields": [
            *v1["fields"],
            {"name": "currency", "type": {"type": "enum", "name": "Cur", "symbols": ["EUR", "USD"]}, "default": "EUR"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}, "default": 0},
            {"name": "tags", "type": {"type": "map", "values": "int"}, "default": {}},
            {"name": "partition", "type": ["null", "string"], "default": None},  # named like a Kafka column
            {"name": "note", "type": "string", "default": "${env:HOME} ${spark.app.name}", "doc": "${x}"},
        ],
    }
    store = SchemaStore(storage)
    ids = [store.register("avro-orders-value", parse_schema("AVRO", json.dumps(v))).schema_id for v in (v1, v2)]
    values = [
        framed(v1, ids[0], {"id": 1}),  # an older version: read with v2's defaults
        framed(
            v2,
            ids[1],
            {"id": 2, "currency": "USD", "at": 1_700_000_000_000, "tags": {"a": 1}, "partition": "x", "note": ""},
        ),
        b"\0\0\0\0\x63garbage",  # an id the subject does not have
        b"\0" + ids[1].to_bytes(4, "big") + b"\xff",  # a known id, a value that does not decode
        b'{"id": 5}',  # not framed
        None,  # a tombstone
    ]
    write_values(storage, "avro-orders", values)
    assert register_topics(spark, root, database="avrosql") == {"avro-orders": "avro_orders"}
    view = spark.table("avrosql_typed.avro_orders")
    assert view.columns[:8] == ["key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers"]
    types = {f.name: f.dataType.simpleString() for f in view.schema.fields[8:]}
    assert types == {
        "id": "bigint",
        "currency": "string",
        "at": "timestamp",
        "tags": "map<string,int>",
        "value_partition": "string",
        "note": "string",
    }
    rows = spark.sql(
        "SELECT offset, partition, id, currency, unix_millis(at), tags, value_partition "
        "FROM avrosql_typed.avro_orders ORDER BY offset"
    ).collect()
    assert [tuple(r) for r in rows] == [
        (0, 0, 1, "EUR", 0, {}, None),
        (1, 0, 2, "USD", 1_700_000_000_000, {"a": 1}, "x"),
        (2, 0, None, None, None, None, None),
        (3, 0, None, None, None, None, None),
        (4, 0, None, None, None, None, None),
        (5, 0, None, None, None, None, None),
    ]
    assert spark.sql("SELECT count(*) AS n FROM avrosql_typed.avro_orders WHERE currency = 'USD'").first().n == 1
    # Spark substitutes ${...} in SQL text: a schema's text must reach from_avro as it is, never a
    # conf value or an environment variable
    assert spark.sql("SELECT note FROM avrosql_typed.avro_orders WHERE offset = 0").first().note == (
        "${env:HOME} ${spark.app.name}"
    )


def write_values(storage, topic, values):
    """Append raw values to partition 0 of a one-partition topic."""
    import time

    import pyarrow as pa

    from delta_log import normalize_batch

    table = pa.table({"value": pa.array(values, pa.binary()), "partition": pa.array([0] * len(values), pa.int32())})
    batch = normalize_batch(
        table,
        partitions=1,
        topic=topic,
        max_message_bytes=1_000_000,
        now_us=int(time.time() * 1e6),
        log_append_time=True,
    )
    TopicWriter(storage, topic, load_settings(root=storage.root).writer).append(batch)


def test_the_sql_command_lists_and_queries_typed_views(tmp_path):
    """`topiclake sql` as the README runs it: its own Spark session (with from_avro), the listing
    names the typed views, and a query over an Avro topic's view answers."""
    import json
    import subprocess
    import sys

    from delta_log.core.value_schemas import parse_schema
    from delta_log.system.schemas import SchemaStore

    root = str(tmp_path / "root")
    storage = StorageRoot(root)
    Catalog(storage, load_settings(root=root).writer).create_topic("pay-ments", partitions=1)
    schema = {"type": "record", "name": "P", "fields": [{"name": "amount", "type": "double"}]}
    sid = SchemaStore(storage).register("pay-ments-value", parse_schema("AVRO", json.dumps(schema))).schema_id
    write_values(storage, "pay-ments", [framed(schema, sid, {"amount": a}) for a in (1.5, 2.0)])

    def sql(*query):
        r = subprocess.run(
            [sys.executable, "-m", "topiclake", "sql", "--root", root, *query],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert r.returncode == 0, r.stderr[-2000:]
        return r.stdout

    assert "topics_typed.pay_ments" in sql()
    assert "|3.5  |" in sql("SELECT sum(amount) AS total FROM topics_typed.pay_ments")
