"""The upsert job as users run it: scheduled by `topiclake serve` beside live producers, and killed
with SIGKILL mid-MERGE; `<topic>_latest` always ends with exactly the latest value per key."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import httpx
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicWriter
from tests.e2e.server import REPO, ServerProcess
from tests.integration.test_upsert import batch, model

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def latest(root, topic, columns=("key", "value")):
    t = DeltaTable(StorageRoot(str(root)).latest_uri(topic)).to_pyarrow_table(columns=list(columns))
    rows = t.to_pylist()
    assert len({r["key"] for r in rows}) == len(rows), "a key with two rows"
    return rows


def test_scheduled_job_keeps_up_with_live_producers_and_typed_columns(tmp_path):
    root = tmp_path / "data"
    env = {"TOPICLAKE_JOBS__SCHEDULE": "true", "TOPICLAKE_JOBS__UPSERT_INTERVAL_S": "1"}
    srv = ServerProcess(root, env=env).start()
    try:
        with httpx.Client(base_url=srv.url, timeout=30) as http:
            schema = {
                "type": "object",
                "properties": {"name": {"type": "string"}, "visits": {"type": "integer"}},
                "additionalProperties": False,
            }
            r = http.post(
                "/registry/subjects/profiles-value/versions", json={"schema": json.dumps(schema), "schemaType": "JSON"}
            )
            assert r.status_code == 200, r.text
            r = http.post(
                "/topics", json={"name": "profiles", "partitions": 2, "config": {"topiclake.table.mode": "upsert"}}
            )
            assert r.status_code == 201, r.text
            rng = random.Random(3)
            log: dict[int, list] = {}
            for _ in range(30):  # produced while the scheduler merges every second
                records = []
                for _ in range(40):
                    key = f"user-{rng.randrange(50)}"
                    value = None if rng.random() < 0.1 else {"name": key.upper(), "visits": rng.randrange(1000)}
                    records.append({"key": key, "value": value})
                r = http.post("/topics/profiles/records", json={"records": records})
                assert r.status_code == 200, r.text
                for rec, placed in zip(records, r.json()["offsets"], strict=True):
                    log.setdefault(placed["partition"], []).append(
                        (rec["key"].encode(), None if rec["value"] is None else json.dumps(rec["value"]))
                    )
                time.sleep(0.05)
            deadline = time.monotonic() + 90
            while True:
                lag = [
                    ln for ln in http.get("/metrics").text.splitlines() if ln.startswith("topiclake_upsert_lag_records")
                ]
                if lag and lag[0].endswith(" 0"):
                    break
                assert time.monotonic() < deadline, f"the upsert job did not catch up: {lag}"
                time.sleep(0.5)
            group = http.get("/groups/topiclake-upsert").json()  # its progress, as a consumer group's
            assert group["group"] == "topiclake-upsert" or group.get("group_id") == "topiclake-upsert"
    finally:
        srv.stop()
    expected = {}
    for entries in log.values():
        expected |= model(entries)
    rows = latest(root, "profiles", ("key", "value", "name", "visits"))
    assert {r["key"]: json.loads(r["value"]) for r in rows} == {k: json.loads(v) for k, v in expected.items()}
    for r in rows:  # the value's fields as typed columns
        assert r["name"] == json.loads(r["value"])["name"] and r["visits"] == json.loads(r["value"])["visits"]


def test_kill_9_mid_merge_then_restart_loses_nothing_and_duplicates_nothing(tmp_path):
    root = tmp_path / "data"
    settings = load_settings(root=str(root))
    storage = StorageRoot(settings.root)
    Catalog(storage, settings.writer).create_topic("accounts", partitions=2, config={"topiclake.table.mode": "upsert"})
    writer = TopicWriter(storage, "accounts", settings.writer)
    rng = random.Random(11)
    logs: dict[int, list] = {0: [], 1: []}
    for _ in range(60):
        recs = []
        for _ in range(2000):
            key = b"acct-%d" % rng.randrange(3000)
            p = key[-1] % 2
            recs.append((p, key, None if rng.random() < 0.05 else b"%d" % rng.randrange(10**9)))
        writer.append(batch("accounts", 2, recs))
        for p, k, v in recs:
            logs[p].append((k, v))
    env = {
        **os.environ,
        "TOPICLAKE_ROOT": str(root),
        "TOPICLAKE_JOBS__UPSERT_MAX_RECORDS": "1000",
        "PYTHONPATH": str(REPO),
    }
    run = [sys.executable, "-m", "jobs.upsert", "--local"]
    log_dir = root / "latest" / "accounts" / "_delta_log"

    def commits() -> int:
        return len(list(log_dir.glob("*.json"))) if log_dir.exists() else 0

    kills = 0
    for _ in range(5):
        proc = subprocess.Popen(run, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        before, deadline = commits(), time.monotonic() + 120
        while commits() <= before and proc.poll() is None:  # this run has committed a MERGE of its own
            assert time.monotonic() < deadline, "the job committed nothing within 120 s"
            time.sleep(0.01)
        time.sleep(rng.uniform(0, 0.15))  # then die somewhere in the next MERGE: reading, writing or committing
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait(30)
    assert kills >= 3, "the job finished before it could be killed: give it more records"
    assert commits() > 5  # every killed run had committed before it died
    for _ in range(5):  # a run makes at most 100 MERGEs of upsert_max_records: again until caught up
        done = subprocess.run(run, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        if "lag 0" in done.stdout + done.stderr:
            break
    else:
        raise AssertionError(f"the job did not catch up: {done.stdout[-2000:]}")
    expected = model(logs[0]) | model(logs[1])
    assert {r["key"]: r["value"] for r in latest(root, "accounts")} == expected
    dt = DeltaTable(storage.latest_uri("accounts"))
    assert {p: dt.transaction_version(f"upsert-{p}") for p in (0, 1)} == {0: len(logs[0]), 1: len(logs[1])}
    # the change feed: each key's inserts and deletes alternate, so no merge was applied twice
    cdf = pa.table(dt.load_cdf(starting_version=0).read_all()).select(["key", "_change_type", "_commit_version"])
    state: dict[bytes, bool] = {}
    for r in sorted(cdf.to_pylist(), key=lambda r: r["_commit_version"]):
        if r["_change_type"] == "insert":
            assert not state.get(r["key"]), f"{r['key']} inserted twice"
            state[r["key"]] = True
        elif r["_change_type"] == "delete":
            assert state.get(r["key"]), f"{r['key']} deleted while absent"
            state[r["key"]] = False
    assert {k for k, present in state.items() if present} == set(expected)
