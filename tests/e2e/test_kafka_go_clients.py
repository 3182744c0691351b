"""Go's Kafka clients against a gateway's Kafka listener, as Go services run them: franz-go (with
kadm), IBM's sarama and segmentio's kafka-go (tests/e2e/go_clients/main.go). Each creates a topic,
produces 3,000 keyed, compressed records with acks=all (idempotent where the client offers it),
reads them all in a consumer group and commits; franz-go also on Kafka 4's consumer protocol
(KIP-848) and with transactions (GroupTransactSession). kafka-go found two faults: a JoinGroup v2 error
answer with a null protocol name (the connection dropped) and its version-1 subscriptions without
owned partitions (refused as INCONSISTENT_GROUP_PROTOCOL)."""

from __future__ import annotations

import os
import subprocess

import httpx
import pytest

from tests.e2e import go_kafka_clients

pytestmark = pytest.mark.slow


def go_clients_or_skip():
    """The Go clients' binary, built if need be; skips (fails with TOPICLAKE_REQUIRE_GO=1) when Go
    is missing."""
    reason = go_kafka_clients.unavailable_reason()
    if reason is not None:
        if os.environ.get("TOPICLAKE_REQUIRE_GO") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return go_kafka_clients.build()


@pytest.fixture(scope="module")
def go_clients():
    return go_clients_or_skip()


@pytest.mark.parametrize("client", ["franz", "sarama", "kafkago"])
def test_a_go_client_creates_produces_and_reads_a_topic_in_a_group(server, go_clients, client):
    out = subprocess.run([str(go_clients), server.kafka, client], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"{client}: {out.stderr[-3000:]}\n{server.log.read_text()[-3000:]}"
    assert out.stdout.split()[-2:] == ["ok", "3000"], out.stdout


def test_franz_go_members_share_a_group_on_the_consumer_protocol(server, go_clients):
    """kgo.ServerSideBalancer (KIP-848, the `uniform` assignor): a second member joins while the
    first reads, both hold partitions, every record is read, kadm describes both members."""
    out = subprocess.run([str(go_clients), server.kafka, "franz848"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"franz848: {out.stderr[-3000:]}\n{server.log.read_text()[-3000:]}"
    assert out.stdout.split()[:4] == ["franz-go", "848", "ok", "3000"], out.stdout


def test_franz_go_group_transact_session_moves_a_topic_exactly_once(server, go_clients):
    """franz-go's GroupTransactSession (read_committed, RequireStableFetchOffsets, transactions
    that commit the group's offsets): every record of the input once in the output, no lag. It
    uses transaction version 2 (the gateway finalizes it): each EndTxn v5 bumps the epoch."""
    out = subprocess.run([str(go_clients), server.kafka, "franztxn"], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, f"franztxn: {out.stderr[-3000:]}\n{server.log.read_text()[-3000:]}"
    assert out.stdout.split()[-4:] == ["franz-go", "txn", "ok", "3000"], out.stdout
    assert httpx.get(f"{server.url}/transactions/franz-etl", timeout=30).json()["producer_epoch"] >= 1
