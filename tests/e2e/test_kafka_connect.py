"""Kafka Connect against a gateway's Kafka listener: two distributed workers (Kafka 4.3.1's own
ConnectDistributed, from the Maven jars bench/kafka/pom.xml resolves) form a worker group, which
the gateway serves as Kafka does (the leader worker assigns connectors and tasks), keep their
configs, offsets and status in topiclake topics, and move lines from a file through a topic into
another file with the FileStream connectors, also after one worker is killed with kill -9; and
exactly-once source support (KIP-618) across such a kill."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from bench.kafka_broker import CACHE, ensure_jars, java
from tests.e2e.server import free_port

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway(server):
    """The module's server (tests/e2e/conftest.py): every test server also serves Kafka."""
    return server


class ConnectWorker:
    """One ConnectDistributed process on 127.0.0.1, started as Kafka's connect-distributed.sh does."""

    def __init__(self, workdir: Path, bootstrap: str, group: str, extra: dict[str, str] | None = None) -> None:
        self.rest = f"http://127.0.0.1:{free_port()}"
        self.props = workdir / f"worker-{self.rest.rsplit(':', 1)[1]}.properties"
        self.log = self.props.with_suffix(".log")
        settings = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "listeners": self.rest,
            "plugin.discovery": "service_load",
            "key.converter": "org.apache.kafka.connect.storage.StringConverter",
            "value.converter": "org.apache.kafka.connect.storage.StringConverter",
            "config.storage.topic": f"{group}-configs",
            "offset.storage.topic": f"{group}-offsets",
            "status.storage.topic": f"{group}-status",
            "config.storage.replication.factor": "1",
            "offset.storage.replication.factor": "1",
            "status.storage.replication.factor": "1",
            "offset.flush.interval.ms": "500",
            # a lost worker's connectors and tasks move at once, not after Connect's 5 minutes
            "scheduled.rebalance.max.delay.ms": "0",
            "session.timeout.ms": "6000",
            "heartbeat.interval.ms": "1000",
            "consumer.session.timeout.ms": "6000",
            "consumer.heartbeat.interval.ms": "1000",
            **(extra or {}),
        }
        self.props.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, libs: Path) -> ConnectWorker:
        cmd = [java(), "-Xmx384m", f"-Dlog4j2.configurationFile={CACHE / 'log4j2.xml'}", "-cp", f"{libs}/*"]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [*cmd, "org.apache.kafka.connect.cli.ConnectDistributed", str(self.props)], stdout=out, stderr=out
            )
        return self

    def wait_healthy(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()[-3000:]
            try:
                if httpx.get(f"{self.rest}/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"Connect worker not healthy in {timeout}s:\n{self.log.read_text()[-3000:]}")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill9()


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _wait_for(what: str, check, timeout: float = 90, logs: tuple[Path, ...] = ()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tails = "\n".join(p.read_text()[-2000:] for p in logs if p.exists())
    raise AssertionError(f"timed out waiting for {what}\n{tails}")


def test_two_connect_workers_move_lines_through_a_topic_and_carry_on_after_a_kill(gateway, tmp_path):
    libs = ensure_jars()
    group = "connect-cluster"
    workers = [ConnectWorker(tmp_path, gateway.kafka, group) for _ in range(2)]
    source, sink = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("".join(f"line-{i}\n" for i in range(20)))
    logs = tuple(w.log for w in workers)
    try:
        for w in workers:
            w.start(libs)
        for w in workers:
            w.wait_healthy()
        rest = workers[0].rest
        connectors = {
            "file-source": {
                "connector.class": "FileStreamSource",
                "tasks.max": "1",
                "file": str(source),
                "topic": "connect-lines",
                "topic.creation.default.replication.factor": "1",
                "topic.creation.default.partitions": "2",
            },
            "file-sink": {"connector.class": "FileStreamSink", "file": str(sink), "topics": "connect-lines"},
        }
        for name, config in connectors.items():
            r = httpx.post(f"{rest}/connectors", json={"name": name, "config": config}, timeout=60)
            assert r.status_code == 201, r.text
        _wait_for("the first lines in the sink file", lambda: len(_lines(sink)) == 20, logs=logs)
        assert sorted(_lines(sink)) == sorted(f"line-{i}" for i in range(20))

        # both workers are members of one group whose leader assigns ("connect" protocol type)
        # (Connect's leader may still be rebalancing to spread the new connectors' tasks: wait for it)
        def stable_with_both() -> bool:
            described = httpx.get(f"{gateway.url}/groups/{group}", timeout=30).json()
            return described["state"] == "Stable" and len(described["members"]) == 2

        _wait_for("the Connect group stable with both workers", stable_with_both, timeout=60, logs=logs)
        listed = {g["group"] for g in httpx.get(f"{gateway.url}/groups", timeout=30).json()["groups"]}
        assert {group, "connect-file-sink"} <= listed

        def values(topic: str) -> list[str]:
            """Every value of `topic`, fetched over HTTP from each partition's start."""
            info = httpx.get(f"{gateway.url}/topics/{topic}", timeout=30).json()
            out = []
            for p in range(len(info["partition_offsets"])):
                url = f"{gateway.url}/topics/{topic}/partitions/{p}/records?offset=0&value_format=string"
                out += [r["value"] for r in httpx.get(url, timeout=30).json()["records"]]
            return out

        # the topic Connect wrote is a topic like any other: its lines are fetched over HTTP too
        assert sorted(values("connect-lines")) == sorted(f"line-{i}" for i in range(20))

        # before the kill, both positions are committed (Connect flushes them every 500 ms): the
        # sink group's offsets past the 20 lines, the source's file position in its offsets topic
        def both_positions_committed() -> bool:
            sink_at = httpx.get(f"{gateway.url}/groups/connect-file-sink/offsets", timeout=30).json()["offsets"]
            position = f'"position":{source.stat().st_size}'
            return sum(o["offset"] for o in sink_at if o["topic"] == "connect-lines") == 20 and any(
                position in (v or "").replace(" ", "") for v in values(f"{group}-offsets")
            )

        _wait_for("the sink's and the source's positions committed", both_positions_committed, logs=logs)
        status = httpx.get(f"{rest}/connectors?expand=status", timeout=30).json()
        sink_worker = status["file-sink"]["status"]["tasks"][0]["worker_id"]
        doomed = next(w for w in workers if w.rest.endswith(sink_worker.rsplit(":", 1)[1]))
        survivor = next(w for w in workers if w is not doomed)
        doomed.kill9()
        with source.open("a") as f:
            f.write("".join(f"after-{i}\n" for i in range(10)))
        _wait_for("the lines written after the kill", lambda: len(_lines(sink)) >= 30, timeout=120, logs=logs)
        expected = [f"line-{i}" for i in range(20)] + [f"after-{i}" for i in range(10)]
        assert sorted(_lines(sink)) == sorted(expected)  # every line, and none twice
        status = httpx.get(f"{survivor.rest}/connectors?expand=status", timeout=30).json()
        for name in connectors:
            task = status[name]["status"]["tasks"][0]
            assert task["state"] == "RUNNING" and survivor.rest.endswith(task["worker_id"].rsplit(":", 1)[1])
    finally:
        for w in workers:
            w.stop()


def test_exactly_once_source_support_delivers_each_line_once_across_a_worker_kill(gateway, tmp_path):
    """KIP-618 on a distributed worker: with `exactly.once.source.support=enabled` the source task
    writes each poll's records and its file position in one transaction (transactional id
    `<group>-<connector>-<task>`), and the leader writes the config topic through a transactional
    producer of its own. The worker running the task is killed with kill -9 while lines are being
    appended; the survivor fences the dead task's producer, resumes from the committed position,
    and the topic holds every line exactly once."""
    libs = ensure_jars()
    group = "connect-eos"
    eos = {"exactly.once.source.support": "enabled"}
    workers = [ConnectWorker(tmp_path, gateway.kafka, group, eos) for _ in range(2)]
    source = tmp_path / "eos-in.txt"
    source.write_text("")
    logs = tuple(w.log for w in workers)
    appended: list[str] = []

    def append(n: int) -> None:
        lines = [f"eos-{len(appended) + i}" for i in range(n)]
        with source.open("a") as f:
            f.write("".join(f"{line}\n" for line in lines))
        appended.extend(lines)

    def values() -> list[str]:
        info = httpx.get(f"{gateway.url}/topics/connect-eos-lines", timeout=30)
        if info.status_code == 404:
            return []
        out = []
        for p in range(len(info.json()["partition_offsets"])):
            url = f"{gateway.url}/topics/connect-eos-lines/partitions/{p}/records"
            params = {"offset": 0, "value_format": "string", "max_records": 100_000}
            out += [r["value"] for r in httpx.get(url, params=params, timeout=30).json()["records"]]
        return out

    try:
        for w in workers:
            w.start(libs)
        for w in workers:
            w.wait_healthy()
        config = {
            "connector.class": "FileStreamSource",
            "tasks.max": "1",
            "file": str(source),
            "topic": "connect-eos-lines",
            "exactly.once.support": "required",  # refused unless the worker runs it exactly once
            "transaction.boundary": "poll",  # a transaction a poll: many small ones while the kill lands
            "topic.creation.default.replication.factor": "1",
            "topic.creation.default.partitions": "2",
        }
        r = httpx.post(f"{workers[0].rest}/connectors", json={"name": "eos-source", "config": config}, timeout=60)
        assert r.status_code == 201, r.text
        append(200)
        _wait_for("the first lines in the topic", lambda: len(values()) >= 200, logs=logs)
        # the task's transactions went through the transaction coordinator under Connect's id
        described = httpx.get(f"{gateway.url}/transactions/{group}-eos-source-0", timeout=30)
        assert described.status_code == 200, described.text
        assert described.json()["state"] in {"Ongoing", "CompleteCommit", "Empty"}
        first_epoch = described.json()["producer_epoch"]

        status = httpx.get(f"{workers[0].rest}/connectors?expand=status", timeout=30).json()
        task_worker = status["eos-source"]["status"]["tasks"][0]["worker_id"]
        doomed = next(w for w in workers if w.rest.endswith(task_worker.rsplit(":", 1)[1]))
        survivor = next(w for w in workers if w is not doomed)
        # lines keep coming while the task's worker dies mid-stream
        for _ in range(10):
            append(100)
            time.sleep(0.05)
        doomed.kill9()
        for _ in range(10):
            append(100)
            time.sleep(0.05)
        _wait_for("every line in the topic", lambda: len(values()) >= len(appended), timeout=180, logs=logs)
        time.sleep(2)  # a duplicate would land after the last line: give it the chance
        got = values()
        assert len(got) == len(set(got)), "a line was written twice"
        assert sorted(got) == sorted(appended)
        status = httpx.get(f"{survivor.rest}/connectors?expand=status", timeout=30).json()
        task = status["eos-source"]["status"]["tasks"][0]
        assert task["state"] == "RUNNING" and survivor.rest.endswith(task["worker_id"].rsplit(":", 1)[1])
        # the survivor's producer of the task fenced the dead one's: a later epoch of the same id
        described = httpx.get(f"{gateway.url}/transactions/{group}-eos-source-0", timeout=30).json()
        assert described["producer_epoch"] > first_epoch and described["state"] == "CompleteCommit"
    finally:
        for w in workers:
            w.stop()
