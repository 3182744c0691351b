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
