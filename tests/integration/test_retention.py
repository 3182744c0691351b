import threading
import time

import pyarrow as pa
import pytest

from delta_log import TopicReader, TopicWriter, normalize_batch
from delta_log.errors import OffsetOutOfRangeError
from delta_log.maintenance.retention import apply_retention


def old_batch(n, ts_ms, topic="t"):
    return normalize_batch(
        pa.table(
            {
                "value": [b"x" * 20] * n,
                "partition": pa.array([0] * n, pa.int32()),
                "timestamp": pa.array([ts_ms * 1000] * n, pa.timestamp("us", tz="UTC")),
            }
        ),
        partitions=1,
        topic=topic,
        max_message_bytes=10**6,
        now_us=int(time.time() * 1e6),
        log_append_time=False,
    )


def test_retention_removes_expired_prefix_beside_a_live_writer(storage, settings, topic_factory):
    topic = topic_factory(retention_ms=60_000)
    w = TopicWriter(storage, topic, settings.writer)
    now = int(time.time() * 1000)
    for _ in range(5):
        w.append(old_batch(10, now - 3_600_000, topic))  # an hour old
    for _ in range(3):
        w.append(old_batch(10, now, topic))
    errors = []

    def produce():
        try:
            for _ in range(30):
                w2.append(old_batch(5, int(time.time() * 1000), topic))
        except Exception as exc:  # pragma: no cover
            errors.append(exc)

    w2 = TopicWriter(storage, topic, settings.writer)
    t = threading.Thread(target=produce)
    t.start()
    report = apply_retention(storage, topic, settings.writer)
    t.join()
    assert not errors and report.committed
    assert report.records_removed == 50 and report.partitions[0].log_start_offset == 50
    r = TopicReader(storage, topic)
    assert r.log_start_offset(0) == 50
    with pytest.raises(OffsetOutOfRangeError):
        r.fetch(0, 10)
    offs = sorted(storage.open_topic(topic).to_pyarrow_table(columns=["offset"]).column("offset").to_pylist())
    assert offs == list(range(50, 80 + 150))  # a prefix went; the rest contiguous, live appends kept
    assert w.append(old_batch(1, now, topic)).ranges[0].base_offset == 230  # offsets never restart


def test_retention_bytes_and_protection(storage, settings, topic_factory, catalog):
    topic = topic_factory(retention_ms=-1, retention_bytes=1)
    w = TopicWriter(storage, topic, settings.writer)
    for _ in range(4):
        w.append(old_batch(10, int(time.time() * 1000), topic))
    catalog.alter_config(topic, {"retention.protect.unconsumed": "true"})
    report = apply_retention(storage, topic, settings.writer, lowest_committed={0: 15})
    p = report.partitions[0]
    assert p.protected and p.log_start_offset == 10 and p.unconsumed_records > 0
    catalog.alter_config(topic, {"retention.protect.unconsumed": "false"})
    report = apply_retention(storage, topic, settings.writer, lowest_committed={0: 15})
    assert report.partitions[0].log_start_offset == 30  # all but the newest segment (Kafka's bytes rule)
    assert report.partitions[0].unconsumed_records == 15
