"""`topiclake sql-server`: Spark's Thrift JDBC/ODBC endpoint on the catalog, reached by Hive's own
JDBC client (beeline, from the jars pyspark ships) and by a Python DB-API client (PyHive, what
Superset uses), with the API keys as logins and their topic ACLs deciding what each sees."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pyspark
import pytest
from pyhive import hive

from tests.e2e.server import REPO, ServerProcess, free_port, stop_process

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

KEYS = """
[[auth.api_keys]]
key = "admin-secret-key"
principal = "admin"
acls = { "*" = ["admin"] }
groups = { "*" = ["admin"] }

[[auth.api_keys]]
key = "orders-only-key"
principal = "analyst"
acls = { "orders-*" = ["consume", "describe"] }
"""
ADMIN = {"Authorization": "Bearer admin-secret-key"}
BEELINE = Path(pyspark.__file__).parent / "bin" / "beeline"
QUIET = ("--silent=true", "--outputformat=csv2")


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    base = tmp_path_factory.mktemp("sqlendpoint")
    root = base / "data"
    config = base / "keys.toml"
    config.write_text(KEYS)
    env = {"TOPICLAKE_CONFIG": str(config)}
    gateway = ServerProcess(root, env=env).start()
    http = httpx.Client(base_url=gateway.url, timeout=30, headers=ADMIN)
    for name, partitions in (("orders-1", 3), ("secret", 1)):  # orders-1 is the table topics.orders_1
        assert http.post("/topics", json={"name": name, "partitions": partitions}).status_code == 201
    records = [{"value": f"v{i}", "partition": i % 3} for i in range(300)]
    assert http.post("/topics/orders-1/records", json={"records": records}).status_code == 200
    assert http.post("/topics/secret/records", json={"records": [{"value": "classified"}]}).status_code == 200

    port = free_port()
    log = open(base / "sql-server.log", "ab")
    proc = subprocess.Popen(
        [sys.executable, "-m", "topiclake", "sql-server", "--root", str(root), "--port", str(port)],
        cwd=REPO,
        env={**os.environ, **env, "TOPICLAKE_CATALOG__ENABLED": "true", "PYTHONPATH": str(REPO)},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            assert proc.poll() is None, (base / "sql-server.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "the SQL endpoint did not listen within 240 s"
            if "topiclake SQL endpoint:" in (base / "sql-server.log").read_text(errors="replace"):
                break
            time.sleep(0.5)
        yield port, http, root
    finally:  # also when it never listened: its JVM and the gateway are stopped by their ids
        stop_process(proc, timeout=60)
        log.close()
        http.close()
        gateway.stop()


def beeline(port: int, user: str, password: str, sql: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BEELINE), "-u", f"jdbc:hive2://127.0.0.1:{port}/default", "-n", user, "-p", password, *QUIET, "-e", sql],
        capture_output=True,
        text=True,
        timeout=180,
    )


def lines(out: str) -> list[str]:
    """beeline's csv2 output without its prompt ("0: jdbc:hive2://...> ")."""
    return [line.rsplit("> ", 1)[-1].strip() for line in out.splitlines() if line.rsplit("> ", 1)[-1].strip()]


def analyst(port: int, configuration: dict[str, str] | None = None) -> hive.Cursor:
    """A PyHive cursor logged in with the `orders-*` key (`configuration`: the session's settings,
    as a JDBC URL gives them)."""
    return hive.connect(
        host="127.0.0.1",
        port=port,
        username="analyst",
        password="orders-only-key",
        auth="CUSTOM",
        configuration=configuration,
    ).cursor()


