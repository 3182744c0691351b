"""Pure rules of the lakehouse face: table names in the catalog, what each key may read on the SQL
endpoint, and which record per key an upsert table keeps."""

from __future__ import annotations

import pyarrow as pa
import pytest

from conf import load_settings
from delta_log.core.topic_config import validate_config
from delta_log.errors import InvalidConfigError
from delta_log.maintenance.upsert import latest_per_key
from delta_log.spark.catalog import topic_tables, upsert_table_names
from sql_endpoint.server import grants


def test_topic_tables_never_let_two_topics_share_a_name():
    tables = topic_tables(["orders-eu", "orders.eu", "Orders_EU", "plain"])
    assert tables["plain"] == "plain"
    assert len({n.lower() for n in tables.values()}) == 4  # case-insensitive, as Spark's catalog
    assert sorted(tables.values(), key=str.lower)[0].lower().startswith("orders_eu")


def test_grants_follow_each_keys_topic_acls():
    settings = load_settings(
        root="/data",
        auth={
            "api_keys": [
                {"key": "a", "principal": "admin", "acls": {"*": ["admin"]}, "groups": {"*": ["admin"]}},
                {"key": "o", "principal": "analyst", "acls": {"orders-*": ["consume"]}},
                {"key": "d", "principal": "ops", "acls": {"*": ["describe"]}, "groups": {}},
                {"key": "x1", "principal": "twice", "acls": {"*": ["admin"]}, "groups": {"*": ["admin"]}},
                {"key": "x2", "principal": "twice", "acls": {"a": ["consume"]}},
                {"key": "k", "principal": "admin@partner", "acls": {"orders-*": ["consume"]}},
            ]
        },
    )
    g = grants(settings, {"orders-1": "orders_1", "secret": "secret"}, {"orders-1": "orders_1_latest"})
    assert g.admins == {"admin"}
    assert g.tables["analyst"] == {"topics.orders_1", "topics_typed.orders_1", "topics.orders_1_latest"}
    assert g.folders["analyst"] == ["/data/topics/orders-1", "/data/latest/orders-1"]
    assert g.tables["ops"] == {"topics._partitions"}  # describe: no topic data; no group rights: no lag
    # a principal with two keys, or one Hive would shorten to another name, cannot log in at all
    assert "twice" not in g.admins | set(g.tables) and "admin@partner" not in g.tables
    # no upsert table: no grant for a name another topic may hold (topic "orders-1.latest" is orders_1_latest)
    assert "topics.orders_1_latest" not in grants(settings, {"orders-1": "orders_1"}).tables["analyst"]


def test_latest_per_key_keeps_the_last_offset_within_a_partition_and_the_newest_time_across():
    ts = pa.timestamp("us", tz="UTC")
    records = pa.table(
        {
            "key": pa.array([b"a", b"b", b"a", b"a", b"c"], pa.binary()),
            "value": pa.array([b"1", b"1", b"2", b"3", None], pa.binary()),
            "partition": pa.array([0, 0, 0, 1, 1], pa.int32()),
            "offset": pa.array([0, 1, 2, 0, 1], pa.int64()),
            "timestamp": pa.array([10, 11, 30, 20, 40], ts),
        }
    )
    rows = {r["key"]: (r["value"], r["partition"], r["offset"]) for r in latest_per_key(records).to_pylist()}
    # a's newest is partition 0's offset 2 (time 30), not partition 1's (time 20)
    assert rows == {b"a": (b"2", 0, 2), b"b": (b"1", 0, 1), b"c": (None, 1, 1)}


def test_table_mode_is_log_or_upsert():
    assert validate_config({"topiclake.table.mode": "upsert"})["topiclake.table.mode"] == "upsert"
    with pytest.raises(InvalidConfigError, match="log or upsert"):
        validate_config({"topiclake.table.mode": "latest"})


def test_an_upsert_table_never_takes_a_topic_tables_name():
    tables = topic_tables(["pay", "pay-latest", "orders"])  # pay_latest is the topic pay-latest's
    assert upsert_table_names(["pay@latest", "orders@latest", "gone@latest"], tables) == {"orders": "orders_latest"}
