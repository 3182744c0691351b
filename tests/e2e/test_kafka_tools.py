"""Kafka's own Java tools (4.3.1, from Maven Central: bench/kafka/pom.xml) against a gateway's Kafka
listener: kafka-topics, the console producer and consumer, kafka-consumer-groups, kafka-configs and
the producer and consumer performance tools, run as a user runs them."""

from __future__ import annotations

import re
import subprocess

import httpx
import pytest

from bench.kafka_broker import CACHE, ensure_jars, java

pytestmark = pytest.mark.slow


@pytest.fixture
def gateway(server):
    """The module's server (tests/e2e/conftest.py): every test server also serves Kafka."""
    return server


@pytest.fixture(scope="module")
def libs():
    return ensure_jars()


def tool(libs, main: str, *args: str, stdin: str | None = None, timeout: float = 180) -> str:
    """Run a Kafka tool class as its shell script does; its stdout (fails with its stderr)."""
    cmd = [java(), "-Xmx256m", f"-Dlog4j2.configurationFile={CACHE / 'log4j2.xml'}", "-cp", f"{libs}/*", main, *args]
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{main} {' '.join(args)} failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}"
    return out.stdout


TOPICS = "org.apache.kafka.tools.TopicCommand"
PRODUCER = "org.apache.kafka.tools.ConsoleProducer"
CONSUMER = "org.apache.kafka.tools.consumer.ConsoleConsumer"
GROUPS = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"
CONFIGS = "kafka.admin.ConfigCommand"


def test_topics_console_producer_consumer_groups_and_configs(gateway, libs):
    bs = ("--bootstrap-server", gateway.kafka)
    tool(libs, TOPICS, *bs, "--create", "--topic", "tools", "--partitions", "3", "--replication-factor", "1")
    described = tool(libs, TOPICS, *bs, "--describe", "--topic", "tools")
    assert "PartitionCount: 3" in described
    assert "tools" in tool(libs, TOPICS, *bs, "--list")

    lines = "".join(f"key{i}:value{i}\n" for i in range(30))
    tool(
        libs,
        PRODUCER,
        *bs,
        "--topic",
        "tools",
        "--reader-property",
        "parse.key=true",
        "--reader-property",
        "key.separator=:",
        stdin=lines,
    )
    info = httpx.get(f"{gateway.url}/topics/tools").json()
    assert sum(p["high_watermark"] for p in info["partition_offsets"]) == 30

    consumed = tool(
        libs,
        CONSUMER,
        *bs,
        "--topic",
        "tools",
        "--group",
        "tools-g",
        "--from-beginning",
        "--max-messages",
        "30",
        "--formatter-property",
        "print.key=true",
    )
    assert sorted(consumed.split()) == sorted([f"key{i}" for i in range(30)] + [f"value{i}" for i in range(30)])

    described = tool(libs, GROUPS, *bs, "--describe", "--group", "tools-g")
    rows = [line.split() for line in described.splitlines() if line.startswith("tools-g")]
    assert len(rows) == 3  # one row per partition, with its committed offset and lag
    header = next(line.split() for line in described.splitlines() if "LAG" in line)
    lag = header.index("LAG")
    assert all(row[lag] == "0" for row in rows)

    reset = tool(
        libs, GROUPS, *bs, "--reset-offsets", "--group", "tools-g", "--topic", "tools", "--to-earliest", "--execute"
    )
    assert re.search(r"tools\s+\d\s+0", reset)
    described = tool(libs, GROUPS, *bs, "--describe", "--group", "tools-g")
    rows = [line.split() for line in described.splitlines() if line.startswith("tools-g")]
    assert sum(int(row[lag]) for row in rows) == 30

    tool(
        libs,
        CONFIGS,
        *bs,
        "--alter",
        "--entity-type",
        "topics",
        "--entity-name",
        "tools",
        "--add-config",
        "retention.ms=86400000",
    )
    assert "retention.ms=86400000" in tool(
        libs, CONFIGS, *bs, "--describe", "--entity-type", "topics", "--entity-name", "tools"
    )
    assert httpx.get(f"{gateway.url}/topics/tools").json()["config"]["retention.ms"] == "86400000"


def test_producer_and_consumer_performance_tools(gateway, libs):
    bs = ("--bootstrap-server", gateway.kafka)
    tool(libs, TOPICS, *bs, "--create", "--topic", "perf", "--partitions", "2", "--replication-factor", "1")
    out = tool(
        libs,
        "org.apache.kafka.tools.ProducerPerformance",
        "--topic",
        "perf",
        "--num-records",
        "20000",
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--producer-props",
        f"bootstrap.servers={gateway.kafka}",
        "acks=all",
    )
    assert "20000 records sent" in out
    out = tool(libs, "org.apache.kafka.tools.ConsumerPerformance", *bs, "--topic", "perf", "--messages", "20000")
    fields = out.strip().splitlines()[-1].split(",")
    assert int(fields[4].strip()) == 20000  # data.consumed.in.nMsg


def test_operator_tools_log_dirs_leader_election_reassignments_and_transactions(gateway, libs):
    """kafka-log-dirs (a partition's bytes in its table), kafka-leader-election (never needed: the
    owner is the one replica), kafka-reassign-partitions --list and kafka-transactions list (none)."""
    import json

    bs = ("--bootstrap-server", gateway.kafka)
    tool(libs, TOPICS, *bs, "--create", "--topic", "ops", "--partitions", "2", "--replication-factor", "1")
    tool(libs, PRODUCER, *bs, "--topic", "ops", "--property", "parse.key=false", stdin="a\nb\nc\n")
    out = tool(libs, "org.apache.kafka.tools.LogDirsCommand", *bs, "--describe", "--topic-list", "ops")
    report = json.loads(out.strip().splitlines()[-1])
    (broker,) = report["brokers"]
    (log_dir,) = broker["logDirs"]
    sizes = {p["partition"]: p["size"] for p in log_dir["partitions"]}
    assert set(sizes) == {"ops-0", "ops-1"} and sum(sizes.values()) > 0 and log_dir["error"] is None
    out = tool(
        libs, "org.apache.kafka.tools.LeaderElectionCommand", *bs, "--election-type", "preferred",
        "--topic", "ops", "--partition", "1",
    )  # fmt: skip
    assert "Valid replica already elected for partitions ops-1" in out
    tool(
        libs,
        "org.apache.kafka.tools.LeaderElectionCommand",
        *bs,
        "--election-type",
        "preferred",
        "--all-topic-partitions",
    )
    out = tool(libs, "org.apache.kafka.tools.reassign.ReassignPartitionsCommand", *bs, "--list")
    assert "No partition reassignments found." in out
    out = tool(libs, "org.apache.kafka.tools.TransactionsCommand", *bs, "list")
    assert out.strip().splitlines() == ["TransactionalId\tCoordinator\tProducerId\tTransactionState"]
