"""The catalog: topics made over HTTP are tables in Spark's Hive metastore, which brand-new
sessions (their own processes, made by get_spark) see with no call, and live sessions see change
within seconds: new topics, deleted and re-created ones, new schema versions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.server import REPO, ServerProcess

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


class Worker:
    """tests/e2e/spark_worker.py: a session in its own process."""

    def __init__(self, root: Path, log: Path, *, session: bool = True, env: dict[str, str] | None = None) -> None:
        env = {
            **os.environ,
            "TOPICLAKE_ROOT": str(root),
            "TOPICLAKE_CATALOG__ENABLED": "true",
            "PYTHONPATH": str(REPO),
            **(env or {}),
        }
        self.log = open(log, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.spark_worker", *([] if session else ["--no-session"])],
            cwd=REPO,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
        )
        self.ready = self._read()

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line, f"the worker exited: {Path(self.log.name).read_text()[-3000:]}"
        return json.loads(line)

    def ask(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        answer = self._read()
        assert "error" not in answer, answer["error"]
        return answer

    def rows(self, sql: str) -> list[list[Any]]:
        return self.ask(sql=sql)["rows"]

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        self.log.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("catalog") / "data"
    srv = ServerProcess(root).start()
    with httpx.Client(base_url=srv.url, timeout=30) as http:
        yield root, http
    srv.stop()


def _produce(http: httpx.Client, topic: str, values: list[Any], **extra: Any) -> None:
    r = http.post(f"/topics/{topic}/records", json={"records": [{"value": v, **extra} for v in values]})
    assert r.status_code == 200, r.text


def _properties(rows: list[list[Any]]) -> str:
    return next(r[1] for r in rows if r[0] == "Table Properties")


def test_new_sessions_see_topics_and_live_ones_see_changes(served, tmp_path):
    root, http = served
    assert http.post("/topics", json={"name": "orders-eu", "partitions": 2}).status_code == 201
    assert http.post("/topics", json={"name": "payments", "partitions": 1}).status_code == 201
    schema = {
        "type": "object",
        "properties": {"id": {"type": "integer"}, "item": {"type": "string"}},
        "additionalProperties": False,
    }
    r = http.post(
        "/registry/subjects/orders-eu-value/versions", json={"schema": json.dumps(schema), "schemaType": "JSON"}
    )
    assert r.status_code == 200, r.text
    _produce(http, "orders-eu", [{"id": i, "item": f"i{i % 3}"} for i in range(30)])

    # an upsert topic, merged once by its job
    r = http.post("/topics", json={"name": "profiles", "partitions": 1, "config": {"topiclake.table.mode": "upsert"}})
    assert r.status_code == 201, r.text
    profiles = [
        {"key": "a", "value": "1"},
        {"key": "b", "value": "1"},
        {"key": "a", "value": "2"},
        {"key": "b", "value": None},
    ]
    assert http.post("/topics/profiles/records", json={"records": profiles}).status_code == 200
    env = {**os.environ, "TOPICLAKE_ROOT": str(root), "PYTHONPATH": str(REPO)}
    job = subprocess.run(
        [sys.executable, "-m", "jobs.upsert", "--local"], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert job.returncode == 0, job.stderr[-3000:]

    # _partitions (so _consumer_lag) refreshed each second, not each 10 s: the same refresh, sooner
    worker = Worker(root, tmp_path / "worker1.log", env={"TOPICLAKE_CATALOG__PARTITIONS_REFRESH_S": "1"})
    try:
        # the upsert table, and its change feed, by name
        assert worker.rows("SELECT CAST(key AS STRING), CAST(value AS STRING) FROM topics.profiles_latest") == [
            ["a", '"2"']
        ]
        changes = worker.rows(
            "SELECT _change_type, CAST(key AS STRING) FROM table_changes('topics.profiles_latest', 0) "
            "WHERE _change_type != 'update_preimage' ORDER BY _commit_version, offset"
        )
        assert changes == [["insert", "a"]]  # one MERGE: a's last value inserted, b never kept
        # no register_topics: the session found them in the metastore, kept by the catalog sync
        tables = {r[1] for r in worker.rows("SHOW TABLES IN topics")}
        assert {"orders_eu", "payments", "_partitions", "_consumer_lag"} <= tables
        assert worker.rows("SELECT count(*) FROM topics.orders_eu") == [[30]]
        assert worker.rows("SELECT item, count(*) FROM topics_typed.orders_eu GROUP BY item ORDER BY item") == [
            ["i0", 10],
            ["i1", 10],
            ["i2", 10],
        ]
        assert worker.rows("SELECT sum(id) FROM topics_typed.orders_eu") == [[sum(range(30))]]
        described = worker.rows("DESCRIBE TABLE EXTENDED topics.orders_eu")
        assert "topiclake.partitions=2" in _properties(described)  # the topic's configs
        assert "topiclake.retention.ms=" in _properties(described)
        assert "value.subject=orders-eu-value" in _properties(described)  # its schema subject
        typed = _properties(worker.rows("DESCRIBE TABLE EXTENDED topics_typed.orders_eu"))
        assert "topiclake.value.subject=orders-eu-value" in typed and "topiclake.value.schema.type=JSON" in typed

        # while the session lives: a new topic, a new schema version, a deleted topic
        assert http.post("/topics", json={"name": "late.arrivals", "partitions": 3}).status_code == 201
        _produce(http, "late.arrivals", ["a", "b"])
        seen = worker.ask(until="SELECT count(*) FROM topics.late_arrivals", expect=[[2]], timeout=30)
        assert seen["rows"] == [[2]] and seen["seconds"] < 30
        assert http.post("/topics/late.arrivals/partitions", json={"count": 5}).status_code == 200
        added = worker.ask(
            until="SELECT count(*) FROM topics._partitions WHERE topic = 'late.arrivals'", expect=[[5]], timeout=30
        )
        assert added["rows"] == [[5]], added  # added partitions reach the catalog's _partitions
        # _consumer_lag follows new records (its high watermarks are refreshed while a session lives)
        commit = {"offsets": [{"topic": "late.arrivals", "partition": 0, "offset": 0}]}
        assert http.post("/groups/lag-readers/offsets", json=commit).status_code == 200
        _produce(http, "late.arrivals", ["c", "d", "e"], partition=0)
        latest = http.get("/topics/late.arrivals/offsets", params={"at": "latest"}).json()["partitions"]
        high_watermark = next(p["high_watermark"] for p in latest if p["partition"] == 0)
        assert high_watermark >= 3
        lagging = worker.ask(
            until="SELECT lag FROM topics._consumer_lag WHERE `group` = 'lag-readers' AND topic = 'late.arrivals'",
            expect=[[high_watermark]],
            timeout=60,
        )
        assert lagging["rows"] == [[high_watermark]], lagging
        schema["properties"]["qty"] = {"type": "integer"}
        r = http.post(
            "/registry/subjects/orders-eu-value/versions", json={"schema": json.dumps(schema), "schemaType": "JSON"}
        )
        assert r.status_code == 200, r.text
        _produce(http, "orders-eu", [{"id": 100, "item": "new", "qty": 7}])
        seen = worker.ask(until="SELECT sum(qty) FROM topics_typed.orders_eu", expect=[[7]], timeout=30)
        assert seen["rows"] == [[7]], seen
        assert http.delete("/topics/payments").status_code == 204
        gone = worker.ask(until="SHOW TABLES IN topics LIKE 'payments'", expect=[], timeout=30)
        assert gone["rows"] == [], gone
    finally:
        worker.close()

    # no session alive: delete and re-create with more partitions, then a brand-new session
    assert http.delete("/topics/orders-eu").status_code == 204
    assert http.post("/topics", json={"name": "orders-eu", "partitions": 5}).status_code == 201
    _produce(http, "orders-eu", [{"id": i, "item": "x"} for i in range(4)])  # the subject outlives the topic
    worker = Worker(root, tmp_path / "worker2.log")
    try:
        assert worker.rows("SELECT count(*), count(DISTINCT partition) >= 1 FROM topics.orders_eu") == [[4, True]]
        assert "topiclake.partitions=5" in _properties(worker.rows("DESCRIBE TABLE EXTENDED topics.orders_eu"))
        assert {r[1] for r in worker.rows("SHOW TABLES IN topics")} >= {"orders_eu", "late_arrivals"}
        assert "payments" not in {r[1] for r in worker.rows("SHOW TABLES IN topics")}
        parts = worker.rows("SELECT partition FROM topics._partitions WHERE topic = 'orders-eu' ORDER BY partition")
        assert parts == [[p] for p in range(5)]
    finally:
        worker.close()


def test_catalog_sync_reports_drift(served, tmp_path):
    root, http = served
    assert http.post("/topics", json={"name": "drifting", "partitions": 1}).status_code == 201
    # `topiclake catalog sync` three times, in one process that holds no session between the runs:
    # each run makes its session (get_spark) and stops it, so only the first starts a JVM
    sync = Worker(root, tmp_path / "cli.log", session=False)
    try:
        first = sync.ask(cli=["catalog", "sync"])
        assert first["returncode"] == 0, first["stderr"][-3000:]
        assert "topics.drifting" in json.loads(first["stdout"])["created"]
        # a topic deleted while no session ran: the next sync finds its table stale and drops it
        assert http.delete("/topics/drifting").status_code == 204
        second = sync.ask(cli=["catalog", "sync"])
        assert second["returncode"] == 0, second["stderr"][-3000:]
        report = json.loads(second["stdout"])
        assert report["drift"] is True and "topics.drifting" in report["dropped"], report
        assert "topics.drifting" not in report["created"]
        started = time.monotonic()
        third = sync.ask(cli=["catalog", "sync"])
        assert json.loads(third["stdout"])["drift"] is False, (third["stdout"], time.monotonic() - started)
    finally:
        sync.close()
