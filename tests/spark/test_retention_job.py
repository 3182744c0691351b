"""jobs/retention.py on Spark (topics spread over executors) and from the CLI without Spark."""

import json
import subprocess
import sys
import time

from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicReader, TopicWriter
from jobs import retention
from tests.e2e.server import REPO
from tests.integration.test_retention import old_batch


def make(root, name, hours_old):
    settings = load_settings(root=root)
    storage = StorageRoot(root)
    Catalog(storage, settings.writer).create_topic(name, config={"retention.ms": 60_000})
    w = TopicWriter(storage, name, settings.writer)
    now = int(time.time() * 1000)
    for _ in range(3):
        w.append(old_batch(10, now - hours_old * 3_600_000, name))
    w.append(old_batch(10, now, name))
    return settings, storage


def test_retention_job_on_spark(spark, tmp_path):
    root = str(tmp_path / "root")
    settings, storage = make(root, "ret-a", 2)
    make(root, "ret-b", 5)
    report = retention.run(spark, settings)
    assert report.records_removed == 60
    assert {t["topic"]: t["records_removed"] for t in report.topics} == {"ret-a": 30, "ret-b": 30}
    assert TopicReader(storage, "ret-a").log_start_offset(0) == 30


def test_retention_cli_local(tmp_path):
    root = str(tmp_path / "root")
    make(root, "ret-c", 3)
    out = subprocess.run(
        [sys.executable, "-m", "topiclake", "jobs", "retention", "--root", root, "--local"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["records_removed"] == 30
