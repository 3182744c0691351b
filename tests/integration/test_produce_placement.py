"""Produce in a cluster (broker.produce): which partitions a gateway appends to, which
requests go to another gateway, and what that gateway receives, on a real topic and registry."""

import asyncio
import time

import numpy as np
import pyarrow as pa
import pytest

from broker.cluster import Cluster
from broker.produce import Placement, prepare
from conf import ClusterSettings
from delta_log.core.producer import ProducerSequence
from delta_log.core.records import producer_arrow_stream
from delta_log.registry import TopicRegistry
from delta_log.system.gateways import GatewayDirectory, GatewayRecord
from ingest_gateway.decoding import decode_arrow

OWNERS = ["gw-a", "gw-b", "gw-a", "gw-b"]  # partition -> owner, as a cluster of two would say


@pytest.fixture
def registry(settings):
    reg = TopicRegistry(settings)
    reg.catalog.create_topic("t", partitions=4)
    yield reg
    reg.close()


def table(values, keys=None, partitions=None) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "key": pa.array(keys or [None] * n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "partition": pa.array(partitions or [None] * n, pa.int64()),
        }
    )


def test_records_without_key_go_only_to_this_gateways_partitions(registry):
    placement = Placement("gw-a", lambda n: OWNERS[:n])
    chosen = set()
    for i in range(8):
        prepared = prepare(registry, "t", table([b"v%d" % i]), None, placement)
        chosen |= set(prepared.partitions.tolist())
        assert prepared.owner is None  # appended here
    assert chosen == {0, 2}  # sticky, moving on per batch, through the owned partitions only


def test_a_request_another_gateway_owns_alone_goes_there(registry):
    placement = Placement("gw-a", lambda n: OWNERS[:n])
    assert prepare(registry, "t", table([b"x", b"y"], partitions=[1, 3]), None, placement).owner == "gw-b"
    assert prepare(registry, "t", table([b"x"], partitions=[2]), None, placement).owner is None
    # spanning both owners: appended here (Delta keeps the offsets unique either way)
    assert prepare(registry, "t", table([b"x", b"y"], partitions=[0, 1]), None, placement).owner is None
    # an owner that is gone (no live gateway) is nobody to forward to
    assert (
        prepare(registry, "t", table([b"x"], partitions=[1]), None, Placement("gw-a", lambda n: [None] * n)).owner
        is None
    )


def test_an_idempotent_batch_lands_on_the_same_partition_whichever_gateway_takes_it(registry):
    producer = ProducerSequence(producer_id="p1", sequence=7)
    here = prepare(registry, "t", table([b"x"]), producer, Placement("gw-a", lambda n: OWNERS[:n]))
    there = prepare(registry, "t", table([b"x"]), producer, Placement("gw-b", lambda n: OWNERS[:n]))
    alone = prepare(registry, "t", table([b"x"]), producer)
    assert here.partitions.tolist() == there.partitions.tolist() == alone.partitions.tolist()


def test_the_owner_receives_the_same_records(registry):
    keys = [b"k1", None, b"k3"]
    headers = pa.array(
        [[{"key": "h", "value": b"v"}], [], None], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    )
    src = table([b"a", b"b", b"c"], keys=keys, partitions=[1, 1, 1]).append_column("headers", headers)
    src = src.append_column("timestamp", pa.array([1_700_000_000_000_000, None, None], pa.timestamp("us", tz="UTC")))
    prepared = prepare(registry, "t", src, None, Placement("gw-a", lambda n: OWNERS[:n]))
    assert prepared.owner == "gw-b"
    received = prepare(registry, "t", decode_arrow(producer_arrow_stream(prepared.append.batch)), None)
    sent, got = prepared.append.batch, received.append.batch
    for column in ("key", "value", "partition", "headers"):
        assert got.column(column).to_pylist() == sent.column(column).to_pylist()
    # the client's timestamp is kept; records without one get the owner's append time
    assert got.column("timestampType").to_pylist() == [0, 1, 1]
    assert got.column("timestamp")[0] == sent.column("timestamp")[0]
    assert np.array_equal(received.partitions, prepared.partitions)


def test_partition_owners_follow_the_membership(storage):
    directory = GatewayDirectory(storage)
    now = int(time.time() * 1000)
    clusters = []
    for gw in ("gw-a", "gw-b"):
        c = Cluster(directory, ClusterSettings(gateway_id=gw), url=f"http://127.0.0.1/{gw}")
        directory.publish(GatewayRecord(gateway_id=gw, url=c.me.url, started_at_ms=now, heartbeat_ms=now))
        clusters.append(c)
    for c in clusters:
        asyncio.run(c.refresh())
    a, b = (c.partition_owners("t", 16) for c in clusters)
    assert a == b and set(a) == {"gw-a", "gw-b"}
    directory.remove("gw-b")
    asyncio.run(clusters[0].refresh())
    assert clusters[0].partition_owners("t", 16) == ["gw-a"] * 16  # the cache starts over
