"""The SQL endpoint against `topiclake sql`: the same queries over a 1M-record topic.

    python -m bench.sql_endpoint_bench            # 1,000,000 records, 20 queries each
    python -m bench.sql_endpoint_bench --quick    # 200,000 records, 10 queries each

A fresh root with one 4-partition topic of 100 B records (appended in this process), then:
- `topiclake sql-server` started (time until it answers), and through it, by PyHive (a DB-API
  client, as BI tools connect), `SELECT count(*)` and a GROUP BY repeated: p50 / p99 per query;
- `topiclake sql "<the same query>"` from the shell, as before the endpoint: a Spark session per
  query (each run twice: p50 and max).
Results: bench/results/sql_endpoint_bench.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyhive import hive

from bench.common import percentile, print_table, write_results
from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicWriter, normalize_batch
from tests.e2e.server import REPO, free_port, stop_process

COUNT = "SELECT count(*) FROM topics.clicks"
GROUP_BY = "SELECT partition, count(*), max(offset) FROM topics.clicks GROUP BY partition ORDER BY partition"


def populate(root: Path, n: int) -> None:
    settings = load_settings(root=str(root))
    storage = StorageRoot(settings.root)
    Catalog(storage, settings.writer).create_topic("clicks", partitions=4)
    writer = TopicWriter(storage, "clicks", settings.writer)
    for start in range(0, n, 100_000):
        size = min(100_000, n - start)
        writer.append(
            normalize_batch(
                pa.table(
                    {
                        "value": pa.array([b"x" * 100] * size, pa.binary()),
                        "partition": pa.array([i % 4 for i in range(size)], pa.int32()),
                    }
                ),
                partitions=4,
                topic="clicks",
                max_message_bytes=10**6,
                now_us=int(time.time() * 1e6),
                log_append_time=False,
            )
        )


def timed_queries(cursor: Any, sql: str, repeats: int) -> dict[str, float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        cursor.execute(sql)
        cursor.fetchall()
        times.append((time.perf_counter() - t) * 1000)
    return {"p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99), "queries": repeats}


def endpoint_queries(
    work: Path, env: dict[str, str], port: int, n: int, repeats: int, rows: list[dict[str, Any]]
) -> float:
    """Start the endpoint, time the queries through it (rows), stop it; returns its start time (s)."""
    started = time.perf_counter()
    with open(work / "sql-server.log", "ab") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", "topiclake", "sql-server", "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            while "topiclake SQL endpoint:" not in (work / "sql-server.log").read_text(errors="replace"):
                if server.poll() is not None:
                    raise RuntimeError((work / "sql-server.log").read_text()[-3000:])
                time.sleep(0.2)
            ready_s = time.perf_counter() - started
            cursor = hive.connect(host="127.0.0.1", port=port).cursor()
            cursor.execute(COUNT)
            assert cursor.fetchall() == [(n,)]
            for name, sql in (("COUNT(*)", COUNT), ("GROUP BY", GROUP_BY)):
                rows.append({"way": "SQL endpoint (PyHive)", "query": name, **timed_queries(cursor, sql, repeats)})
        finally:
            stop_process(server, timeout=60)
    return ready_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench.sql_endpoint_bench", description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    n, repeats, cli_runs = (200_000, 10, 1) if args.quick else (1_000_000, 20, 2)
    work = Path(tempfile.mkdtemp(prefix="topiclake-sql-bench-", dir=os.environ.get("BENCH_TMP")))
    env = {**os.environ, "TOPICLAKE_ROOT": str(work / "data"), "TOPICLAKE_CATALOG__ENABLED": "true"}
    env["PYTHONPATH"] = str(REPO)
    rows: list[dict[str, Any]] = []
    try:
        populate(work / "data", n)
        port = free_port()
        ready_s = endpoint_queries(work, env, port, n, repeats, rows)
        for name, sql, expect in (("COUNT(*)", COUNT, str(n)), ("GROUP BY", GROUP_BY, str(n // 4 - 1))):
            cli = []
            for _ in range(cli_runs):
                t = time.perf_counter()
                done = subprocess.run(
                    [sys.executable, "-m", "topiclake", "sql", sql], cwd=REPO, env=env, capture_output=True, text=True
                )
                assert done.returncode == 0 and expect in done.stdout, done.stderr[-2000:]
                cli.append((time.perf_counter() - t) * 1000)
            rows.append(
                {
                    "way": "topiclake sql (a session a query)",
                    "query": name,
                    "p50_ms": percentile(cli, 50),
                    "p99_ms": max(cli),
                    "queries": cli_runs,
                }
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"records: {n:,}; the endpoint answered {ready_s:.1f} s after its start")
    print_table(rows, ["way", "query", "p50_ms", "p99_ms", "queries"])
    write_results("sql_endpoint_bench", rows, {"records": n, "endpoint_start_s": round(ready_s, 1)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