def test_beeline_answers_a_group_by_for_a_key_and_refuses_what_it_may_not_read(endpoint):
    port, _, _ = endpoint
    done = beeline(
        port,
        "admin",
        "admin-secret-key",
        "SELECT partition, count(*) AS n FROM topics.orders_1 GROUP BY partition ORDER BY partition",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert lines(done.stdout) == ["partition,n", "0,100", "1,100", "2,100"]
    system = beeline(port, "admin", "admin-secret-key", "SELECT sum(high_watermark) AS n FROM topics._partitions")
    assert system.returncode == 0 and lines(system.stdout) == ["n", "301"], system.stderr[-3000:]

    shown = beeline(port, "analyst", "orders-only-key", "SHOW TABLES IN topics")
    assert shown.returncode == 0, shown.stderr[-3000:]
    assert "orders_1" in shown.stdout and "secret" not in shown.stdout  # never shown

    refused = beeline(port, "analyst", "orders-only-key", "SELECT * FROM topics.secret")
    assert refused.returncode != 0 and "TABLE_OR_VIEW_NOT_FOUND" in refused.stdout + refused.stderr
    assert "classified" not in refused.stdout + refused.stderr

    wrong = beeline(port, "analyst", "not-the-key", "SELECT 1")
    assert wrong.returncode != 0 and "Error validating the login" in wrong.stdout + wrong.stderr
    impostor = beeline(port, "admin", "orders-only-key", "SELECT 1")  # a key is its own principal's
    assert impostor.returncode != 0 and "Error validating the login" in impostor.stdout + impostor.stderr


def test_pyhive_queries_and_the_endpoint_is_read_only(endpoint):
    port, _, root = endpoint
    cur = analyst(port)
    cur.execute("SELECT count(*), min(offset), max(offset) FROM topics.orders_1 WHERE partition = 1")
    assert cur.fetchall() == [(100, 0, 99)]
    for sql, words in (
        ("SELECT * FROM topics.secret", "TABLE_OR_VIEW_NOT_FOUND"),
        # every topic's offsets and every group's lag need describe on all of them
        ("SELECT * FROM topics._partitions", "TABLE_OR_VIEW_NOT_FOUND"),
        ("SELECT * FROM topics._consumer_lag", "TABLE_OR_VIEW_NOT_FOUND"),
        ("INSERT INTO topics.orders_1 SELECT * FROM topics.orders_1", "answers queries only"),
        ("DROP TABLE topics.orders_1", "answers queries only"),
        ("SELECT reflect('java.lang.System', 'getenv', 'HOME')", "reflect and java_method are refused"),
        (f"SELECT * FROM parquet.`{root}/topics/secret`", "not one of them"),  # its files, by path
        # a readable table's folder, then up and into another's (or out of the root)
        (f"SELECT * FROM delta.`{root}/topics/orders-1/../secret`", "not one of them"),
        (f"SELECT * FROM parquet.`{root}/topics/orders-1/../secret`", "not one of them"),
        (f"SELECT * FROM text.`{root}/topics/orders-1/../../../keys.toml`", "not one of them"),
    ):
        with pytest.raises(hive.OperationalError) as refused:
            cur.execute(sql)
        assert words in str(refused.value), (sql, str(refused.value)[-700:])
    cur.execute("SELECT count(*) FROM topics.orders_1")
    assert cur.fetchall() == [(300,)]  # nothing was written
    cur.execute(f"SELECT count(*) FROM delta.`{root}/topics/orders-1`")  # a table it may read, by path
    assert cur.fetchall() == [(300,)]
    for sql, words in (
        ("SET spark.sql.variable.substitute=true", "is refused"),
        (
            "SET spark.sql.catalog.other=org.apache.spark.sql.execution.datasources.v2.jdbc.JDBCTableCatalog",
            "is refused",
        ),
        (f"DESCRIBE delta.`{root}/topics/secret`", "not one of them"),  # its columns and configs, by path
        (f"SHOW TBLPROPERTIES delta.`{root}/topics/secret`", "not one of them"),
    ):
        with pytest.raises(hive.OperationalError) as refused:
            cur.execute(sql)
        assert words in str(refused.value), (sql, str(refused.value)[-700:])
    cur.execute("SET spark.sql.session.timeZone=UTC")  # what BI tools set is allowed
    cur.execute("SELECT '${env:HOME}', '${spark:spark.app.name}'")
    assert cur.fetchall() == [("${env:HOME}", "${spark:spark.app.name}")]  # no substitution: no secrets
    # not even when the session asks for it in its JDBC settings (hiveconf: in a URL)
    sneaky = analyst(port, {"set:hiveconf:spark.sql.variable.substitute": "true"})
    sneaky.execute("SELECT '${env:HOME}'")
    assert sneaky.fetchall() == [("${env:HOME}",)]
    # nor a catalog plugin (it would open a JDBC URL of the user's at the first name it resolves):
    # settings the URL gives a session are put back before its first statement
    plugin = "org.apache.spark.sql.execution.datasources.v2.jdbc.JDBCTableCatalog"
    url_set = analyst(
        port,
        {"set:hiveconf:spark.sql.catalog.other": plugin, "set:hiveconf:spark.sql.session.timeZone": "Europe/Paris"},
    )
    url_set.execute("SET spark.sql.catalog.other")
    assert plugin not in str(url_set.fetchall())
    # nor when the URL also names a database of that catalog (the server runs its USE as the session
    # opens, before it names the user): the catalog would open its JDBC URL, creating this folder
    probe = root.parent / "probe-derby"
    with contextlib.suppress(Exception):
        analyst(
            port,
            {
                "use:database": "other.ns",
                "set:hiveconf:spark.sql.catalog.other": plugin,
                "set:hiveconf:spark.sql.catalog.other.url": f"jdbc:derby:{probe};create=true",
            },
        ).execute("SELECT 1")
    assert not probe.exists()
    url_set.execute("SET spark.sql.session.timeZone")  # what a user may SET stays as the URL set it
    assert url_set.fetchall() == [("spark.sql.session.timeZone", "Europe/Paris")]
    with pytest.raises(Exception, match="Error validating the login"):
        hive.connect(host="127.0.0.1", port=port, username="analyst", password="nope", auth="CUSTOM")


def test_a_new_topic_reaches_the_endpoint_with_its_acl(endpoint):
    port, http, _ = endpoint
    assert http.post("/topics", json={"name": "orders-late", "partitions": 1}).status_code == 201
    assert http.post("/topics/orders-late/records", json={"records": [{"value": "x"}] * 5}).status_code == 200
    cur = analyst(port)
    deadline = time.monotonic() + 60
    while True:
        cur.execute("SHOW TABLES IN topics")
        if "orders_late" in {r[1] for r in cur.fetchall()}:
            break
        assert time.monotonic() < deadline, "orders-late did not reach the catalog within 60 s"
        time.sleep(1)
    cur.execute("SELECT count(*) FROM topics.orders_late")
    assert cur.fetchall() == [(5,)]
