"""Replication to another root: offsets preserved, incremental, retention mirrored, promote guards."""

import time

import pytest
from deltalake import DeltaTable

from conf import load_settings
from delta_log import TopicReader, TopicWriter
from delta_log.errors import ReplicaStateError
from delta_log.maintenance.replication import (
    promote,
    read_marker,
    refuse_unpromoted_replica,
    replicate_offsets,
    replicate_topic,
)
from delta_log.maintenance.topic_maintenance import TopicMaintenance
from delta_log.system.offsets import OffsetCommit, OffsetStore
from delta_log.table.segment_files import segments_of
from delta_log.table.storage import StorageRoot
from jobs import replication as job
from tests.integration.conftest import make_batch


def all_records(storage, topic, partitions):
    reader = TopicReader(storage, topic)
    out = {}
    for p in range(partitions):
        rows, offset = [], reader.log_start_offset(p)
        while offset < reader.high_watermark(p):
            res = reader.fetch(p, offset, max_records=10_000, max_bytes=1 << 30)
            rows += [(r["offset"], r["value"]) for r in res.records.select(["offset", "value"]).to_pylist()]
            offset = res.next_offset
        out[p] = rows
    return out


@pytest.fixture
def replica(tmp_path):
    return StorageRoot(str(tmp_path / "replica"))


def run_job(settings, replica):
    s = settings.model_copy(update={"jobs": settings.jobs.model_copy(update={"replica_root": replica.root})})
    return job.run(None, s)


def test_replication_is_offset_preserving_and_incremental(storage, settings, topic_factory, replica):
    topic = topic_factory(partitions=2, retention_ms=86_400_000)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(5):
        w.append(make_batch(40, partitions=2, topic=topic))
    OffsetStore(storage).commit([OffsetCommit(group="g", topic=topic, partition=0, offset=17)])

    first = run_job(settings, replica)
    assert first.records_copied == 200 and first.offsets_copied == 1
    assert all_records(replica, topic, 2) == all_records(storage, topic, 2)
    assert read_marker(replica)["source"] == storage.root and read_marker(replica)["promoted"] is False

    # the source takes more records, then rolls its segments up: files holding both replicated and
    # new records replace the ones the first run copied
    for _ in range(3):
        w.append(make_batch(10, partitions=2, topic=topic))
    before = sum(len(s) for s in segments_of(DeltaTable(storage.topic_uri(topic))).values())
    maintenance = settings.maintenance.model_copy(update={"rollup_fanout": 2})
    TopicMaintenance(storage, topic, maintenance, settings.writer, background=False).run_task("rollup")
    after = sum(len(s) for s in segments_of(DeltaTable(storage.topic_uri(topic))).values())
    assert after < before
    second = run_job(settings, replica)
    assert second.records_copied == 30  # only what is new, not the rolled-up files again
    assert all_records(replica, topic, 2) == all_records(storage, topic, 2)
    assert run_job(settings, replica).records_copied == 0
    # configs travel with the topic
    from delta_log.log.catalog import Catalog

    assert (
        Catalog(replica, settings.writer).describe_topic(topic).config
        == Catalog(storage, settings.writer).describe_topic(topic).config
    )


def test_source_retention_is_mirrored(storage, settings, topic_factory, replica):
    topic = topic_factory(partitions=1)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(4):
        w.append(make_batch(10, topic=topic))
    replicate_topic(storage, replica, topic, settings.writer)
    from delta_log.log.catalog import Catalog
    from delta_log.maintenance.retention import apply_retention

    Catalog(storage, settings.writer).alter_config(topic, {"retention.bytes": 1})
    removed = apply_retention(storage, topic, settings.writer).records_removed
    assert removed > 0
    report = replicate_topic(storage, replica, topic, settings.writer)
    assert report.segments_removed > 0
    reader = TopicReader(replica, topic)
    assert reader.log_start_offset(0) == TopicReader(storage, topic).log_start_offset(0)
    assert reader.high_watermark(0) == 40


def test_replication_refuses_to_overwrite_a_primary_or_a_promoted_replica(storage, settings, topic_factory, tmp_path):
    topic_factory()
    other = load_settings(root=str(tmp_path / "other-primary"))
    from delta_log.log.catalog import Catalog

    Catalog(StorageRoot(other.root), other.writer).create_topic("mine")
    with pytest.raises(ReplicaStateError, match="not a replica"):
        run_job(settings, StorageRoot(other.root))
    with pytest.raises(ReplicaStateError, match="source root"):
        run_job(settings, storage)


def test_promote_lets_a_writer_continue_at_the_replicated_offsets(storage, settings, topic_factory, replica):
    topic = topic_factory(partitions=2)
    w = TopicWriter(storage, topic, settings.writer)
    w.append(make_batch(25, partitions=2, topic=topic))
    OffsetStore(storage).commit([OffsetCommit(group="g", topic=topic, partition=1, offset=9)])
    run_job(settings, replica)
    with pytest.raises(ReplicaStateError, match="replica promote"):
        refuse_unpromoted_replica(replica)
    marker = promote(replica, settings.writer)
    assert marker["promoted"] is True and marker["high_watermarks"][topic] == {"0": 13, "1": 12}
    refuse_unpromoted_replica(replica)  # now a primary
    with pytest.raises(ReplicaStateError, match="already promoted"):
        promote(replica, settings.writer)
    with pytest.raises(ReplicaStateError, match="promoted"):
        run_job(settings, replica)
    w2 = TopicWriter(replica, topic, settings.writer)
    result = w2.append(make_batch(4, partitions=2, topic=topic))
    assert sorted((r.partition, r.base_offset) for r in result.ranges) == [(0, 13), (1, 12)]
    assert OffsetStore(replica).committed("g")[(topic, 1)].offset == 9


def test_offsets_copy_only_what_changed(storage, replica):
    OffsetStore(storage).commit([OffsetCommit(group="g", topic="t", partition=0, offset=5)])
    assert replicate_offsets(storage, replica) == 1
    assert replicate_offsets(storage, replica) == 0
    time.sleep(0.01)
    OffsetStore(storage).commit([OffsetCommit(group="g", topic="t", partition=0, offset=8)])
    assert replicate_offsets(storage, replica) == 1
    assert OffsetStore(replica).committed("g")[("t", 0)].offset == 8
