import threading
import time

import pyarrow as pa
from deltalake import DeltaTable

from conf import ReaderSettings
from delta_log import TopicReader, TopicWriter, normalize_batch
from delta_log.maintenance.compaction import compact_topic
from delta_log.table.segment_files import segments_of


def keyed(keys, values, topic):
    n = len(keys)
    return normalize_batch(
        pa.table(
            {
                "key": pa.array(keys, pa.binary()),
                "value": pa.array(values, pa.binary()),
                "partition": pa.array([0] * n, pa.int32()),
            }
        ),
        partitions=1,
        topic=topic,
        max_message_bytes=10**6,
        now_us=int(time.time() * 1e6),
        log_append_time=False,
    )


def rows(storage, topic):
    t = DeltaTable(storage.topic_uri(topic)).to_pyarrow_table(columns=["key", "value", "offset"]).sort_by("offset")
    return list(
        zip(t.column("offset").to_pylist(), t.column("key").to_pylist(), t.column("value").to_pylist(), strict=True)
    )


def test_merge_is_invisible_to_readers_and_writers(storage, settings, topic_factory):
    topic = topic_factory()
    w = TopicWriter(storage, topic, settings.writer)
    for i in range(30):
        w.append(keyed([b"k%d" % i] * 3, [b"v"] * 3, topic))
    before = rows(storage, topic)
    reader = TopicReader(storage, topic, ReaderSettings(refresh_interval_s=3600))  # holds the old index
    old = reader.fetch(0, 0, max_records=1000).records
    live = threading.Thread(target=lambda: [w2.append(keyed([b"x"], [b"y"], topic)) for _ in range(20)])
    w2 = TopicWriter(storage, topic, settings.writer)
    live.start()
    report = compact_topic(storage, topic, settings.writer, target_bytes=64 * 1024 * 1024)
    live.join()
    assert report.committed and report.records_removed == 0 and report.segments_after < report.segments_before
    assert rows(storage, topic)[:90] == before  # invariant 6: same records at the same offsets
    assert [r[0] for r in rows(storage, topic)] == list(range(110))  # live appends kept, no gaps
    assert reader.fetch(0, 0, max_records=90).records.equals(old.slice(0, 90))  # old index still reads
    hist = DeltaTable(storage.topic_uri(topic)).history()
    op = next(h for h in hist if h.get("topiclake.operation") == "compaction")
    assert op["operation"] == "WRITE"


def test_key_compaction_keeps_latest_per_key_at_its_offset(storage, settings, topic_factory):
    topic = topic_factory(cleanup_policy="compact", delete_retention_ms=0)
    w = TopicWriter(storage, topic, settings.writer)
    w.append(keyed([b"a", b"b", b"a", b"c"], [b"1", b"1", b"2", b"1"], topic))
    w.append(keyed([b"b", b"c"], [b"2", None], topic))  # c tombstoned
    w.append(keyed([b"a"], [b"3"], topic))  # newest segment: never compacted
    report = compact_topic(storage, topic, settings.writer, target_bytes=1 << 30)
    assert report.committed
    assert rows(storage, topic) == [(4, b"b", b"2"), (6, b"a", b"3")]  # a@0,a@2 superseded by a@6; c deleted
    assert report.records_removed == 5
    assert len(segments_of(DeltaTable(storage.topic_uri(topic)))[0]) == 2
    assert w.append(keyed([b"z"], [b"1"], topic)).ranges[0].base_offset == 7
    r = TopicReader(storage, topic)
    assert r.fetch(0, 0, max_records=10).records.column("offset").to_pylist() == [4, 6, 7]  # holes skipped
