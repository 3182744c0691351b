"""A job on a real Spark standalone cluster (a master and a worker from pyspark's own scripts), via spark-submit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from conf import load_settings
from delta_log import Catalog, StorageRoot, TopicReader, TopicWriter
from tests.e2e.server import REPO, free_port
from tests.integration.conftest import make_batch

pytestmark = pytest.mark.slow


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if pred():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_compaction_job_runs_on_a_standalone_cluster(tmp_path):
    root = str(tmp_path / "root")
    settings = load_settings(root=root)
    storage = StorageRoot(root)
    for name in ("cl-a", "cl-b"):
        Catalog(storage, settings.writer).create_topic(name, partitions=2)
        w = TopicWriter(storage, name, settings.writer)
        for _ in range(12):
            w.append(make_batch(20, partitions=2, topic=name))
    before = {
        n: [TopicReader(storage, n).fetch(p, 0, max_records=1000).records for p in (0, 1)] for n in ("cl-a", "cl-b")
    }

    home = spark_home()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
        "PYSPARK_PYTHON": sys.executable,
    }
    mport, mui, wui = free_port(), free_port(), free_port()
    master_url = f"spark://127.0.0.1:{mport}"
    logs = open(tmp_path / "cluster.log", "wb")
    master = subprocess.Popen(
        [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.master.Master",
         "--host", "127.0.0.1", "--port", str(mport), "--webui-port", str(mui)],
        env=env, stdout=logs, stderr=subprocess.STDOUT,
    )  # fmt: skip
    worker = None
    try:
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{mui}/json/").status_code == 200, 90, "the master")
        worker = subprocess.Popen(
            [str(home / "bin" / "spark-class"), "org.apache.spark.deploy.worker.Worker", master_url,
             "--host", "127.0.0.1", "--cores", "1", "--memory", "1g", "--webui-port", str(wui),
             "--work-dir", str(tmp_path / "work")],
            env=env, stdout=logs, stderr=subprocess.STDOUT,
        )  # fmt: skip
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{mui}/json/").json()["aliveworkers"] == 1, 90, "the worker")
        out = subprocess.run(
            [str(home / "bin" / "spark-submit"), "--master", master_url,
             "--conf", "spark.executor.memory=512m", "--conf", f"spark.pyspark.python={sys.executable}",
             str(REPO / "jobs" / "compaction.py"), "--root", root],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr[-4000:]
        report = {t["topic"]: t for t in json.loads(out.stdout[out.stdout.index("{") :])["topics"]}
        assert set(report) == {"cl-a", "cl-b"}
        for t in report.values():
            assert t["segments_before"] == 24 and t["segments_after"] == 2
        assert "[compaction" in out.stdout + out.stderr  # progress lines (spark-submit merges the streams)
        apps = httpx.get(f"http://127.0.0.1:{mui}/json/").json()["completedapps"]
        assert [a["name"] for a in apps] == ["topiclake-compaction"]  # it ran on the cluster
        after = {n: [TopicReader(storage, n).fetch(p, 0, max_records=1000).records for p in (0, 1)] for n in before}
        assert after == before  # invariant 6: compaction changes nothing a reader sees
    finally:
        if worker is not None:
            stop(worker)
        stop(master)
        logs.close()
